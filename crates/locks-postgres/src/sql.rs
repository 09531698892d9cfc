//! The statements. Each is prepared once per connection (deadpool's statement cache)
//! and then costs one round trip; only numbers are ever bound, no user text reaches
//! SQL.

use locks_port::LockMode;

/// Run once on every connection the manager uses, before its first lock statement
/// (pipelined with it). Session-level settings, so they hold for every later statement
/// on the connection:
/// - `statement_timeout = 0`: a server, role or URL `statement_timeout` must not end a
///   wait in `pg_advisory_lock` (the timer is armed when a statement starts, so a
///   statement-local override could not disarm it);
/// - `idle_session_timeout = 0` (PostgreSQL 14+; skipped where the setting does not
///   exist) and `idle_in_transaction_session_timeout = 0`: a session holding a lock is
///   idle, and ending it would free the lock;
/// - `application_name = $1` (`locks:<holder id>`) when the manager has a holder id
///   (`$1` is NULL otherwise): other sessions can see in `pg_stat_activity` which
///   holders are ours.
///
/// Answers `pg_is_in_recovery()`: a standby must not be used (its advisory locks
/// exclude nothing on the primary).
pub(crate) const SESSION_SETUP: &str = "SELECT pg_is_in_recovery() \
     FROM (SELECT set_config('statement_timeout', '0', false), \
     set_config('idle_in_transaction_session_timeout', '0', false), \
     CASE WHEN current_setting('idle_session_timeout', true) IS NOT NULL \
     THEN set_config('idle_session_timeout', '0', false) END, \
     CASE WHEN $1::text IS NOT NULL THEN set_config('application_name', $1, false) END) \
     AS settings";

/// One lock statement and its parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Statement {
    /// Blocks until the lock is granted or `lock_timeout_ms` passes (0 = forever).
    Lock {
        lock_id: i64,
        mode: LockMode,
        lock_timeout_ms: u32,
    },
    /// Takes the lock if it is free; answers a boolean.
    TryLock { lock_id: i64, mode: LockMode },
    /// Releases one hold; answers `false` (and the server warns) when not held.
    Unlock { lock_id: i64, mode: LockMode },
    /// Releases the lock only if this session holds it; answers whether it did.
    UnlockIfHeld { lock_id: i64, mode: LockMode },
    /// The keepalive of a held lock's idle connection; answers `true`.
    Ping,
}

impl Statement {
    /// The SQL text, with `$1` the lock id (and `$2` the timeout in ms, as text).
    pub(crate) fn text(self) -> &'static str {
        let shared = matches!(self.mode(), LockMode::Shared);
        match self {
            // `set_config(..., true)` scopes the timeout to this statement's own
            // transaction, so the session's setting is back as it was afterwards, on
            // success and on error; the sub-select runs before the lock call, so the
            // timeout is in force for the wait. A `lock_timeout` set on the role is
            // overridden too ('0' waits forever).
            Self::Lock { .. } if shared => {
                "SELECT pg_advisory_lock_shared($1) \
                 FROM (SELECT set_config('lock_timeout', $2, true)) AS options"
            }
            Self::Lock { .. } => {
                "SELECT pg_advisory_lock($1) \
                 FROM (SELECT set_config('lock_timeout', $2, true)) AS options"
            }
            Self::TryLock { .. } if shared => "SELECT pg_try_advisory_lock_shared($1)",
            Self::TryLock { .. } => "SELECT pg_try_advisory_lock($1)",
            Self::Unlock { .. } if shared => "SELECT pg_advisory_unlock_shared($1)",
            Self::Unlock { .. } => "SELECT pg_advisory_unlock($1)",
            // Used after a wait ended in an error: the server can grant the lock just as
            // the wait is cancelled. pg_locks shows a bigint key as classid (high 32
            // bits) and objid (low 32 bits) with objsubid = 1; checking first avoids the
            // server's WARNING for unlocking a lock that is not held.
            Self::UnlockIfHeld { .. } if shared => {
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks \
                 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
                 AND mode = 'ShareLock' \
                 AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1) \
                 THEN pg_advisory_unlock_shared($1) ELSE false END"
            }
            Self::UnlockIfHeld { .. } => {
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks \
                 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
                 AND mode = 'ExclusiveLock' \
                 AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1) \
                 THEN pg_advisory_unlock($1) ELSE false END"
            }
            Self::Ping => "SELECT true",
        }
    }

    /// The lock id bound as `$1` (none for [`Statement::Ping`]).
    pub(crate) fn lock_id(self) -> Option<i64> {
        match self {
            Self::Lock { lock_id, .. }
            | Self::TryLock { lock_id, .. }
            | Self::Unlock { lock_id, .. }
            | Self::UnlockIfHeld { lock_id, .. } => Some(lock_id),
            Self::Ping => None,
        }
    }

    /// The mode of the lock the statement is about.
    pub(crate) fn mode(self) -> LockMode {
        match self {
            Self::Lock { mode, .. }
            | Self::TryLock { mode, .. }
            | Self::Unlock { mode, .. }
            | Self::UnlockIfHeld { mode, .. } => mode,
            Self::Ping => LockMode::Exclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_bind_only_numbers() {
        let lock = Statement::Lock {
            lock_id: 7,
            mode: LockMode::Exclusive,
            lock_timeout_ms: 250,
        };
        assert_eq!(
            lock.text(),
            "SELECT pg_advisory_lock($1) FROM (SELECT set_config('lock_timeout', $2, true)) AS options"
        );
        assert_eq!(lock.lock_id(), Some(7));
        for mode in [LockMode::Exclusive, LockMode::Shared] {
            for statement in [
                Statement::TryLock {
                    lock_id: i64::MAX,
                    mode,
                },
                Statement::Unlock { lock_id: 0, mode },
                Statement::UnlockIfHeld { lock_id: 1, mode },
            ] {
                assert!(statement.text().contains("$1"));
                assert!(!statement.text().contains("$2"));
                assert_eq!(
                    statement.text().contains("_shared("),
                    mode == LockMode::Shared,
                    "{statement:?}"
                );
            }
        }
    }
}
