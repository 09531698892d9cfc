//! The ledger port: a durable record of which slot of which job ran, by whom, how often
//! and with what outcome, and the clock that names the current slot.
//!
//! A ledger decides a claim with [`Claim::decide`](crate::Claim::decide), reading the
//! slot's row and writing the decision in one transaction (or under one mutex), so every
//! implementation makes the same decisions and none leaves a half-written claim.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;

use locks_port::LockAcquisitionError;
use time::OffsetDateTime;

use crate::claim::Claim;
// The ledger's answers and records name outcomes; the type lives a floor down, beside
// the claim that decides on them.
pub use crate::outcome::Outcome;

/// The most bytes a job name may have: a ledger's rows are keyed by the name and the
/// slot, and PostgreSQL's index of that key holds an entry of about 2.7 kB at most, so a
/// longer name could run on one ledger and not on another. The bound is the leader
/// board's ([`locks_port::MAX_BOARD_NAME`]), for the same reason.
pub const MAX_JOB_NAME: usize = locks_port::MAX_BOARD_NAME;

/// Checks a job name: at most [`MAX_JOB_NAME`] bytes and no NUL (which PostgreSQL's
/// `text` cannot hold), else a
/// [`Configuration`](locks_port::AcquisitionErrorKind::Configuration) error keyed by the
/// name that says which. A firing
/// ([`ScheduledJob::run_once_per_slot`](crate::ScheduledJob::run_once_per_slot)) checks
/// its job's name before it asks the ledger or the locks anything, and every ledger
/// refuses such a name in each method that takes one ([`LedgerError::check_name`]), so
/// the memory and PostgreSQL ledgers refuse the same names.
///
/// ```
/// use locks_schedule::{MAX_JOB_NAME, check_job_name};
/// use locks_schedule::locks_port::AcquisitionErrorKind;
///
/// assert!(check_job_name("nightly-report").is_ok());
/// let nul = check_job_name("nightly\0report").unwrap_err();
/// assert_eq!(nul.kind(), AcquisitionErrorKind::Configuration);
/// let long = check_job_name(&"n".repeat(MAX_JOB_NAME + 1)).unwrap_err();
/// assert!(long.reason().contains("at most 2048 bytes"), "{long}");
/// ```
///
/// # Errors
/// As said above.
pub fn check_job_name(name: &str) -> Result<(), LockAcquisitionError> {
    locks_port::check_stored_text(name, "a scheduled job's name", name, MAX_JOB_NAME)
}

/// Checks a job's holder (who runs it: [`ScheduledJob::holder`](crate::ScheduledJob::holder),
/// the ledger's `holder` column): no NUL, which PostgreSQL's `text` cannot hold, else a
/// [`Configuration`](locks_port::AcquisitionErrorKind::Configuration) error keyed by the
/// job's `name` that says so. Any length. A holder is configuration, so it is refused
/// early and alike: a firing checks it with the job's name, before it asks the ledger or
/// the locks anything, and every ledger refuses such a holder in each method that takes
/// one ([`LedgerError::check_holder`]).
///
/// ```
/// use locks_schedule::check_holder;
/// use locks_schedule::locks_port::AcquisitionErrorKind;
///
/// assert!(check_holder("nightly-report", "4242@web-1").is_ok());
/// let nul = check_holder("nightly-report", "4242@web\01").unwrap_err();
/// assert_eq!(nul.kind(), AcquisitionErrorKind::Configuration);
/// assert_eq!(nul.reason(), "a scheduled job's holder cannot contain a NUL character");
/// ```
///
/// # Errors
/// As said above.
pub fn check_holder(name: &str, holder: &str) -> Result<(), LockAcquisitionError> {
    locks_port::check_stored_text(name, "a scheduled job's holder", holder, usize::MAX)
}

/// The detail a ledger records of a run's `detail` ([`Ledger::finish`]): the text with
/// each NUL, which PostgreSQL's `text` cannot hold, replaced by U+FFFD (the replacement
/// character), the rest as it is. A job's error is its own words at run time, not
/// configuration: recording the run must not fail because of them, so every ledger
/// records them so.
///
/// ```
/// use locks_schedule::recorded_detail;
///
/// assert_eq!(recorded_detail("timed out"), "timed out");
/// assert_eq!(recorded_detail("bad\0byte"), "bad\u{FFFD}byte");
/// ```
#[must_use]
pub fn recorded_detail(detail: &str) -> Cow<'_, str> {
    if detail.contains('\0') {
        Cow::Owned(detail.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(detail)
    }
}

/// What a ledger answered a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimAnswer {
    /// The slot is the caller's to run, as `attempt`; `previous` is the outcome of the
    /// attempt before, if any. `started` is the ledger's clock at the claim.
    Claimed {
        /// 1 for the first run of the slot.
        attempt: u32,
        /// The outcome of the attempt before (`Abandoned` for a runner that died).
        previous: Option<Outcome>,
        /// The ledger's clock when the claim was written.
        started: OffsetDateTime,
    },
    /// Nothing to run: the slot had already run or been settled, with this outcome.
    Done(Outcome),
    /// Nothing to run: this claim settled the slot, as `Abandoned` (it found a dead
    /// runner's row and the crash policy allows no other attempt) or `Missed` (it
    /// recorded a gap).
    Settled(Outcome),
    /// Nothing to do about a [`SlotKind::Previous`](crate::SlotKind::Previous) slot: it ran or was settled, or
    /// nothing was missed.
    NothingToDo,
    /// The ledger's clock is not in the slot the claim named (it has moved on); nothing
    /// was written.
    NotDue {
        /// The ledger's clock.
        now: OffsetDateTime,
    },
}

/// One slot's row. `Debug` shows its times in RFC 3339 (UTC); to print a field yourself,
/// `record.slot.format(&time::format_description::well_known::Rfc3339)` (time's
/// `formatting` feature) gives the same form.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunRecord {
    /// The job's name.
    pub name: String,
    /// The slot's start.
    pub slot: OffsetDateTime,
    /// Who claimed the last attempt.
    pub holder: String,
    /// Attempts claimed.
    pub attempt: u32,
    /// When the last attempt was claimed (ledger clock).
    pub started: OffsetDateTime,
    /// When it finished, if it did.
    pub finished: Option<OffsetDateTime>,
    /// Its outcome.
    pub outcome: Outcome,
    /// The job's error for `failed` (its `Display`, a NUL in it recorded as U+FFFD:
    /// [`recorded_detail`]), or what the ledger noted.
    pub detail: Option<String>,
}

impl fmt::Debug for RunRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = crate::schedule::rfc3339;
        f.debug_struct("RunRecord")
            .field("name", &self.name)
            .field("slot", &format_args!("{}", shown(self.slot)))
            .field("holder", &self.holder)
            .field("attempt", &self.attempt)
            .field("started", &format_args!("{}", shown(self.started)))
            .field(
                "finished",
                &format_args!("{}", self.finished.map_or_else(|| "None".to_owned(), shown)),
            )
            .field("outcome", &self.outcome)
            .field("detail", &self.detail)
            .finish()
    }
}

impl RunRecord {
    /// A record (for ledger implementations).
    #[must_use]
    pub fn new(
        name: &str,
        slot: OffsetDateTime,
        holder: &str,
        attempt: u32,
        started: OffsetDateTime,
        outcome: Outcome,
    ) -> Self {
        Self {
            name: name.to_owned(),
            slot,
            holder: holder.to_owned(),
            attempt,
            started,
            finished: None,
            outcome,
            detail: None,
        }
    }
}

/// Identifies one attempt of one slot, to record how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt<'a> {
    /// The job's name.
    pub name: &'a str,
    /// The slot's start.
    pub slot: OffsetDateTime,
    /// The attempt.
    pub attempt: u32,
    /// Who claimed it.
    pub holder: &'a str,
}

/// A ledger operation failed; the backend's error is the source, its words in the
/// message.
#[derive(Debug, thiserror::Error)]
#[error("schedule ledger: {message}")]
pub struct LedgerError {
    message: String,
    #[source]
    source: Option<locks_port::BoxError>,
}

impl LedgerError {
    /// An error saying `message`, caused by `source`.
    #[must_use]
    pub fn new(message: impl Into<String>, source: Option<locks_port::BoxError>) -> Self {
        Self {
            message: message.into(),
            source,
        }
    }

    /// Checks a job name a ledger was asked about with [`check_job_name`], as a ledger
    /// error whose message is the check's reason (naming [`MAX_JOB_NAME`] or the NUL).
    /// Every ledger calls it first in each method that takes a job name, before it asks
    /// its backend, so every ledger refuses the same names alike.
    ///
    /// # Errors
    /// As said above.
    pub fn check_name(name: &str) -> Result<(), Self> {
        check_job_name(name).map_err(Self::refused)
    }

    /// Checks the holder of a claim or an attempt of the job `name` with
    /// [`check_holder`], as a ledger error whose message is the check's reason (naming the
    /// NUL). Every ledger calls it, after [`check_name`](Self::check_name), in each method
    /// that takes a holder (`claim`, `finish`), before it asks its backend.
    ///
    /// # Errors
    /// As said above.
    pub fn check_holder(name: &str, holder: &str) -> Result<(), Self> {
        check_holder(name, holder).map_err(Self::refused)
    }

    /// A check's refusal, its reason the message.
    fn refused(refused: LockAcquisitionError) -> Self {
        Self::new(refused.reason(), None)
    }

    /// What failed, in the backend's words.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A durable record of slots and the clock that names them: the port the runner uses,
/// implemented on PostgreSQL by `locks-schedule-postgres` and in memory by
/// [`MemoryLedger`](crate::MemoryLedger).
///
/// Every method that takes a job name (a claim's, an attempt's, `name`) refuses one of
/// more than [`MAX_JOB_NAME`] bytes or with a NUL with a [`LedgerError`] naming the
/// bound, before it asks the backend ([`LedgerError::check_name`]); `runs(None, _)`
/// names no job. Likewise `claim` and `finish` refuse a holder with a NUL
/// ([`LedgerError::check_holder`]).
pub trait Ledger: Send + Sync {
    /// The ledger's clock now (the database's `clock_timestamp()`).
    ///
    /// # Errors
    /// [`LedgerError`] from the backend.
    fn now(&self) -> impl Future<Output = Result<OffsetDateTime, LedgerError>> + Send;

    /// Decides `claim` with [`Claim::decide`] on the ledger's clock at the claim and
    /// writes the decision atomically. Call it holding the slot's lock.
    ///
    /// # Errors
    /// [`LedgerError`] from the backend; then nothing was written.
    fn claim(
        &self,
        claim: &Claim<'_>,
    ) -> impl Future<Output = Result<ClaimAnswer, LedgerError>> + Send;

    /// Records how `attempt` ended, if the row still belongs to it (still `running`, same
    /// attempt and holder); `false` when another runner has settled the slot since.
    /// `detail` (the job's error) is recorded as [`recorded_detail`] makes it: whatever
    /// it holds, it does not fail the record (a NUL becomes U+FFFD).
    ///
    /// # Errors
    /// [`LedgerError`] from the backend.
    fn finish(
        &self,
        attempt: &Attempt<'_>,
        outcome: Outcome,
        detail: Option<&str>,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// The starts of the job `name`'s slots before `before` whose rows are `running`,
    /// oldest first: runs whose runners died (or lost the ledger mid-run, as in a
    /// failover) at least two slots ago, or, under [`Overlap::Allow`](crate::Overlap::Allow),
    /// runs still going. A claim settles only its slot and the one before, so no claim
    /// reaches them; the runner settles them with [`abandon_stale`](Self::abandon_stale).
    ///
    /// # Errors
    /// [`LedgerError`] from the backend.
    fn running_before(
        &self,
        name: &str,
        before: OffsetDateTime,
    ) -> impl Future<Output = Result<Vec<OffsetDateTime>, LedgerError>> + Send;

    /// Marks `abandoned` the rows of the job `name` at `slots` that are still `running`,
    /// and returns the starts of those it marked, oldest first. Call it holding a lock
    /// that proves their runners gone: the job's lock
    /// ([`Overlap::Skip`](crate::Overlap::Skip), [`Overlap::Wait`](crate::Overlap::Wait),
    /// whose firings hold it throughout), or under
    /// [`Overlap::Allow`](crate::Overlap::Allow) each slot's own.
    ///
    /// # Errors
    /// [`LedgerError`] from the backend; then nothing was written.
    fn abandon_stale(
        &self,
        name: &str,
        slots: &[OffsetDateTime],
    ) -> impl Future<Output = Result<Vec<OffsetDateTime>, LedgerError>> + Send;

    /// The latest `limit` rows of the job `name` (every job's when `None`), newest slot
    /// first, rows of one slot by job name in byte order (whatever a database collates).
    ///
    /// # Errors
    /// [`LedgerError`] from the backend.
    fn runs(
        &self,
        name: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>, LedgerError>> + Send;

    /// Deletes rows of slots that started before `before`, except each job's latest row
    /// (which the missed-slot check needs); returns how many were deleted.
    ///
    /// # Errors
    /// [`LedgerError`] from the backend.
    fn prune(
        &self,
        before: OffsetDateTime,
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send;
}
