//! The statements. Each is a [`Query`]: prepared once per connection (kept with the
//! connection, see [`crate::connection`]) and then one round trip; only numbers and the
//! session marker are ever bound, no user text reaches SQL. The lock's and the group's
//! statements are here ([`Statement`], read into an [`Answer`]); a strategy with
//! statements of its own (the semaphore's, the fencing tokens', the leader board's)
//! declares its `Query`s in its own module and reads its own rows.
//!
//! Every lock statement first checks the server session's `locks.session` setting
//! against the connection's marker (`:marker` below) and does nothing (answering NULL,
//! no row, or a clear error) when they differ: the statement reached a server session this connection did not
//! set up. Behind a transaction-pooling proxy (PgBouncer `pool_mode = transaction`)
//! consecutive statements of one client connection can run on different server
//! sessions, and a session advisory lock taken on one of them would exclude nothing;
//! the check makes that a clear error instead of a silent double grant.

use std::future::Future;
use std::time::Duration;

use locks_port::LockMode;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::connection::{AfterSetup, Session, SetupValues};
use crate::limit::{Deadline, Expired, Limit};
use crate::query::Query;
#[cfg(test)]
use crate::query::SESSION_SETUP;

/// A statement whose one row's one column is the answer: `$bool` (the lock call) on the
/// connection's own session, NULL on any other, where nothing is done. The refusal is
/// data, never an error.
macro_rules! answered {
    ($($bool:tt)+) => {
        concat!(
            "SELECT CASE WHEN current_setting('locks.session', true) = :marker THEN ",
            $($bool)+,
            " END"
        )
    };
}

/// One lock statement and its parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Statement<'a> {
    /// Blocks until the lock is granted or `lock_timeout_ms` passes (0 = forever; at
    /// most `i32::MAX`, the server's limit, and bound as an integer).
    Lock {
        lock_id: i64,
        mode: LockMode,
        lock_timeout_ms: i32,
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

/// The statements of [`Statement::Lock`], exclusive then shared. `set_config(...,
/// true)` scopes the timeout to the statement's own transaction, so the session's
/// setting is back as it was afterwards, on success and on error; the sub-select runs
/// before the lock call, so the timeout is in force for the wait. A `lock_timeout` set
/// on the role is overridden too ('0' waits forever). `pg_advisory_lock` returns void,
/// which reads as '' as text.
/// The text of [`Statement::Lock`] for the mode's lock function.
macro_rules! wait {
    ($lock:literal) => {
        concat!(
            "SELECT CASE WHEN current_setting('locks.session', true) = :marker \
             THEN ",
            $lock,
            "($1)::text = '' END \
             FROM (SELECT set_config('lock_timeout', $2::integer::text, true)) AS options"
        )
    };
}
static LOCK: [Query; 2] = [
    Query::new(wait!("pg_advisory_lock")),
    Query::new(wait!("pg_advisory_lock_shared")),
];
static TRY_LOCK: [Query; 2] = [
    Query::new(answered!("pg_try_advisory_lock($1)")),
    Query::new(answered!("pg_try_advisory_lock_shared($1)")),
];
static UNLOCK: [Query; 2] = [
    Query::new(answered!("pg_advisory_unlock($1)")),
    Query::new(answered!("pg_advisory_unlock_shared($1)")),
];
/// The text of [`Statement::UnlockIfHeld`] for the mode's `pg_locks` name and unlock
/// function. Used after a wait ended in an error: the server can grant the lock just as
/// the wait is cancelled. pg_locks shows a bigint key as classid (high 32 bits) and
/// objid (low 32 bits) with objsubid = 1; checking first avoids the server's WARNING
/// for unlocking a lock that is not held.
macro_rules! unlock_if_held {
    ($lock_mode:literal, $unlock:literal) => {
        answered!(concat!(
            "CASE WHEN EXISTS (SELECT 1 FROM pg_locks \
             WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
             AND mode = '",
            $lock_mode,
            "' AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1) \
             THEN ",
            $unlock,
            "($1) ELSE false END"
        ))
    };
}
static UNLOCK_IF_HELD: [Query; 2] = [
    Query::new(unlock_if_held!("ExclusiveLock", "pg_advisory_unlock")),
    Query::new(unlock_if_held!("ShareLock", "pg_advisory_unlock_shared")),
];
/// True on the connection's own session, NULL elsewhere.
static PING: Query = Query::new(answered!("true"));
/// Like every lock statement it checks the session marker first (ADR 0014): on a server
/// session not the connection's own it frees nothing (another client's locks above all).
static UNLOCK_ALL: Query = Query::new(answered!("pg_advisory_unlock_all()::text = ''"));
static TRY_LOCK_EACH: [Query; 2] = [
    Query::new(try_each!("pg_try_advisory_lock", "pg_advisory_unlock")),
    Query::new(try_each!(
        "pg_try_advisory_lock_shared",
        "pg_advisory_unlock_shared"
    )),
];
static UNLOCK_EACH: [Query; 2] = [
    Query::new(answered!(
        "(SELECT coalesce(bool_and(pg_advisory_unlock(t.id)), true) \
         FROM unnest($1::bigint[]) AS t(id))"
    )),
    Query::new(answered!(
        "(SELECT coalesce(bool_and(pg_advisory_unlock_shared(t.id)), true) \
         FROM unnest($1::bigint[]) AS t(id))"
    )),
];

/// What one lock statement answered.
#[derive(Debug)]
pub(crate) enum Answer {
    /// `pg_advisory_lock` returned: the lock is held.
    Locked,
    /// A boolean function answered (`pg_try_advisory_lock`, `pg_advisory_unlock`).
    Bool(bool),
    /// `acquire_many`'s try ([`Statement::TryLockEach`]): the index of the first busy
    /// lock (the ones before it are held, none after it), `None` when every lock was
    /// granted.
    FirstBusy(Option<usize>),
    /// The statement reached a server session whose `locks.session` is not this
    /// connection's marker, so it did nothing: a transaction-pooling proxy moved it to
    /// another server session, or something reset the session's settings.
    WrongSession,
    /// The statement answered no row, which none of them does on PostgreSQL: what it
    /// did is unknown, so the session must be closed (which undoes it).
    NoRow,
}

/// A statement's answer: `Ok(Ok(..))` answered, `Ok(Err(..))` the driver's error,
/// `Err(Expired)` no answer within the limit (the statement is still in flight).
pub(crate) type Answered = Result<Result<Answer, tokio_postgres::Error>, Expired>;

/// A statement's parameters: the first `.1` of the array (a statement binds two at most).
#[derive(Clone, Copy)]
struct Params<'p>([&'p (dyn ToSql + Sync); 2], usize);

impl<'p> AsRef<[&'p (dyn ToSql + Sync)]> for Params<'p> {
    fn as_ref(&self) -> &[&'p (dyn ToSql + Sync)] {
        &self.0[..self.1]
    }
}

impl Statement<'static> {
    /// The wait's `Lock` statement and the limit of its answer: the deadline plus the
    /// margin, or none for an unbounded wait (it waits as long as it takes; a
    /// connection that ends meanwhile fails the statement). `None` when no time is
    /// left.
    pub(crate) fn wait(
        deadline: Option<Deadline>,
        lock_id: i64,
        mode: LockMode,
        margin: Duration,
    ) -> Option<(Self, Limit)> {
        let (lock_timeout_ms, limit) = match deadline {
            None => (0, Limit::None),
            Some(bounded) => (
                // At most i32::MAX already.
                i32::try_from(bounded.lock_timeout_ms()?).unwrap_or(i32::MAX),
                Deadline::limit(deadline, margin, Duration::ZERO),
            ),
        };
        let statement = Self::Lock {
            lock_id,
            mode,
            lock_timeout_ms,
        };
        Some((statement, limit))
    }
}

impl Statement<'_> {
    /// The SQL text of a connection whose marker is `marker`.
    #[cfg(test)]
    fn sql(self, marker: &str) -> String {
        self.query().sql(marker)
    }

    /// The statement's [`Query`]: `$1` the lock id (or the ids), then (for
    /// [`Statement::Lock`]) `$2` the timeout in ms, an integer (made text in SQL: no
    /// string is formatted per wait). Each answers one row: its answer column is NULL
    /// when the server session is not the connection's own (and nothing was done
    /// there); [`Statement::TryLockEach`] adds a second column.
    fn query(self) -> &'static Query {
        let shared = usize::from(matches!(self.mode(), LockMode::Shared));
        match self {
            Self::Lock { .. } => &LOCK[shared],
            Self::TryLock { .. } => &TRY_LOCK[shared],
            Self::Unlock { .. } => &UNLOCK[shared],
            Self::UnlockIfHeld { .. } => &UNLOCK_IF_HELD[shared],
            Self::Ping => &PING,
            Self::UnlockAll => &UNLOCK_ALL,
            Self::TryLockEach { .. } => &TRY_LOCK_EACH[shared],
            Self::UnlockEach { .. } => &UNLOCK_EACH[shared],
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

    /// Runs the statement on `session` within `limit` (held by the connection's watch)
    /// and reads its answer.
    ///
    /// If the future is dropped before the answer arrives, or the limit passes first
    /// ([`Expired`]), the statement is still in flight: dropping the session cancels
    /// it and closes the connection.
    ///
    /// A plain function handing back [`Session::read_within`]'s future, its parameters
    /// bound by reference to the statement (which the caller keeps): one layer of future
    /// less around every lock statement.
    pub(crate) fn run<'s>(
        &'s self,
        session: &'s mut Session,
        limit: Limit,
    ) -> impl Future<Output = Answered> + 's {
        session.read_within(self.query(), self.params(), limit, |row| match row {
            Some(row) => self.read(&row),
            None => Ok(Answer::NoRow),
        })
    }

    /// Sets a new connection up for holding locks
    /// ([`SESSION_SETUP`](crate::query::SESSION_SETUP)) with the
    /// statement pipelined behind it: one round trip for both (two when the statements
    /// are not prepared yet), within `limit` (on expiry the statements are in flight,
    /// as in [`run`](Self::run)).
    pub(crate) async fn run_after_setup(
        self,
        session: &mut Session,
        values: SetupValues<'_>,
        limit: Limit,
    ) -> AfterSetup<Answer> {
        let (set_up, row) = session
            .query_after_setup(values, self.query(), self.params().as_ref(), limit)
            .await?;
        Ok((set_up, row.and_then(|row| self.read(&row))))
    }

    /// The statement's parameters, bound by reference to it.
    fn params(&self) -> Params<'_> {
        const NONE: &(dyn ToSql + Sync) = &0_i32;
        match self {
            Self::Lock {
                lock_id,
                lock_timeout_ms,
                ..
            } => Params([lock_id, lock_timeout_ms], 2),
            Self::TryLock { lock_id, .. }
            | Self::Unlock { lock_id, .. }
            | Self::UnlockIfHeld { lock_id, .. } => Params([lock_id, NONE], 1),
            Self::TryLockEach { lock_ids, .. } | Self::UnlockEach { lock_ids, .. } => {
                Params([lock_ids, NONE], 1)
            }
            Self::Ping | Self::UnlockAll => Params([NONE, NONE], 0),
        }
    }

    /// Reads the statement's one row: NULL in the answer column means it reached
    /// another server session and did nothing there.
    #[inline]
    fn read(self, row: &Row) -> Result<Answer, tokio_postgres::Error> {
        Ok(match self {
            Self::Lock { .. } => match row.try_get::<_, Option<bool>>(0)? {
                Some(_) => Answer::Locked,
                None => Answer::WrongSession,
            },
            Self::TryLockEach { .. } => match row.try_get::<_, Option<i64>>(0)? {
                None => Answer::WrongSession,
                Some(0) => Answer::FirstBusy(None),
                // Ordinality counts from 1; an index past usize is not possible.
                Some(at) => Answer::FirstBusy(Some(usize::try_from(at - 1).unwrap_or(usize::MAX))),
            },
            _ => row
                .try_get::<_, Option<bool>>(0)?
                .map_or(Answer::WrongSession, Answer::Bool),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_has_a_place_of_its_own_for_good() {
        let queries: Vec<&Query> = [
            &LOCK,
            &TRY_LOCK,
            &UNLOCK,
            &UNLOCK_IF_HELD,
            &TRY_LOCK_EACH,
            &UNLOCK_EACH,
        ]
        .into_iter()
        .flatten()
        .chain([&PING, &UNLOCK_ALL, &SESSION_SETUP])
        .collect();
        let places: Vec<usize> = queries.iter().map(|query| query.index()).collect();
        let mut distinct = places.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), queries.len(), "{places:?}");
        let again: Vec<usize> = queries.iter().map(|query| query.index()).collect();
        assert_eq!(places, again);
        // Numbered from one counter: the places stay within a short vector.
        assert!(places.iter().all(|&place| place < 1024), "{places:?}");
    }

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
        assert_eq!(
            lock.sql(marker),
            "SELECT CASE WHEN current_setting('locks.session', true) = '0123456789abcdef' \
             THEN pg_advisory_lock($1)::text = '' END \
             FROM (SELECT set_config('lock_timeout', $2::integer::text, true)) AS options"
        );
        assert!(
            Statement::Ping
                .sql(marker)
                .contains("= '0123456789abcdef' THEN true END")
        );
        assert!(!Statement::Ping.sql(marker).contains('$'));
        let unlock_if_held = Statement::UnlockIfHeld {
            lock_id: 1,
            mode: LockMode::Exclusive,
        }
        .sql(marker);
        assert!(
            unlock_if_held.contains(
                "AND mode = 'ExclusiveLock' AND objsubid = 1 \
                 AND ((classid::bigint << 32) | objid::bigint) = $1) \
                 THEN pg_advisory_unlock($1) ELSE false END END"
            ),
            "{unlock_if_held}"
        );
        let unlock_all = Statement::UnlockAll.sql(marker);
        assert!(unlock_all.contains("= '0123456789abcdef'") && !unlock_all.contains('$'));
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
                assert_eq!(
                    sql.contains("_shared("),
                    mode == LockMode::Shared,
                    "{statement:?}"
                );
            }
        }
    }
}
