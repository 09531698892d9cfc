//! Who holds an advisory lock, and who waits for it: `pg_locks` joined with
//! `pg_stat_activity`, asked of the server, so it sees every client (this process, the Python
//! fleet, `psql`).
//!
//! One statement through the simple query protocol (no prepared statement, so it works
//! through PgBouncer too), with the lock id written as an integer literal. Times come back as
//! microseconds since the epoch, so no date type of the driver is needed.

use std::fmt;
use std::net::IpAddr;

use time::OffsetDateTime;
use tokio_postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

use crate::connection::Session;
use crate::errors::{describe, no_answer, pool_full};
use crate::inner::Inner;
use crate::limit::{Expired, Limit};
use crate::pool::{self, PoolError, Pooled};
use crate::query::Query;
use locks_port::{LockAcquisitionError, LockMode};

/// The prefix of `application_name` on the manager's lock connections: `locks:<holder id>`.
const OUR_APPLICATION_PREFIX: &str = "locks:";

/// The id of one advisory lock, as `pg_locks` identifies it.
///
/// Keys are not recoverable from ids: a key is hashed into its id (SHA-256, see
/// [`KeyDerivation`](locks_port::KeyDerivation)), so to find a key's lock, derive its id with
/// [`PostgresLockManager::lock_id`](crate::PostgresLockManager::lock_id) and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum AdvisoryLockId {
    /// A lock taken with one `bigint` (`pg_advisory_lock(bigint)`): every lock of this
    /// library and of the Python one.
    Int8(i64),
    /// A lock taken with two `integer`s (`pg_advisory_lock(int, int)`); another id space,
    /// which never collides with the `bigint` one.
    Int4Pair(i32, i32),
}

impl AdvisoryLockId {
    /// The `bigint` id, for a lock taken with one.
    #[must_use]
    pub fn as_int8(self) -> Option<i64> {
        match self {
            Self::Int8(id) => Some(id),
            Self::Int4Pair(..) => None,
        }
    }

    /// From `pg_locks`' `classid`, `objid` and `objsubid` (1: one `bigint`, its high and
    /// low halves; 2: two `integer`s).
    fn from_pg_locks(classid: u32, objid: u32, objsubid: u32) -> Option<Self> {
        match objsubid {
            1 => Some(Self::Int8(i64::from_be_bytes(
                ((u64::from(classid) << 32) | u64::from(objid)).to_be_bytes(),
            ))),
            2 => Some(Self::Int4Pair(
                i32::from_be_bytes(classid.to_be_bytes()),
                i32::from_be_bytes(objid.to_be_bytes()),
            )),
            _ => None,
        }
    }
}

/// One session (or prepared transaction) that holds an advisory lock, or waits for it
/// (`granted` says which). Fields the server does not show to the asking role are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// The lock.
    pub lock: AdvisoryLockId,
    /// The backend's process id; `None` for a prepared transaction.
    pub pid: Option<i32>,
    /// Exclusive or shared.
    pub mode: LockMode,
    /// Whether it holds the lock (`true`) or waits for it (`false`).
    pub granted: bool,
    /// When it started waiting (`pg_locks.waitstart`), for a waiter on PostgreSQL 14 and
    /// later; `None` for holders, on older servers, and for the first moments of a wait.
    pub waiting_since: Option<OffsetDateTime>,
    /// The session's `application_name`.
    pub application_name: Option<String>,
    /// The client's address; `None` for a Unix-socket client or when not shown.
    pub client_addr: Option<IpAddr>,
    /// The client's TCP port.
    pub client_port: Option<u16>,
    /// When the session started (`backend_start`).
    pub backend_start: Option<OffsetDateTime>,
    /// Whether the session is one of this library's lock connections (its
    /// `application_name` is `locks:` or `locks:<holder id>`).
    pub ours: bool,
    /// The [`holder_id`](crate::PostgresLockManagerBuilder::holder_id) of the manager the
    /// session belongs to, when it is ours and has one, as its `application_name` carries
    /// it (one too long for it: its start and a hash of it,
    /// [`holder_application_name`](crate::holder_application_name)).
    pub holder_id: Option<String>,
}

/// The server could not be asked who holds a lock.
#[derive(Debug)]
#[non_exhaustive]
pub enum InspectError {
    /// No connection could be had from the manager's pool within its
    /// [`connect_timeout`](crate::PostgresLockManagerBuilder::connect_timeout): the
    /// server did not let one be opened. (A pool whose every connection was in use is
    /// [`PoolFull`](Self::PoolFull).) The message says why in the server's words when
    /// the server said why: `could not ask who holds advisory locks: no connection: role
    /// "x" does not exist (28000)`.
    Pool(PoolError),
    /// Every connection of the manager's pool stayed in use for the whole
    /// [`connect_timeout`](crate::PostgresLockManagerBuilder::connect_timeout): each
    /// held lock keeps one. Size the pool for the most locks held at once plus the
    /// reads. The message says it as an acquisition's does: `could not ask who holds
    /// advisory locks: no pool connection was free to look with (all 1 in use; each
    /// held lock keeps one)`.
    PoolFull {
        /// `no pool connection was free to look with (all {n} in use; each held lock
        /// keeps one)`.
        reason: String,
        /// The pool's error (a wait that timed out).
        source: PoolError,
    },
    /// The query failed.
    Query {
        /// The server's (or driver's) words.
        reason: String,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// The server answered something this code cannot read.
    UnexpectedAnswer {
        /// What was wrong.
        reason: String,
    },
}

impl fmt::Display for InspectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pool(source) => write!(
                f,
                "could not ask who holds advisory locks: no connection: {}",
                pool::pool_error_words(source)
            ),
            Self::PoolFull { reason, .. } => {
                write!(f, "could not ask who holds advisory locks: {reason}")
            }
            Self::Query { reason, .. } => {
                write!(f, "could not ask who holds advisory locks: {reason}")
            }
            Self::UnexpectedAnswer { reason } => {
                write!(f, "unexpected answer about advisory locks: {reason}")
            }
        }
    }
}

impl std::error::Error for InspectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Pool(source) | Self::PoolFull { source, .. } => Some(source),
            Self::Query { source, .. } => Some(source),
            Self::UnexpectedAnswer { .. } => None,
        }
    }
}

/// A pooled connection for one inspection read, within the manager's connect timeout
/// ([`pool::for_one_read`]); a pool whose every connection stayed in use is
/// [`InspectError::PoolFull`], said in the words of an acquisition's full pool.
pub(crate) async fn connection_for_read(inner: &Inner) -> Result<Pooled, InspectError> {
    let checked_out = pool::for_one_read(inner.pool(), inner.settings().connect_timeout).await;
    checked_out.map_err(|source| {
        if pool::is_busy(&source) {
            let what = "no pool connection was free to look with";
            let reason = pool_full(what, pool::max_size(inner.pool()));
            InspectError::PoolFull { reason, source }
        } else {
            InspectError::Pool(source)
        }
    })
}

/// Runs one small statement of `name` (a board row, a permit probe) on a pooled
/// connection, on the connection's one path (its prepared statements, its watch; dropped
/// or unanswered within the answer timeout, the session cancels the statement and
/// closes, so nothing it took stays held): its one row, or the driver's error for the
/// caller to word. `what_for` ends "no pool connection was free …".
pub(crate) async fn one_statement(
    inner: &Inner,
    name: &str,
    query: &'static Query,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    what_for: &str,
) -> Result<Result<tokio_postgres::Row, tokio_postgres::Error>, LockAcquisitionError> {
    let object = pool::for_one_read_of(
        inner.pool(),
        inner.settings().connect_timeout,
        name,
        what_for,
    )
    .await?;
    let mut session = Session::new(object, inner.connections());
    let bound = inner.settings().answer_timeout;
    match session
        .query_within(query, params, Limit::Waiting(bound))
        .await
    {
        Ok(Ok(row)) => {
            session.into_pool();
            Ok(Ok(row))
        }
        // The session, dropped, closes: a statement that failed half-way leaves nothing.
        Ok(Err(error)) => Ok(Err(error)),
        // Still in flight: the session, dropped, cancels it and closes.
        Err(Expired) => Err(no_answer(name, None, bound)),
    }
}

/// [`PostgresLockManager::holders`]: on a pooled connection.
pub(crate) async fn holders_of_key(
    inner: &Inner,
    key: &str,
) -> Result<Vec<LockHolder>, InspectError> {
    let client = connection_for_read(inner).await?;
    lock_holders(&client, inner.lock_ids().lock_id(key)).await
}

/// [`PostgresLockManager::holders_of_all`]: on a pooled connection.
pub(crate) async fn holders_of_every_lock(inner: &Inner) -> Result<Vec<LockHolder>, InspectError> {
    let client = connection_for_read(inner).await?;
    all_lock_holders(&client).await
}

/// [`PostgresLockManager::holders`](crate::PostgresLockManager::holders) without a manager: who holds and who waits for the
/// `bigint` advisory lock `lock_id` on `client`'s database. For a CLI or a health endpoint;
/// a pooled connection derefs to a [`Client`].
///
/// ```no_run
/// use locks_postgres::tokio_postgres::NoTls;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let (client, connection) =
///     locks_postgres::tokio_postgres::connect("postgres://app@db/app", NoTls).await?;
/// tokio::spawn(connection);
/// let id = locks_postgres::locks_port::lock_id("cutover:tenant-1");
/// let waiting = locks_postgres::lock_holders(&client, id)
///     .await?
///     .iter()
///     .filter(|holder| !holder.granted)
///     .count();
/// println!("{waiting} waiting");
/// # Ok(()) }
/// ```
///
/// Its cost grows with every lock held on the server: `pg_locks` copies the whole lock
/// table, holding up other sessions' lock requests meanwhile (`docs/capacity.md`, "What
/// each observation read costs").
///
/// # Errors
/// [`InspectError::Query`] when the server refuses.
pub async fn lock_holders(client: &Client, lock_id: i64) -> Result<Vec<LockHolder>, InspectError> {
    let bits = u64::from_be_bytes(lock_id.to_be_bytes());
    let filter = format!(
        "AND l.objsubid = 1 AND l.classid = '{}'::oid AND l.objid = '{}'::oid",
        bits >> 32,
        bits & 0xFFFF_FFFF
    );
    query(client, &filter).await
}

/// [`PostgresLockManager::holders_of_all`](crate::PostgresLockManager::holders_of_all) without a manager: every advisory lock on
/// `client`'s database. Lock ids only: keys are not recoverable from ids.
///
/// Its cost grows with every lock held on the server: `pg_locks` copies the whole lock
/// table, holding up other sessions' lock requests meanwhile (`docs/capacity.md`, "What
/// each observation read costs").
///
/// # Errors
/// [`InspectError::Query`] when the server refuses.
pub async fn all_lock_holders(client: &Client) -> Result<Vec<LockHolder>, InspectError> {
    query(client, "").await
}

/// The advisory locks taken with two `integer`s whose first is one of `classes` (a
/// semaphore's permits and markers): narrowed on the server, so a read at 10^5 held locks
/// sends the few rows asked for instead of every one. (`pg_locks` still copies the whole
/// lock table on the server: see the README's observation costs.)
pub(crate) async fn int4_pair_lock_holders(
    client: &Client,
    classes: &[i32],
) -> Result<Vec<LockHolder>, InspectError> {
    let oids: Vec<String> = classes
        .iter()
        .map(|class| format!("'{}'::oid", u32::from_be_bytes(class.to_be_bytes())))
        .collect();
    let filter = format!("AND l.objsubid = 2 AND l.classid IN ({})", oids.join(", "));
    query(client, &filter).await
}

/// The query; `filter` narrows it to one lock (or one class). `waitstart` is read through `to_jsonb` so the
/// same text works before PostgreSQL 14, which lacks the column. Waiters are ordered by when
/// they started waiting, then by how many sessions block them (those ahead in the queue).
async fn query(client: &Client, filter: &str) -> Result<Vec<LockHolder>, InspectError> {
    let sql = format!(
        "SELECT l.classid, l.objid, l.objsubid, l.pid, l.mode, l.granted, \
                (extract(epoch FROM (to_jsonb(l) ->> 'waitstart')::timestamptz) \
                    * 1000000)::int8 AS waitstart_us, \
                a.application_name, host(a.client_addr), a.client_port, \
                (extract(epoch FROM a.backend_start) * 1000000)::int8 \
         FROM pg_locks l \
         LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' \
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           {filter} \
         ORDER BY l.classid, l.objid, l.objsubid, l.granted DESC, waitstart_us NULLS LAST, \
                  CASE WHEN l.granted THEN 0 ELSE cardinality(pg_blocking_pids(l.pid)) END, \
                  l.pid"
    );
    let messages = client
        .simple_query(&sql)
        .await
        .map_err(|source| InspectError::Query {
            reason: describe(&source),
            source,
        })?;
    messages
        .iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(read_row(row)),
            _ => None,
        })
        .collect()
}

fn read_row(row: &SimpleQueryRow) -> Result<LockHolder, InspectError> {
    let unexpected = |what: &str| InspectError::UnexpectedAnswer {
        reason: format!("pg_locks gave an unreadable {what}"),
    };
    let number = |index: usize, what: &str| -> Result<Option<i64>, InspectError> {
        row.get(index)
            .map(|text| text.parse::<i64>().map_err(|_| unexpected(what)))
            .transpose()
    };
    let oid = |index: usize, what: &str| -> Result<u32, InspectError> {
        number(index, what)?
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| unexpected(what))
    };
    let lock =
        AdvisoryLockId::from_pg_locks(oid(0, "classid")?, oid(1, "objid")?, oid(2, "objsubid")?)
            .ok_or_else(|| unexpected("objsubid"))?;
    let pid = number(3, "pid")?
        .map(|pid| i32::try_from(pid).map_err(|_| unexpected("pid")))
        .transpose()?;
    let mode = match row.get(4) {
        Some("ExclusiveLock") => LockMode::Exclusive,
        Some("ShareLock") => LockMode::Shared,
        _ => return Err(unexpected("mode")),
    };
    let granted = match row.get(5) {
        Some("t") => true,
        Some("f") => false,
        _ => return Err(unexpected("granted")),
    };
    let time = |index: usize, what: &str| -> Result<Option<OffsetDateTime>, InspectError> {
        number(index, what)?
            .map(|micros| {
                OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
                    .map_err(|_| unexpected(what))
            })
            .transpose()
    };
    let application_name = row.get(7).map(str::to_owned);
    let ours = application_name
        .as_deref()
        .is_some_and(|name| name.starts_with(OUR_APPLICATION_PREFIX));
    let holder_id = application_name
        .as_deref()
        .and_then(|name| name.strip_prefix(OUR_APPLICATION_PREFIX))
        .filter(|id| !id.is_empty())
        .map(str::to_owned);
    Ok(LockHolder {
        lock,
        pid,
        mode,
        granted,
        waiting_since: time(6, "waitstart")?,
        client_addr: row.get(8).and_then(|addr| addr.parse().ok()),
        client_port: number(9, "client_port")?.and_then(|port| u16::try_from(port).ok()),
        backend_start: time(10, "backend_start")?,
        application_name,
        ours,
        holder_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_rebuilt_from_their_halves() {
        for id in [0, 1, 7_696_161_359_070_260_854, i64::MAX, -1, i64::MIN] {
            let bits = u64::from_be_bytes(id.to_be_bytes());
            let high = u32::try_from(bits >> 32).unwrap();
            let low = u32::try_from(bits & 0xFFFF_FFFF).unwrap();
            assert_eq!(
                AdvisoryLockId::from_pg_locks(high, low, 1),
                Some(AdvisoryLockId::Int8(id))
            );
        }
        assert_eq!(
            AdvisoryLockId::from_pg_locks(u32::MAX, 5, 2),
            Some(AdvisoryLockId::Int4Pair(-1, 5))
        );
        assert_eq!(AdvisoryLockId::from_pg_locks(1, 2, 3), None);
    }
}
