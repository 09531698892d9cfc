//! The errors of lock operations.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use time::OffsetDateTime;

use crate::LockMode;

/// A boxed error from a backend (for PostgreSQL: a `tokio_postgres::Error` or a pool
/// error), kept as the [`source`](StdError::source) of the error that wraps it.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What went wrong when a lock could not be acquired, named for what the caller can do.
///
/// A key the asking manager holds itself is no kind of its own: the wait for it times
/// out as [`Timeout`](Self::Timeout), and the error says who holds it
/// ([`LockAcquisitionError::is_held_by_this_manager`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AcquisitionErrorKind {
    /// Someone else held the lock for the whole timeout. Retry later or give up.
    ///
    /// "Someone else" may be the very manager that asked (another of its guards): then
    /// [`is_held_by_this_manager`](LockAcquisitionError::is_held_by_this_manager) is
    /// true and the reason says so. Waiting for that key without a timeout
    /// ([`AcquireOptions::wait_forever`](crate::AcquireOptions::wait_forever)) waits
    /// for ever unless that guard is released by some other task: no error ever comes.
    Timeout,
    /// Every pool connection was in use past the timeout (or at once, for
    /// `try_acquire`), or the pool is closed. Each held lock keeps one connection: size
    /// the pool for the most locks held at once, plus waiters.
    PoolUnavailable,
    /// The server could not be reached in time: connection refused, host unreachable,
    /// DNS failure, or no answer to the connection set-up within the connect timeout.
    /// Nothing was taken; retry once the server is back.
    Unreachable,
    /// The server refused the session for a reason retrying will not fix: failed
    /// authentication, an unknown role or database, a read-only standby (advisory
    /// locks there exclude nothing on the primary). Fix the configuration.
    Configuration,
    /// The server detected a deadlock (SQLSTATE 40P01) and chose this wait to end.
    /// Take keys in one global order (by lock id) to avoid it.
    Deadlock,
    /// The connection to the server was lost (network, restart, terminated backend).
    /// The server freed anything that session held; retrying is safe.
    ConnectionLost,
    /// The wait was cancelled by the server for a reason other than our timeout
    /// (an operator's `pg_cancel_backend`, a statement timeout).
    Cancelled,
    /// Any other backend failure; the source error says what.
    Backend,
    /// The key (or semaphore name) cannot name a lock: it is empty. Nothing was asked
    /// of the backend. A key built as `format!("job:{}", id)` from an empty `id` is
    /// still a valid key; only `""` itself is refused (see [`check_key`](crate::check_key)).
    InvalidKey,
}

/// A lock could not be acquired.
///
/// Its message is the Python `eventsource` library's: `Failed to acquire lock '{key}': {reason}`,
/// with the reason `Timeout after {seconds}s` for a timeout and
/// `Database error: {driver message}` for a backend failure. The backend's own error
/// stays reachable through [`source`](StdError::source).
///
/// ```
/// use std::time::Duration;
/// use locks_port::{AcquisitionErrorKind, LockAcquisitionError};
///
/// let error = LockAcquisitionError::timed_out("cutover:t", Duration::from_millis(200));
/// assert_eq!(error.to_string(), "Failed to acquire lock 'cutover:t': Timeout after 0.2s");
/// assert_eq!(error.kind(), AcquisitionErrorKind::Timeout);
/// assert_eq!(error.timeout(), Some(Duration::from_millis(200)));
/// ```
pub struct LockAcquisitionError {
    // Boxed: one pointer wide, so every `Result<Guard, LockAcquisitionError>` on an
    // acquisition's success path stays small (it is moved through every layer).
    repr: Box<Repr>,
}

struct Repr {
    key: String,
    kind: AcquisitionErrorKind,
    reason: String,
    timeout: Option<Duration>,
    source: Option<BoxError>,
    /// A semaphore's permit, not a lock, could not be had (the message says so).
    permit: bool,
    /// The asking manager itself holds the key (the reason says so).
    held_here: bool,
    /// A read (who holds, leads or owns), not an acquisition, failed: what it read.
    read: Option<String>,
}

impl fmt::Debug for LockAcquisitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let repr = &self.repr;
        f.debug_struct("LockAcquisitionError")
            .field("key", &repr.key)
            .field("kind", &repr.kind)
            .field("reason", &repr.reason)
            .field("timeout", &repr.timeout)
            .field("source", &repr.source)
            .field("permit", &repr.permit)
            .field("held_here", &repr.held_here)
            .field("read", &repr.read)
            .finish()
    }
}

impl LockAcquisitionError {
    /// A failure with the given kind and reason text.
    #[must_use]
    pub fn new(
        key: impl Into<String>,
        kind: AcquisitionErrorKind,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            repr: Box::new(Repr {
                key: key.into(),
                kind,
                reason: reason.into(),
                timeout: None,
                source: None,
                permit: false,
                held_here: false,
                read: None,
            }),
        }
    }

    /// The lock stayed held by someone else for the whole `timeout`.
    #[must_use]
    pub fn timed_out(key: impl Into<String>, timeout: Duration) -> Self {
        Self::new(key, AcquisitionErrorKind::Timeout, timeout_reason(timeout)).with_timeout(timeout)
    }

    /// A backend failure: reason `Database error: {source}`, with `source` kept.
    #[must_use]
    pub fn database(
        key: impl Into<String>,
        kind: AcquisitionErrorKind,
        source: impl Into<BoxError>,
    ) -> Self {
        let source = source.into();
        Self::new(key, kind, format!("Database error: {source}")).with_source(source)
    }

    /// A backend failure described in the backend's own words: reason
    /// `Database error: {description}` (for PostgreSQL, the server's message and
    /// SQLSTATE), with `source` kept for callers that inspect it. The description
    /// should not repeat text the caller adds, and `source` is not formatted into it.
    ///
    /// ```
    /// use std::error::Error;
    /// use locks_port::{AcquisitionErrorKind, LockAcquisitionError};
    ///
    /// let io = std::io::Error::other("db error");
    /// let error = LockAcquisitionError::described(
    ///     "k",
    ///     AcquisitionErrorKind::Configuration,
    ///     "role \"nosuchuser\" does not exist (28000)",
    ///     io,
    /// );
    /// assert_eq!(
    ///     error.to_string(),
    ///     "Failed to acquire lock 'k': Database error: role \"nosuchuser\" does not exist (28000)"
    /// );
    /// assert!(error.source().is_some());
    /// ```
    #[must_use]
    pub fn described(
        key: impl Into<String>,
        kind: AcquisitionErrorKind,
        description: impl fmt::Display,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::new(key, kind, format!("Database error: {description}")).with_source(source)
    }

    /// Records the timeout the call was made with.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.repr.timeout = Some(timeout);
        self
    }

    /// Records the error that caused this one.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.repr.source = Some(source.into());
        self
    }

    /// Marks the error as a semaphore's: its message says
    /// `Failed to acquire a permit of semaphore '{name}': {reason}` instead of
    /// `Failed to acquire lock '{key}': …`. Kind, reason and source are unchanged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_port::LockAcquisitionError;
    ///
    /// let error = LockAcquisitionError::timed_out("exports", Duration::from_secs(1)).for_permit();
    /// assert_eq!(
    ///     error.to_string(),
    ///     "Failed to acquire a permit of semaphore 'exports': Timeout after 1.0s"
    /// );
    /// assert!(error.is_permit());
    /// ```
    #[must_use]
    pub fn for_permit(mut self) -> Self {
        self.repr.permit = true;
        self
    }

    /// Says that a read failed, not an acquisition: an observation such as who owns a
    /// shard group's shards or who leads an election, whose errors are of this type. The
    /// message becomes `Failed to read {what}: {reason}`; the key, kind, reason and source
    /// stay as they were.
    ///
    /// ```
    /// use locks_port::{AcquisitionErrorKind, LockAcquisitionError};
    ///
    /// let error = LockAcquisitionError::new(
    ///     "reports:leading",
    ///     AcquisitionErrorKind::ConnectionLost,
    ///     "Database error: connection closed",
    /// )
    /// .for_permit()
    /// .for_read("who leads 'reports'");
    /// assert_eq!(
    ///     error.to_string(),
    ///     "Failed to read who leads 'reports': Database error: connection closed"
    /// );
    /// assert!(error.is_read());
    /// assert_eq!(error.key(), "reports:leading");
    /// ```
    #[must_use]
    pub fn for_read(mut self, what: impl Into<String>) -> Self {
        self.repr.read = Some(what.into());
        self
    }

    /// Whether a read failed (see [`for_read`](Self::for_read)), not an acquisition.
    #[must_use]
    pub fn is_read(&self) -> bool {
        self.repr.read.is_some()
    }

    /// Says that the manager that asked holds the key itself, in `mode` since `since`
    /// (its holder id `holder_id`, if it has one): the reason gains
    /// `: this manager holds '{key}' itself ({mode}, holder id "{id}", since {RFC 3339
    /// time}): release that guard first`. Kind, timeout and source are unchanged, so a
    /// timeout stays [`Timeout`](AcquisitionErrorKind::Timeout) and callers that match on
    /// the kind or [`is_timeout`](Self::is_timeout) see what they saw before.
    ///
    /// Adapters call it when a wait times out (or a zero-timeout attempt is refused) and
    /// their own book holds the key in a mode that excludes the one asked for.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_port::{LockAcquisitionError, LockMode};
    /// use locks_port::time::OffsetDateTime;
    ///
    /// // 2026-12-05T08:30:00.25Z
    /// let since = OffsetDateTime::from_unix_timestamp(1_796_459_400).unwrap()
    ///     + Duration::from_millis(250);
    /// let error = LockAcquisitionError::timed_out("job:nightly", Duration::from_millis(500))
    ///     .held_by_this_manager(LockMode::Exclusive, since, Some("worker-1"));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "Failed to acquire lock 'job:nightly': Timeout after 0.5s: this manager holds \
    ///      'job:nightly' itself (exclusive, holder id \"worker-1\", since \
    ///      2026-12-05T08:30:00.250000Z): release that guard first"
    /// );
    /// assert!(error.is_timeout());
    /// assert!(error.is_held_by_this_manager());
    /// ```
    #[must_use]
    pub fn held_by_this_manager(
        mut self,
        mode: LockMode,
        since: impl Into<OffsetDateTime>,
        holder_id: Option<&str>,
    ) -> Self {
        use fmt::Write as _;
        let repr = &mut *self.repr;
        let since = since.into().to_offset(time::UtcOffset::UTC);
        let holder = match holder_id {
            Some(id) => format!("holder id {id:?}"),
            None => "no holder id".to_owned(),
        };
        // `write!` into a String cannot fail.
        let _ = write!(
            repr.reason,
            ": this manager holds '{}' itself ({}, {holder}, since {}): release that guard first",
            repr.key,
            mode.as_str(),
            rfc3339_micros(since),
        );
        repr.held_here = true;
        self
    }

    /// Whether the key is held by the very manager that asked (see
    /// [`held_by_this_manager`](Self::held_by_this_manager)): waiting longer will not
    /// help until that manager's guard is released.
    #[must_use]
    pub fn is_held_by_this_manager(&self) -> bool {
        self.repr.held_here
    }

    /// Whether this is a semaphore's error (see [`for_permit`](Self::for_permit)).
    #[must_use]
    pub fn is_permit(&self) -> bool {
        self.repr.permit
    }

    /// The key that could not be acquired.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.repr.key
    }

    /// What went wrong.
    #[must_use]
    pub fn kind(&self) -> AcquisitionErrorKind {
        self.repr.kind
    }

    /// The reason text of the message.
    #[must_use]
    pub fn reason(&self) -> &str {
        &self.repr.reason
    }

    /// The timeout of the failed call, if it had one.
    #[must_use]
    pub fn timeout(&self) -> Option<Duration> {
        self.repr.timeout
    }

    /// Whether the failure was a timeout (the lock or a connection stayed busy).
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        self.repr.kind == AcquisitionErrorKind::Timeout
    }
}

/// The Python library's reason text for a timeout: `Timeout after 0.2s`, `Timeout after 5.0s`.
#[must_use]
pub fn timeout_reason(timeout: Duration) -> String {
    // `{:?}` on f64 prints like Python's `str(float)` for these values: 0.2, 5.0, 0.05.
    format!("Timeout after {:?}s", timeout.as_secs_f64())
}

/// `2026-12-05T08:30:00.250000Z`: RFC 3339 in UTC, to the microsecond (what a person
/// reads in an error; the port has no formatting feature of `time` to do it).
fn rfc3339_micros(at: OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.microsecond(),
    )
}

impl fmt::Display for LockAcquisitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let repr = &self.repr;
        if let Some(what) = &repr.read {
            write!(f, "Failed to read {what}: {}", repr.reason)
        } else if repr.permit {
            write!(
                f,
                "Failed to acquire a permit of semaphore '{}': {}",
                repr.key, repr.reason
            )
        } else {
            write!(f, "Failed to acquire lock '{}': {}", repr.key, repr.reason)
        }
    }
}

impl StdError for LockAcquisitionError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.repr
            .source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}

/// `release(key)` was called for a key this manager does not hold.
///
/// ```
/// use locks_port::LockNotHeldError;
///
/// let error = LockNotHeldError::new("k");
/// assert_eq!(error.to_string(), "Lock 'k' is not held by this session");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Lock '{key}' is not held by this session")]
pub struct LockNotHeldError {
    key: String,
}

impl LockNotHeldError {
    /// The error for `key`.
    #[must_use]
    pub fn new(key: impl Into<String>) -> Self {
        Self { key: key.into() }
    }

    /// The key that was not held.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }
}

/// A lock was lost while the work it protected was running (see
/// [`DistributedLock::with_lock_until_lost`](crate::DistributedLock::with_lock_until_lost)).
///
/// ```
/// use locks_port::{LockLostError, LostReason};
///
/// let error = LockLostError::new("job:nightly", LostReason::ConnectionClosed);
/// assert_eq!(
///     error.to_string(),
///     "Lock 'job:nightly' was lost: the session holding the lock ended"
/// );
/// assert_eq!(error.reason(), LostReason::ConnectionClosed);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Lock '{key}' was lost: {reason}")]
pub struct LockLostError {
    key: String,
    reason: crate::LostReason,
}

impl LockLostError {
    /// The error for `key`, lost for `reason`.
    #[must_use]
    pub fn new(key: impl Into<String>, reason: crate::LostReason) -> Self {
        Self {
            key: key.into(),
            reason,
        }
    }

    /// The key whose lock was lost.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Why it was lost.
    #[must_use]
    pub fn reason(&self) -> crate::LostReason {
        self.reason
    }
}

/// Every lock failure, for callers that handle them in one place.
///
/// ```
/// use locks_port::{LockError, LockNotHeldError};
///
/// fn classify(error: LockError) -> &'static str {
///     match error {
///         LockError::Acquisition(error) if error.is_timeout() => "busy",
///         LockError::Acquisition(_) => "failed",
///         LockError::NotHeld(_) => "not held",
///         _ => "other",
///     }
/// }
/// assert_eq!(classify(LockNotHeldError::new("k").into()), "not held");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A lock could not be acquired.
    #[error(transparent)]
    Acquisition(#[from] LockAcquisitionError),
    /// A release named a key this manager does not hold.
    #[error(transparent)]
    NotHeld(#[from] LockNotHeldError),
    /// Options that cannot be represented.
    #[error(transparent)]
    InvalidTimeout(#[from] crate::InvalidTimeoutError),
    /// A held lock was lost while its work ran; the work was stopped.
    #[error(transparent)]
    Lost(#[from] LockLostError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_the_original() {
        let cases = [
            (Duration::from_millis(200), "Timeout after 0.2s"),
            (Duration::from_secs(5), "Timeout after 5.0s"),
            (Duration::from_millis(50), "Timeout after 0.05s"),
            (Duration::ZERO, "Timeout after 0.0s"),
        ];
        for (timeout, reason) in cases {
            let error = LockAcquisitionError::timed_out("k", timeout);
            assert_eq!(error.reason(), reason);
            assert_eq!(
                error.to_string(),
                format!("Failed to acquire lock 'k': {reason}")
            );
            assert!(error.source().is_none());
        }
    }

    #[test]
    fn a_key_held_here_is_named_and_stays_a_timeout() {
        let since = OffsetDateTime::UNIX_EPOCH
            .to_offset(time::UtcOffset::from_hms(2, 0, 0).unwrap())
            + Duration::from_micros(1_500_001);
        let plain = LockAcquisitionError::timed_out("k", Duration::from_millis(200));
        assert!(!plain.is_held_by_this_manager());
        let error = plain.held_by_this_manager(LockMode::Shared, since, None);
        assert!(error.is_held_by_this_manager());
        assert_eq!(error.kind(), AcquisitionErrorKind::Timeout);
        assert_eq!(error.timeout(), Some(Duration::from_millis(200)));
        assert_eq!(
            error.reason(),
            "Timeout after 0.2s: this manager holds 'k' itself (shared, no holder id, since \
             1970-01-01T00:00:01.500001Z): release that guard first"
        );
        let quoted = LockAcquisitionError::timed_out("k", Duration::ZERO).held_by_this_manager(
            LockMode::Exclusive,
            since,
            Some("w\"1"),
        );
        assert!(quoted.reason().contains(r#"holder id "w\"1""#), "{quoted}");
    }

    #[test]
    fn database_errors_keep_their_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let error = LockAcquisitionError::database("k", AcquisitionErrorKind::ConnectionLost, io);
        assert_eq!(
            error.to_string(),
            "Failed to acquire lock 'k': Database error: reset by peer"
        );
        let source = error.source().expect("source kept");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
        let umbrella: LockError = error.into();
        assert!(matches!(umbrella, LockError::Acquisition(_)));
    }
}
