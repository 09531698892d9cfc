//! The ledger port: a durable record of which slot of which job ran, by whom, how often
//! and with what outcome, and the clock that names the current slot.
//!
//! A ledger decides a claim with [`Claim::decide`], reading the slot's row and writing
//! the decision in one transaction (or under one mutex), so every implementation makes
//! the same decisions and none leaves a half-written claim.

use std::fmt;
use std::future::Future;

use time::OffsetDateTime;

use crate::Slot;
use crate::policy::{CrashPolicy, MissedSlots};

/// How a slot's run ended (or that it has not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Claimed and running, or its runner died (which only a runner that holds the job's
    /// lock can conclude).
    Running,
    /// The job returned `Ok`.
    Succeeded,
    /// The job returned an error (its text is the row's detail).
    Failed,
    /// The runner died mid-job; under at-most-once the slot counts as done.
    Abandoned,
    /// No instance fired during the slot; recorded when the next firing found the gap.
    Missed,
}

impl Outcome {
    /// The outcome's name in the ledger table and in metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Abandoned => "abandoned",
            Self::Missed => "missed",
        }
    }

    /// The outcome named `text` (see [`as_str`](Self::as_str)).
    #[must_use]
    pub fn from_name(text: &str) -> Option<Self> {
        [
            Self::Running,
            Self::Succeeded,
            Self::Failed,
            Self::Abandoned,
            Self::Missed,
        ]
        .into_iter()
        .find(|outcome| outcome.as_str() == text)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which slot a claim is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotKind {
    /// The slot the ledger's clock is in now: refused ([`Decision::NotDue`]) once the
    /// ledger's clock has left it.
    Current,
    /// The slot before the current one: a crashed or failed run of it is settled by the
    /// crash policy, and if nothing at all was recorded for it while earlier slots were, it
    /// was missed and the missed-slot policy applies.
    Previous,
}

/// A request to run one slot of a job, made while holding the slot's lock.
#[derive(Debug, Clone)]
pub struct Claim<'a> {
    /// The job's name.
    pub name: &'a str,
    /// The slot.
    pub slot: Slot,
    /// The current slot, or the one before it.
    pub kind: SlotKind,
    /// Who claims (written to the row).
    pub holder: &'a str,
    /// What a dead or failed earlier attempt means.
    pub crash: CrashPolicy,
    /// What a slot nobody fired in means.
    pub missed: MissedSlots,
}

/// A slot's row as the ledger has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRow {
    /// How many attempts were claimed.
    pub attempt: u32,
    /// The row's outcome.
    pub outcome: Outcome,
}

/// What a ledger does with a claim, decided by [`Claim::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The slot is not the one the claim says on the ledger's clock; nothing written.
    NotDue,
    /// Write a new row, `running`, attempt 1: the caller runs the job.
    Run,
    /// Write the row `running` with the next attempt (keep the previous outcome): the
    /// caller runs the job again.
    Retry {
        /// The attempt to run.
        attempt: u32,
        /// The outcome of the attempt before.
        previous: Outcome,
    },
    /// Mark the running row `abandoned` (its runner is gone): the slot counts as done.
    Abandon,
    /// Write a new row `missed`: nobody ran the slot and nobody will.
    RecordMissed,
    /// Nothing to write: the slot already ran (or was settled) with this outcome.
    AlreadyDone(Outcome),
    /// Nothing to write for the previous slot: it ran or was settled, or it has no row
    /// because nothing was missed (the job never ran before, or a later slot ran).
    NothingToDo,
}

impl Claim<'_> {
    /// The decision for this claim, given the ledger's clock `now`, the slot's row (if
    /// any), and the start of the latest slot with a row for the job (if any).
    ///
    /// The caller holds the slot's lock, so a `running` row is a dead runner's.
    #[must_use]
    pub fn decide(
        &self,
        now: OffsetDateTime,
        row: Option<&SlotRow>,
        latest: Option<OffsetDateTime>,
    ) -> Decision {
        let due = match self.kind {
            SlotKind::Current => self.slot.contains(now),
            SlotKind::Previous => self.slot.next() <= now,
        };
        if !due {
            return Decision::NotDue;
        }
        let Some(row) = row else {
            return match self.kind {
                SlotKind::Current => Decision::Run,
                SlotKind::Previous => match latest {
                    Some(latest) if latest < self.slot.start() => match self.missed {
                        MissedSlots::Skip => Decision::RecordMissed,
                        MissedSlots::RunLatest => Decision::Run,
                    },
                    _ => Decision::NothingToDo,
                },
            };
        };
        match row.outcome {
            Outcome::Running | Outcome::Failed => match self.crash {
                CrashPolicy::AtLeastOnce { max_attempts } if row.attempt < max_attempts.get() => {
                    Decision::Retry {
                        attempt: row.attempt.saturating_add(1),
                        previous: if row.outcome == Outcome::Running {
                            Outcome::Abandoned
                        } else {
                            Outcome::Failed
                        },
                    }
                }
                _ if row.outcome == Outcome::Running => Decision::Abandon,
                _ => self.done(row.outcome),
            },
            outcome => self.done(outcome),
        }
    }

    /// A settled slot: the current one is reported as already run, the previous one needs
    /// nothing.
    fn done(&self, outcome: Outcome) -> Decision {
        match self.kind {
            SlotKind::Current => Decision::AlreadyDone(outcome),
            SlotKind::Previous => Decision::NothingToDo,
        }
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
    /// Nothing to do about a [`SlotKind::Previous`] slot: it ran or was settled, or
    /// nothing was missed.
    NothingToDo,
    /// The ledger's clock is not in the slot the claim named (it has moved on); nothing
    /// was written.
    NotDue {
        /// The ledger's clock.
        now: OffsetDateTime,
    },
}

/// One slot's row.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The job's error for `failed`, or what the ledger noted.
    pub detail: Option<String>,
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

    /// What failed, in the backend's words.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A durable record of slots and the clock that names them: the port the runner uses,
/// implemented on PostgreSQL by `locks-schedule-postgres` and in memory by
/// [`MemoryLedger`](crate::MemoryLedger).
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
    ///
    /// # Errors
    /// [`LedgerError`] from the backend.
    fn finish(
        &self,
        attempt: &Attempt<'_>,
        outcome: Outcome,
        detail: Option<&str>,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// The latest `limit` rows of the job `name` (every job's when `None`), newest slot
    /// first.
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

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use time::macros::datetime;

    use super::*;

    fn claim(kind: SlotKind, crash: CrashPolicy, missed: MissedSlots) -> Claim<'static> {
        Claim {
            name: "job",
            slot: Slot::new(
                datetime!(2026-01-01 00:00:10 UTC),
                datetime!(2026-01-01 00:00:11 UTC),
            )
            .expect("a slot"),
            kind,
            holder: "me",
            crash,
            missed,
        }
    }

    fn row(attempt: u32, outcome: Outcome) -> SlotRow {
        SlotRow { attempt, outcome }
    }

    const IN_SLOT: OffsetDateTime = datetime!(2026-01-01 00:00:10.5 UTC);
    const AFTER: OffsetDateTime = datetime!(2026-01-01 00:00:11 UTC);

    #[test]
    fn the_current_slot_is_claimed_only_while_the_ledger_clock_is_in_it() {
        let current = claim(
            SlotKind::Current,
            CrashPolicy::AtMostOnce,
            MissedSlots::Skip,
        );
        assert_eq!(current.decide(IN_SLOT, None, None), Decision::Run);
        assert_eq!(
            current.decide(AFTER, None, None),
            Decision::NotDue,
            "the boundary passed"
        );
        assert_eq!(
            current.decide(datetime!(2026-01-01 00:00:09.999 UTC), None, None),
            Decision::NotDue,
            "not yet"
        );
        let previous = claim(
            SlotKind::Previous,
            CrashPolicy::AtMostOnce,
            MissedSlots::Skip,
        );
        assert_eq!(previous.decide(IN_SLOT, None, None), Decision::NotDue);
    }

    #[test]
    fn a_settled_slot_is_not_run_again() {
        let current = claim(
            SlotKind::Current,
            CrashPolicy::AtMostOnce,
            MissedSlots::Skip,
        );
        for outcome in [
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Abandoned,
            Outcome::Missed,
        ] {
            assert_eq!(
                current.decide(IN_SLOT, Some(&row(1, outcome)), None),
                Decision::AlreadyDone(outcome)
            );
        }
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(1, Outcome::Running)), None),
            Decision::Abandon
        );
    }

    #[test]
    fn at_least_once_retries_up_to_max_attempts() {
        let max_attempts = NonZeroU32::new(2).expect("2");
        let current = claim(
            SlotKind::Current,
            CrashPolicy::AtLeastOnce { max_attempts },
            MissedSlots::Skip,
        );
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(1, Outcome::Running)), None),
            Decision::Retry {
                attempt: 2,
                previous: Outcome::Abandoned
            }
        );
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(1, Outcome::Failed)), None),
            Decision::Retry {
                attempt: 2,
                previous: Outcome::Failed
            }
        );
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(2, Outcome::Running)), None),
            Decision::Abandon
        );
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(2, Outcome::Failed)), None),
            Decision::AlreadyDone(Outcome::Failed)
        );
        let max = NonZeroU32::new(u32::MAX).expect("max");
        let unbounded = claim(
            SlotKind::Current,
            CrashPolicy::AtLeastOnce { max_attempts: max },
            MissedSlots::Skip,
        );
        assert_eq!(
            unbounded.decide(IN_SLOT, Some(&row(u32::MAX - 1, Outcome::Failed)), None),
            Decision::Retry {
                attempt: u32::MAX,
                previous: Outcome::Failed
            }
        );
        assert_eq!(
            unbounded.decide(IN_SLOT, Some(&row(u32::MAX, Outcome::Failed)), None),
            Decision::AlreadyDone(Outcome::Failed)
        );
    }

    #[test]
    fn a_gap_before_the_current_slot_follows_the_missed_slot_policy() {
        let earlier = Some(datetime!(2026-01-01 00:00:05 UTC));
        let skip = claim(
            SlotKind::Previous,
            CrashPolicy::AtMostOnce,
            MissedSlots::Skip,
        );
        let run = claim(
            SlotKind::Previous,
            CrashPolicy::AtMostOnce,
            MissedSlots::RunLatest,
        );
        assert_eq!(skip.decide(AFTER, None, earlier), Decision::RecordMissed);
        assert_eq!(run.decide(AFTER, None, earlier), Decision::Run);
        assert_eq!(
            run.decide(AFTER, None, None),
            Decision::NothingToDo,
            "a new job missed nothing"
        );
        let later = Some(datetime!(2026-01-01 00:00:11 UTC));
        assert_eq!(
            run.decide(AFTER, None, later),
            Decision::NothingToDo,
            "a later slot ran"
        );
        assert_eq!(
            run.decide(AFTER, Some(&row(1, Outcome::Succeeded)), earlier),
            Decision::NothingToDo
        );
    }
}
