//! The value describing an acquired lock.

use time::OffsetDateTime;

/// What a manager hands back when it takes a lock: the key, the derived lock id, when
/// it was acquired (UTC) and the manager's optional holder label.
///
/// Immutable: built once by the manager, read through accessors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockInfo {
    key: String,
    lock_id: i64,
    acquired_at: OffsetDateTime,
    holder_id: Option<String>,
}

impl LockInfo {
    /// Builds the value; `acquired_at` is converted to UTC.
    #[must_use]
    pub fn new(
        key: impl Into<String>,
        lock_id: i64,
        acquired_at: OffsetDateTime,
        holder_id: Option<String>,
    ) -> Self {
        Self {
            key: key.into(),
            lock_id,
            acquired_at: acquired_at.to_offset(time::UtcOffset::UTC),
            holder_id,
        }
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
}
