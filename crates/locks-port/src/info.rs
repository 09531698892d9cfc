//! The value describing an acquired lock.

use std::sync::Arc;
use std::time::SystemTime;

use time::OffsetDateTime;

use crate::LockMode;

/// What a manager hands back when it takes a lock: the key, the derived lock id, when
/// it was acquired (UTC), the manager's optional holder label, the mode and, when the
/// manager hands out fencing tokens, this grant's token.
///
/// Immutable: built once by the manager, read through accessors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockInfo {
    /// Shared, so that cloning the value (or the manager's own record of the grant)
    /// does not copy the key.
    key: Arc<str>,
    lock_id: i64,
    /// Kept as the clock read it: converting to a calendar date costs more than the
    /// rest of the value, and is done only when asked for.
    acquired_at: SystemTime,
    holder_id: Option<String>,
    mode: LockMode,
    fencing_token: Option<i64>,
}

impl LockInfo {
    /// Builds the value; `acquired_at` is converted to UTC.
    #[must_use]
    pub fn new(
        key: impl Into<Arc<str>>,
        lock_id: i64,
        acquired_at: OffsetDateTime,
        holder_id: Option<String>,
    ) -> Self {
        Self::at(key.into(), lock_id, acquired_at.into(), holder_id)
    }

    /// Builds the value for a lock granted now (as [`new`](Self::new) with the current
    /// time, read without converting it to a date until
    /// [`acquired_at`](Self::acquired_at) is asked for).
    #[must_use]
    pub fn acquired_now(key: impl Into<Arc<str>>, lock_id: i64, holder_id: Option<String>) -> Self {
        Self::at(key.into(), lock_id, SystemTime::now(), holder_id)
    }

    /// Builds the value for a lock granted at `acquired_at` as the system clock read it
    /// (for a manager that read the clock itself, to keep the same reading in its own
    /// book); [`acquired_at_system_time`](Self::acquired_at_system_time) gives it back.
    #[must_use]
    pub fn acquired_at_system_time_of(
        key: impl Into<Arc<str>>,
        lock_id: i64,
        acquired_at: SystemTime,
        holder_id: Option<String>,
    ) -> Self {
        Self::at(key.into(), lock_id, acquired_at, holder_id)
    }

    fn at(key: Arc<str>, lock_id: i64, acquired_at: SystemTime, holder_id: Option<String>) -> Self {
        Self {
            key,
            lock_id,
            acquired_at,
            holder_id,
            mode: LockMode::Exclusive,
            fencing_token: None,
        }
    }

    /// The same value for a lock held in `mode` (the default is exclusive).
    #[must_use]
    pub fn with_mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// The same value carrying the fencing token of this grant.
    #[must_use]
    pub fn with_fencing_token(mut self, token: i64) -> Self {
        self.fencing_token = Some(token);
        self
    }

    /// Whether the lock is held exclusively or shared.
    #[must_use]
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// The fencing token of this grant, when the manager hands them out: a number that
    /// grows strictly with every grant of the key, across every holder that uses the
    /// same token store. Store it beside the data the lock protects and refuse writes
    /// that carry a smaller one; that stops a holder that paused past the loss of its
    /// lock. `None` when fencing is off.
    #[must_use]
    pub fn fencing_token(&self) -> Option<i64> {
        self.fencing_token
    }

    /// The key the lock was requested for.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The derived advisory-lock id (for diagnostics: `pg_locks`, logs).
    #[must_use]
    pub fn lock_id(&self) -> i64 {
        self.lock_id
    }

    /// When the lock was granted, in UTC.
    #[must_use]
    pub fn acquired_at(&self) -> OffsetDateTime {
        OffsetDateTime::from(self.acquired_at)
    }

    /// When the lock was granted, as the system clock read it: what
    /// [`acquired_at`](Self::acquired_at) gives, without converting it to a calendar
    /// date (for a manager that keeps the grant's time in its own book).
    #[must_use]
    pub fn acquired_at_system_time(&self) -> SystemTime {
        self.acquired_at
    }

    /// The holder label of the manager that took the lock, if it has one.
    #[must_use]
    pub fn holder_id(&self) -> Option<&str> {
        self.holder_id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquired_at_is_normalised_to_utc() {
        let local =
            OffsetDateTime::UNIX_EPOCH.to_offset(time::UtcOffset::from_hms(2, 0, 0).unwrap());
        let info = LockInfo::new("k", 1, local, Some("w'1".into()));
        assert_eq!(info.acquired_at().offset(), time::UtcOffset::UTC);
        assert_eq!(info.acquired_at(), OffsetDateTime::UNIX_EPOCH);
        assert_eq!(info.holder_id(), Some("w'1"));
        assert_eq!(info.key(), "k");
        assert_eq!(info.lock_id(), 1);
    }

    #[test]
    fn acquired_at_keeps_every_instant_it_is_given_exactly() {
        let extremes = [
            OffsetDateTime::new_utc(time::Date::MIN, time::Time::MIDNIGHT),
            OffsetDateTime::new_utc(time::Date::MAX, time::Time::MAX),
            OffsetDateTime::UNIX_EPOCH - time::Duration::nanoseconds(1),
        ];
        for at in extremes {
            assert_eq!(LockInfo::new("k", 1, at, None).acquired_at(), at);
        }
        let read = SystemTime::UNIX_EPOCH + std::time::Duration::new(1_765_000_000, 123_456_789);
        let given = LockInfo::acquired_at_system_time_of("k", 1, read, None);
        assert_eq!(given.acquired_at_system_time(), read);
        assert_eq!(given.acquired_at(), OffsetDateTime::from(read));
        let before = OffsetDateTime::now_utc();
        let now = LockInfo::acquired_now("k", 1, None).acquired_at();
        assert!(before <= now && now <= OffsetDateTime::now_utc());
        assert_eq!(now.offset(), time::UtcOffset::UTC);
    }
}
