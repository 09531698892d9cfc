//! Where leaders publish their terms and everyone else reads them: the port's side of
//! leader observation (etcd's `Proclaim` and `Observe`, Kubernetes' Lease
//! `holderIdentity` and `leaseTransitions`).
//!
//! A board only records; it does not decide who leads. An election (the `locks-leader`
//! crate) proclaims a term while it holds its leadership, and retires it before it lets
//! the leadership go; an observer trusts a proclamation only while the leadership it
//! names is held, so a leader that died without retiring is never named.

use std::future::Future;

use time::OffsetDateTime;

use crate::{AcquisitionErrorKind, LockAcquisitionError};

/// The most bytes a published value may have ([`LeaderBoard::proclaim`]): an address, a
/// version, a small JSON object; not a payload.
pub const MAX_PUBLISHED_VALUE: usize = 1024;

/// One term of an election as its board records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Proclamation {
    /// The term's number: 1 for the first term of a name, then one more for each term,
    /// whichever process leads it (strictly growing, never reused).
    pub term: u64,
    /// The leader's holder id, when its manager has one.
    pub holder_id: Option<String>,
    /// What the leader published (an address, a version); empty when it published nothing.
    pub value: String,
    /// When the term started, as the backend's clock says (full precision).
    pub since: OffsetDateTime,
    /// Whether the leader retired the term (its task stopped). A term that is not
    /// retired may still be over: its leader may have died without a word.
    pub retired: bool,
}

impl Proclamation {
    /// A proclamation, for boards outside this workspace.
    #[must_use]
    pub fn new(
        term: u64,
        holder_id: Option<String>,
        value: String,
        since: OffsetDateTime,
        retired: bool,
    ) -> Self {
        Self {
            term,
            holder_id,
            value,
            since,
            retired,
        }
    }
}

/// Checks a value to publish: at most [`MAX_PUBLISHED_VALUE`] bytes and no NUL (which
/// PostgreSQL's `text` cannot hold), else a
/// [`Configuration`](crate::AcquisitionErrorKind::Configuration) error naming the election.
///
/// # Errors
/// As said above.
pub fn check_published_value(name: &str, value: &str) -> Result<(), LockAcquisitionError> {
    check_stored_text(name, "a published value", value, MAX_PUBLISHED_VALUE)
}

/// Checks a text a backend stores in a `text` column it indexes or keys by: at most `max`
/// bytes and no NUL (which PostgreSQL's `text` cannot hold), so that every backend keeps
/// it alike. Else a [`Configuration`](crate::AcquisitionErrorKind::Configuration) error
/// naming `subject` and saying `what` the text is (`"a published value has at most 1024
/// bytes, not 1025"`). [`check_published_value`] and [`check_board_name`] are made of it.
///
/// ```
/// use locks_port::{AcquisitionErrorKind, check_stored_text};
///
/// assert!(check_stored_text("nightly", "a job's name", "nightly", 16).is_ok());
/// let long = check_stored_text("n", "a job's name", &"n".repeat(17), 16).unwrap_err();
/// assert_eq!(long.kind(), AcquisitionErrorKind::Configuration);
/// assert_eq!(long.reason(), "a job's name has at most 16 bytes, not 17");
/// ```
///
/// # Errors
/// As said above.
pub fn check_stored_text(
    subject: &str,
    what: &str,
    text: &str,
    max: usize,
) -> Result<(), LockAcquisitionError> {
    if text.len() > max {
        return Err(LockAcquisitionError::new(
            subject,
            AcquisitionErrorKind::Configuration,
            format!("{what} has at most {max} bytes, not {}", text.len()),
        ));
    }
    if text.contains('\0') {
        return Err(LockAcquisitionError::new(
            subject,
            AcquisitionErrorKind::Configuration,
            format!("{what} cannot contain a NUL character"),
        ));
    }
    Ok(())
}

/// A time as a backend's stores keep it: PostgreSQL's `timestamptz` keeps the instant in
/// UTC to the microsecond, and the driver binds a finer time by dropping what is below
/// the microsecond of its distance from 2000-01-01 (so toward the earlier microsecond
/// for a time since then, which every store's clock is, toward the later one before).
/// An in-memory store stamps and keeps its times through this, so that it reads back
/// what PostgreSQL would.
///
/// ```
/// use locks_port::stored_time;
/// use locks_port::time::{OffsetDateTime, UtcOffset};
///
/// let utc = OffsetDateTime::from_unix_timestamp_nanos(1_796_680_799_123_456_789).unwrap();
/// let east = utc.to_offset(UtcOffset::from_hms(2, 0, 0).unwrap());
/// let kept = stored_time(east);
/// assert_eq!(kept.offset(), UtcOffset::UTC);
/// assert_eq!(kept.unix_timestamp_nanos(), 1_796_680_799_123_456_000);
/// ```
#[must_use]
pub fn stored_time(at: OffsetDateTime) -> OffsetDateTime {
    let at = at.to_offset(time::UtcOffset::UTC);
    let below = at.nanosecond() % 1000;
    if below == 0 {
        return at;
    }
    let earlier = at - time::Duration::nanoseconds(i64::from(below));
    if at.year() >= 2000 {
        earlier
    } else {
        earlier + time::Duration::MICROSECOND
    }
}

/// The most bytes an election name may have on a [`LeaderBoard`]: PostgreSQL's index of
/// the board's names holds an entry of about 2.7 kB at most, so a longer name could be
/// proclaimed on one board and not on another.
pub const MAX_BOARD_NAME: usize = 2048;

/// Checks an election name for a [`LeaderBoard`] call: at most [`MAX_BOARD_NAME`] bytes
/// and no NUL (which PostgreSQL's `text` cannot hold), else a
/// [`Configuration`](crate::AcquisitionErrorKind::Configuration) error naming the
/// election. Every board refuses such a name alike, in
/// [`proclaim`](LeaderBoard::proclaim), [`retire`](LeaderBoard::retire) and
/// [`latest`](LeaderBoard::latest).
///
/// ```
/// use locks_port::{AcquisitionErrorKind, MAX_BOARD_NAME, check_board_name};
///
/// assert!(check_board_name("api").is_ok());
/// let nul = check_board_name("api\0v2").unwrap_err();
/// assert_eq!(nul.kind(), AcquisitionErrorKind::Configuration);
/// assert!(check_board_name(&"n".repeat(MAX_BOARD_NAME + 1)).is_err());
/// ```
///
/// # Errors
/// As said above.
pub fn check_board_name(name: &str) -> Result<(), LockAcquisitionError> {
    check_stored_text(
        name,
        "an election name on a leader board",
        name,
        MAX_BOARD_NAME,
    )
}

/// Records each term of an election, across every process sharing the backend.
///
/// The contract (the conformance case `leader_board_contract` checks it):
/// - [`proclaim`](LeaderBoard::proclaim) starts a new term: its number is one more than
///   the last term of `name` (1 for the first), and it is what
///   [`latest`](LeaderBoard::latest) returns until the next proclamation;
/// - [`retire`](LeaderBoard::retire) marks a term retired only while it is the latest;
///   retiring an older term changes nothing;
/// - a value of more than [`MAX_PUBLISHED_VALUE`] bytes, or with a NUL, is a
///   `Configuration` error ([`check_published_value`]);
/// - so is a name of more than [`MAX_BOARD_NAME`] bytes, or with a NUL, in every call
///   ([`check_board_name`]).
///
/// ```
/// use locks_port::{LeaderBoard, LockAcquisitionError};
///
/// /// Where to send requests: the address the leader of `api` published, if any.
/// async fn leader_address<B: LeaderBoard>(board: &B) -> Result<Option<String>, LockAcquisitionError> {
///     let latest = board.latest("api").await?;
///     Ok(latest.filter(|term| !term.retired).map(|term| term.value))
/// }
/// ```
pub trait LeaderBoard: Send + Sync {
    /// Starts the next term of `name`, led by this manager, publishing `value`. The
    /// term records the manager's holder id as its
    /// [`permit_holders`](crate::Semaphore::permit_holders) names it, so an observer can
    /// tell the term of the permit's holder from an older one.
    ///
    /// # Errors
    /// A backend failure (on PostgreSQL, a missing table names its install step), or
    /// a value [`check_published_value`] refuses.
    ///
    /// # Cancel safety
    /// The term is recorded when the backend commits it; a dropped call may or may not
    /// have recorded it (the next proclamation's number is one more either way).
    fn proclaim(
        &self,
        name: &str,
        value: &str,
    ) -> impl Future<Output = Result<Proclamation, LockAcquisitionError>> + Send;

    /// Marks `term` of `name` retired, if it is still the latest term.
    ///
    /// # Errors
    /// A backend failure.
    fn retire(
        &self,
        name: &str,
        term: u64,
    ) -> impl Future<Output = Result<(), LockAcquisitionError>> + Send;

    /// The latest term of `name`, retired or not; `None` before the first.
    ///
    /// # Errors
    /// A backend failure.
    fn latest(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Proclamation>, LockAcquisitionError>> + Send;
}

impl<B: LeaderBoard + ?Sized> LeaderBoard for &B {
    fn proclaim(
        &self,
        name: &str,
        value: &str,
    ) -> impl Future<Output = Result<Proclamation, LockAcquisitionError>> + Send {
        (**self).proclaim(name, value)
    }

    fn retire(
        &self,
        name: &str,
        term: u64,
    ) -> impl Future<Output = Result<(), LockAcquisitionError>> + Send {
        (**self).retire(name, term)
    }

    fn latest(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Proclamation>, LockAcquisitionError>> + Send {
        (**self).latest(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_time_drops_what_is_below_the_microsecond_of_its_distance_from_2000() {
        let at = |nanos: i128| OffsetDateTime::from_unix_timestamp_nanos(nanos).expect("time");
        // 2000-01-01T00:00:00Z is 946,684,800 s after the Unix epoch.
        let y2k = 946_684_800_000_000_000_i128;
        assert_eq!(
            stored_time(at(y2k + 1_999)),
            at(y2k + 1_000),
            "after: earlier µs"
        );
        assert_eq!(
            stored_time(at(y2k - 1_999)),
            at(y2k - 1_000),
            "before: later µs"
        );
        assert_eq!(
            stored_time(at(y2k + 7_000)),
            at(y2k + 7_000),
            "whole µs kept"
        );
        assert_eq!(stored_time(at(-1)), at(0), "1969: toward 2000");
        let far = OffsetDateTime::new_utc(
            time::Date::from_calendar_date(9999, time::Month::December, 31).expect("date"),
            time::Time::from_hms_nano(23, 59, 59, 999_999_999).expect("time"),
        );
        assert_eq!(
            stored_time(far).nanosecond(),
            999_999_000,
            "no overflow at the end"
        );
        let min = OffsetDateTime::new_utc(
            time::Date::MIN,
            time::Time::from_hms_nano(0, 0, 0, 1).expect("t"),
        );
        assert_eq!(
            stored_time(min).nanosecond(),
            1_000,
            "no underflow at the start"
        );
    }

    #[test]
    fn values_past_the_bound_or_with_a_nul_are_refused_by_name() {
        let at_bound = "x".repeat(MAX_PUBLISHED_VALUE);
        assert!(check_published_value("api", &at_bound).is_ok());
        assert!(check_published_value("api", "").is_ok());
        let over = check_published_value("api", &format!("{at_bound}x")).expect_err("too long");
        assert_eq!(over.kind(), crate::AcquisitionErrorKind::Configuration);
        assert!(over.to_string().contains("api"), "{over}");
        assert!(over.to_string().contains("1025"), "{over}");
        let nul = check_published_value("api", "a\0b").expect_err("a NUL");
        assert_eq!(nul.kind(), crate::AcquisitionErrorKind::Configuration);
    }

    #[test]
    fn names_past_the_bound_or_with_a_nul_are_refused() {
        let at_bound = "n".repeat(MAX_BOARD_NAME);
        assert!(check_board_name(&at_bound).is_ok());
        assert!(check_board_name("").is_ok());
        let over = check_board_name(&format!("{at_bound}n")).expect_err("too long");
        assert_eq!(over.kind(), crate::AcquisitionErrorKind::Configuration);
        assert!(over.to_string().contains("2049"), "{over}");
        let nul = check_board_name("a\0b").expect_err("a NUL");
        assert_eq!(nul.kind(), crate::AcquisitionErrorKind::Configuration);
    }
}
