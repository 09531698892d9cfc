//! The value describing an acquired lock.

use time::OffsetDateTime;

use crate::LockMode;

/// What a manager hands back when it takes a lock: the key, the derived lock id, when
/// it was acquired (UTC), the manager's optional holder label, the mode and, when the
/// manager hands out fencing tokens, this grant's token.
///
/// Immutable: built once by the manager, read through accessors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockInfo {
    key: String,
    lock_id: i64,
    acquired_at: OffsetDateTime,
    holder_id: Option<String>,
    mode: LockMode,
    fencing_token: Option<i64>,
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
