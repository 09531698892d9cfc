//! The statements. Each is prepared once per connection (deadpool's statement cache)
//! and then costs one round trip; only numbers are ever bound, no user text reaches
//! SQL.

/// One lock statement and its parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Statement {
    /// Blocks until the lock is granted or `lock_timeout_ms` passes (0 = forever).
    Lock { lock_id: i64, lock_timeout_ms: u32 },
    /// Takes the lock if it is free; answers a boolean.
    TryLock { lock_id: i64 },
    /// Releases one hold; answers `false` (and the server warns) when not held.
    Unlock { lock_id: i64 },
    /// Releases the lock only if this session holds it; answers whether it did.
    UnlockIfHeld { lock_id: i64 },
}

impl Statement {
    /// The SQL text, with `$1` the lock id (and `$2` the timeout in ms, as text).
    pub(crate) fn text(self) -> &'static str {
        match self {
            // `set_config(..., true)` scopes the timeout to this statement's own
            // transaction, so the session's setting is back as it was afterwards, on
            // success and on error; the sub-select runs before the lock call, so the
            // timeout is in force for the wait. A `lock_timeout` set on the role is
            // overridden too ('0' waits forever).
            Self::Lock { .. } => {
                "SELECT pg_advisory_lock($1) \
                 FROM (SELECT set_config('lock_timeout', $2, true)) AS options"
            }
            Self::TryLock { .. } => "SELECT pg_try_advisory_lock($1)",
            Self::Unlock { .. } => "SELECT pg_advisory_unlock($1)",
            // Used after a wait ended in an error: the server can grant the lock just as
            // the wait is cancelled. pg_locks shows a bigint key as classid (high 32
            // bits) and objid (low 32 bits) with objsubid = 1; checking first avoids the
            // server's WARNING for unlocking a lock that is not held.
            Self::UnlockIfHeld { .. } => {
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks \
                 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
                 AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1) \
                 THEN pg_advisory_unlock($1) ELSE false END"
            }
        }
    }

    /// The lock id bound as `$1`.
    pub(crate) fn lock_id(self) -> i64 {
        match self {
            Self::Lock { lock_id, .. }
            | Self::TryLock { lock_id }
            | Self::Unlock { lock_id }
            | Self::UnlockIfHeld { lock_id } => lock_id,
        }
    }

    /// Whether the statement answers a boolean (all but `Lock`, which returns `void`).
    pub(crate) fn answers_bool(self) -> bool {
        !matches!(self, Self::Lock { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_bind_only_numbers() {
        let lock = Statement::Lock {
            lock_id: 7,
            lock_timeout_ms: 250,
        };
        assert_eq!(
            lock.text(),
            "SELECT pg_advisory_lock($1) FROM (SELECT set_config('lock_timeout', $2, true)) AS options"
        );
        assert_eq!(lock.lock_id(), 7);
        assert!(!lock.answers_bool());
        for statement in [
            Statement::TryLock { lock_id: i64::MAX },
            Statement::Unlock { lock_id: 0 },
            Statement::UnlockIfHeld { lock_id: 1 },
        ] {
            assert!(statement.answers_bool());
            assert!(statement.text().contains("$1"));
            assert!(!statement.text().contains("$2"));
        }
    }
}
