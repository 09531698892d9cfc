//! The statements. Each is prepared once per connection (kept with the connection's
//! state, see [`crate::connection`]) and then costs one round trip; only numbers and
//! the session marker are ever bound, no user text reaches SQL.
//!
//! Every lock statement first checks the server session's `locks.session` setting
//! against the connection's marker (`:marker` below) and does nothing (answering NULL,
//! no row, or a clear error) when they differ: the statement reached a server session this connection did not
//! set up. Behind a transaction-pooling proxy (PgBouncer `pool_mode = transaction`)
//! consecutive statements of one client connection can run on different server
//! sessions, and a session advisory lock taken on one of them would exclude nothing;
//! the check makes that a clear error instead of a silent double grant.

use locks_port::LockMode;

/// How many lock statements a connection can have prepared in fixed slots: six kinds
/// of lock statement in two modes, the keepalive, the set-up and the unlock of
/// everything. (A strategy's own [`Query`]s are kept apart, by query.)
pub(crate) const PREPARED_KINDS: usize = 15;
/// The slot of [`SESSION_SETUP`] among a connection's prepared statements.
pub(crate) const SETUP_SLOT: usize = 9;

/// A statement of a strategy with statements of its own (the semaphore's, the fencing
/// tokens'), declared as a `static` in the strategy's own module: prepared once per
/// connection (kept with the connection, by the static's address: a new strategy
/// numbers nothing here), from `text` with `:marker` for the connection's marker, like
/// a [`Statement`]. Its parameters are bound by the caller and its one row read by the
/// caller (see [`Session::query_within`](crate::connection::Session::query_within)).
#[derive(Debug)]
pub(crate) struct Query {
    /// Its SQL, with `:marker` where the connection's marker goes.
    text: &'static str,
}

impl Query {
    /// The query `text` (with `:marker` where the connection's marker goes).
    pub(crate) const fn new(text: &'static str) -> Self {
        Self { text }
    }

    /// The SQL text of a connection whose marker is `marker`.
    pub(crate) fn sql(&self, marker: &str) -> String {
        with_marker(self.text, marker)
    }
}

/// `text` with the connection's `marker` (16 hex digits, checked) quoted in place of
/// `:marker`.
fn with_marker(text: &str, marker: &str) -> String {
    debug_assert!(marker.bytes().all(|byte| byte.is_ascii_hexdigit()));
    text.replace(":marker", &format!("'{marker}'"))
}

/// Run once on every connection the manager uses, before its first lock statement
/// (pipelined with it). `$1` is the `application_name` (or NULL), `$2` the
/// connection's marker, `$3` to `$7` the lease's server timers (or NULL: see
/// [`crate::lease::ServerTimers::as_settings`]).
///
/// It first claims the server session: `locks.session = $2`, unless the session
/// already carries another connection's marker (then it changes nothing and answers
/// NULL as the owner: the server session is shared, a transaction-pooling proxy). On
/// a claimed session it sets, at session level, so they hold for every later statement:
/// - `statement_timeout = 0`: a server, role or URL `statement_timeout` must not end a
///   wait in `pg_advisory_lock` (the timer is armed when a statement starts, so a
///   statement-local override could not disarm it);
/// - `idle_session_timeout = 0` (PostgreSQL 14+; skipped where the setting does not
///   exist) and `idle_in_transaction_session_timeout = 0`: a session holding a lock is
///   idle, and ending it would free the lock;
/// - `application_name = $1` (`locks:<holder id>`) when the manager has a holder id:
///   other sessions can see in `pg_stat_activity` which holders are ours;
/// - the lease's timers, when the manager has a lease: `tcp_keepalives_idle`,
///   `tcp_keepalives_interval`, `tcp_keepalives_count`, `tcp_user_timeout` and
///   `client_connection_check_interval` (each skipped where the server lacks it).
///
/// Answers `pg_is_in_recovery()` (a standby must not be used: its advisory locks
/// exclude nothing on the primary) and the owner (the marker, or NULL when foreign).
pub(crate) const SESSION_SETUP: &str = "SELECT pg_is_in_recovery(), owner \
     FROM (SELECT CASE WHEN coalesce(current_setting('locks.session', true), '') IN ('', $2) \
     THEN set_config('locks.session', $2, false) END AS owner) AS mark, \
     LATERAL (SELECT \
     CASE WHEN owner IS NOT NULL THEN set_config('statement_timeout', '0', false) END, \
     CASE WHEN owner IS NOT NULL \
     THEN set_config('idle_in_transaction_session_timeout', '0', false) END, \
     CASE WHEN owner IS NOT NULL AND current_setting('idle_session_timeout', true) IS NOT NULL \
     THEN set_config('idle_session_timeout', '0', false) END, \
     CASE WHEN owner IS NOT NULL AND $1::text IS NOT NULL \
     THEN set_config('application_name', $1, false) END, \
     CASE WHEN owner IS NOT NULL AND $3::text IS NOT NULL \
     THEN set_config('tcp_keepalives_idle', $3, false) END, \
     CASE WHEN owner IS NOT NULL AND $4::text IS NOT NULL \
     THEN set_config('tcp_keepalives_interval', $4, false) END, \
     CASE WHEN owner IS NOT NULL AND $5::text IS NOT NULL \
     THEN set_config('tcp_keepalives_count', $5, false) END, \
     CASE WHEN owner IS NOT NULL AND $6::text IS NOT NULL \
     AND current_setting('tcp_user_timeout', true) IS NOT NULL \
     THEN set_config('tcp_user_timeout', $6, false) END, \
     CASE WHEN owner IS NOT NULL AND $7::text IS NOT NULL \
     AND current_setting('client_connection_check_interval', true) IS NOT NULL \
     THEN set_config('client_connection_check_interval', $7, false) END) AS settings";

/// A statement whose one row's one column is the answer: `$bool` (the lock call) on the
/// connection's own session, NULL on any other, where nothing is done. The refusal is
/// data, never an error.
macro_rules! answered {
    ($bool:literal) => {
        concat!(
            "SELECT CASE WHEN current_setting('locks.session', true) = :marker THEN ",
            $bool,
            " END"
        )
    };
}

/// One lock statement and its parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Statement<'a> {
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
    /// Releases every advisory lock of the session (`release_all` on a shared
    /// connection whose every lock is being released); answers `true`.
    UnlockAll,
    /// `acquire_many`'s try, one round trip for every key: takes each lock that is free,
    /// in the order given (the global order), then frees again those after the first
    /// busy one, which that order does not allow to be held while waiting for it.
    /// Answers the index of the first busy lock (the locks before it are held, none
    /// after it), or that every lock was granted.
    TryLockEach { lock_ids: &'a [i64], mode: LockMode },
    /// Releases one hold of each lock, one round trip; answers whether every one was
    /// held.
    UnlockEach { lock_ids: &'a [i64], mode: LockMode },
}

/// The text of [`Statement::TryLockEach`] for `$try` and `$unlock` (the mode's
/// functions). `tried` is materialised, so each try runs once, in the array's order (a
/// scan of `unnest` in ordinality order); the unlocks of the locks after the first busy
/// one run in the same statement, so the caller never holds them while it waits.
macro_rules! try_each {
    ($try:literal, $unlock:literal) => {
        concat!(
            "WITH tried AS MATERIALIZED (SELECT t.ord, t.id, ",
            $try,
            "(t.id) AS got \
             FROM unnest($1::bigint[]) WITH ORDINALITY AS t(id, ord) \
             WHERE current_setting('locks.session', true) = :marker), \
             busy AS (SELECT min(ord) AS at FROM tried WHERE NOT got) \
             SELECT CASE WHEN current_setting('locks.session', true) = :marker \
             THEN coalesce((SELECT at FROM busy), 0) END, \
             (SELECT count(",
            $unlock,
            "(tried.id)) FROM tried, busy WHERE tried.got AND tried.ord > busy.at)"
        )
    };
}

impl Statement<'_> {
    /// The SQL text of a connection whose marker is `marker` (see [`Statement::text`]).
    pub(crate) fn sql(self, marker: &str) -> String {
        with_marker(self.text(), marker)
    }

    /// The SQL text with `:marker` for the connection's marker: `$1` the lock id, then
    /// (for [`Statement::Lock`]) `$2` the timeout in ms, an integer (made text in SQL:
    /// no string is formatted per wait). Each answers one row: its answer column is NULL
    /// when the server session is not the connection's own (and nothing was done there);
    /// [`Statement::TryLockEach`] adds a second column.
    pub(crate) fn text(self) -> &'static str {
        let shared = matches!(self.mode(), LockMode::Shared);
        match self {
            // `set_config(..., true)` scopes the timeout to this statement's own
            // transaction, so the session's setting is back as it was afterwards, on
            // success and on error; the sub-select runs before the lock call, so the
            // timeout is in force for the wait. A `lock_timeout` set on the role is
            // overridden too ('0' waits forever). `pg_advisory_lock` returns void,
            // which reads as '' as text.
            Self::Lock { .. } if shared => {
                "SELECT CASE WHEN current_setting('locks.session', true) = :marker \
                 THEN pg_advisory_lock_shared($1)::text = '' END \
                 FROM (SELECT set_config('lock_timeout', $2::integer::text, true)) AS options"
            }
            Self::Lock { .. } => {
                "SELECT CASE WHEN current_setting('locks.session', true) = :marker \
                 THEN pg_advisory_lock($1)::text = '' END \
                 FROM (SELECT set_config('lock_timeout', $2::integer::text, true)) AS options"
            }
            Self::TryLock { .. } if shared => answered!("pg_try_advisory_lock_shared($1)"),
            Self::TryLock { .. } => answered!("pg_try_advisory_lock($1)"),
            Self::Unlock { .. } if shared => answered!("pg_advisory_unlock_shared($1)"),
            Self::Unlock { .. } => answered!("pg_advisory_unlock($1)"),
            // Used after a wait ended in an error: the server can grant the lock just as
            // the wait is cancelled. pg_locks shows a bigint key as classid (high 32
            // bits) and objid (low 32 bits) with objsubid = 1; checking first avoids the
            // server's WARNING for unlocking a lock that is not held.
            Self::UnlockIfHeld { .. } if shared => answered!(
                "CASE WHEN EXISTS (SELECT 1 FROM pg_locks \
                 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
                 AND mode = 'ShareLock' \
                 AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1) \
                 THEN pg_advisory_unlock_shared($1) ELSE false END"
            ),
            Self::UnlockIfHeld { .. } => answered!(
                "CASE WHEN EXISTS (SELECT 1 FROM pg_locks \
                 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
                 AND mode = 'ExclusiveLock' \
                 AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1) \
                 THEN pg_advisory_unlock($1) ELSE false END"
            ),
            // True on the connection's own session, NULL elsewhere.
            Self::Ping => answered!("true"),
            // Like every lock statement it checks the session marker first (ADR 0014):
            // on a server session not the connection's own it frees nothing (another
            // client's locks above all).
            Self::UnlockAll => answered!("pg_advisory_unlock_all()::text = ''"),
            Self::TryLockEach { .. } if shared => {
                try_each!("pg_try_advisory_lock_shared", "pg_advisory_unlock_shared")
            }
            Self::TryLockEach { .. } => try_each!("pg_try_advisory_lock", "pg_advisory_unlock"),
            Self::UnlockEach { .. } if shared => answered!(
                "(SELECT coalesce(bool_and(pg_advisory_unlock_shared(t.id)), true) \
                 FROM unnest($1::bigint[]) AS t(id))"
            ),
            Self::UnlockEach { .. } => answered!(
                "(SELECT coalesce(bool_and(pg_advisory_unlock(t.id)), true) \
                 FROM unnest($1::bigint[]) AS t(id))"
            ),
        }
    }

    /// The statement's slot among a connection's prepared statements (below
    /// [`PREPARED_KINDS`]; [`SETUP_SLOT`] is the set-up's).
    pub(crate) fn slot(self) -> usize {
        let shared = usize::from(matches!(self.mode(), LockMode::Shared));
        match self {
            Self::Lock { .. } => shared,
            Self::TryLock { .. } => 2 + shared,
            Self::Unlock { .. } => 4 + shared,
            Self::UnlockIfHeld { .. } => 6 + shared,
            Self::Ping => 8,
            Self::UnlockAll => 10,
            Self::TryLockEach { .. } => 11 + shared,
            Self::UnlockEach { .. } => 13 + shared,
        }
    }

    /// The mode of the lock the statement is about.
    pub(crate) fn mode(self) -> LockMode {
        match self {
            Self::Lock { mode, .. }
            | Self::TryLock { mode, .. }
            | Self::Unlock { mode, .. }
            | Self::UnlockIfHeld { mode, .. }
            | Self::TryLockEach { mode, .. }
            | Self::UnlockEach { mode, .. } => mode,
            Self::Ping | Self::UnlockAll => LockMode::Exclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_bind_only_numbers_and_carry_the_marker() {
        let marker = "0123456789abcdef";
        let lock = Statement::Lock {
            lock_id: 7,
            mode: LockMode::Exclusive,
            lock_timeout_ms: 250,
        };
        assert!(lock.sql(marker).starts_with(
            "SELECT CASE WHEN current_setting('locks.session', true) = '0123456789abcdef' \
             THEN pg_advisory_lock($1)"
        ));
        assert!(lock.sql(marker).contains("$2") && !lock.sql(marker).contains("$3"));
        assert!(
            Statement::Ping
                .sql(marker)
                .contains("= '0123456789abcdef' THEN true END")
        );
        assert!(!Statement::Ping.sql(marker).contains('$'));
        let unlock_all = Statement::UnlockAll.sql(marker);
        assert!(unlock_all.contains("= '0123456789abcdef'") && !unlock_all.contains('$'));
        assert!(Statement::UnlockAll.slot() < PREPARED_KINDS);
        for mode in [LockMode::Exclusive, LockMode::Shared] {
            for statement in [
                Statement::TryLock {
                    lock_id: i64::MAX,
                    mode,
                },
                Statement::Unlock { lock_id: 0, mode },
                Statement::UnlockIfHeld { lock_id: 1, mode },
                Statement::TryLockEach {
                    lock_ids: &[1, 2],
                    mode,
                },
                Statement::UnlockEach {
                    lock_ids: &[1, 2],
                    mode,
                },
            ] {
                let sql = statement.sql(marker);
                assert!(sql.contains("$1"));
                assert!(sql.contains("locks.session', true) = '0123456789abcdef'"));
                assert!(!sql.contains("$2") && !sql.contains(":marker"));
                assert!(statement.slot() < PREPARED_KINDS && statement.slot() != SETUP_SLOT);
                assert_eq!(
                    sql.contains("_shared("),
                    mode == LockMode::Shared,
                    "{statement:?}"
                );
            }
        }
    }
}
