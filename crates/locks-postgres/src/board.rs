//! The leader board on PostgreSQL: the latest term of each election in a small table,
//! read and written through pooled connections, one statement each (ADR 0024).

use locks_port::{
    AcquisitionErrorKind, LockAcquisitionError, Proclamation, check_board_name,
    check_published_value,
};
use time::OffsetDateTime;
use tokio_postgres::Row;

use crate::errors::{driver_error, with_install_hint};
use crate::inner::Inner;
use crate::inspect::one_statement;
use crate::query::Query;
use crate::settings::{HOLDER_APPLICATION_NAME_PREFIX, published_holder_id};
use crate::xact::install_under_lock;

/// The table of leader terms (in the connection's `search_path` schema).
pub const LEADER_BOARD_TABLE: &str = "advisory_lock_leader_terms";

/// The statement that creates the table of leader terms, for migration tools: what
/// [`install_leader_board`] runs. One row per election name, overwritten by each term.
pub const LEADER_BOARD_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS advisory_lock_leader_terms (\
     name text PRIMARY KEY, \
     term bigint NOT NULL CHECK (term > 0), \
     holder_id text, \
     value text NOT NULL, \
     since timestamptz NOT NULL, \
     retired boolean NOT NULL)";

static PROCLAIM: Query = Query::new(
    "INSERT INTO advisory_lock_leader_terms AS t \
     (name, term, holder_id, value, since, retired) \
     VALUES ($1, 1, $2, $3, clock_timestamp(), false) ON CONFLICT (name) \
     DO UPDATE SET term = t.term + 1, holder_id = excluded.holder_id, value = excluded.value, \
     since = excluded.since, retired = false \
     RETURNING term, holder_id, value, \
     (extract(epoch FROM since) * 1000000)::bigint, retired",
);

/// One row: how many terms were marked retired (0 or 1).
static RETIRE: Query = Query::new(
    "WITH retired AS (UPDATE advisory_lock_leader_terms SET retired = true \
     WHERE name = $1 AND term = $2 RETURNING 1) SELECT count(*) FROM retired",
);

/// One row: the latest term of `$1`, all NULL when there is none.
static LATEST: Query = Query::new(
    "SELECT t.term, t.holder_id, t.value, \
     (extract(epoch FROM t.since) * 1000000)::bigint, t.retired \
     FROM (SELECT $1::text AS name) AS q \
     LEFT JOIN advisory_lock_leader_terms AS t ON t.name = q.name",
);

/// The key of the lock [`install_leader_board`] holds while it creates the table.
pub const LEADER_BOARD_INSTALL_KEY: &str = "locks-postgres:install:advisory_lock_leader_terms";

/// Creates the table of leader terms if it does not exist: the install step of a
/// leader board ([`LeaderBoard`](locks_port::LeaderBoard) on [`PostgresLockManager`](crate::PostgresLockManager)). Run it once per database
/// (a migration, a deploy step); the manager never creates it on its own. Idempotent,
/// and safe to run from several processes at once: it holds a transaction lock on
/// [`LEADER_BOARD_INSTALL_KEY`] meanwhile (two concurrent `CREATE TABLE IF NOT EXISTS`
/// can otherwise fail with a unique violation in the server's catalog).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 4)?;
/// let client = pool.get().await?;
/// locks_postgres::install_leader_board(&client).await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// The driver's error when the statement fails (for example, no `CREATE` privilege).
pub async fn install_leader_board(
    client: &tokio_postgres::Client,
) -> Result<(), tokio_postgres::Error> {
    install_under_lock(client, LEADER_BOARD_INSTALL_KEY, LEADER_BOARD_SCHEMA).await
}

/// [`LeaderBoard::proclaim`](locks_port::LeaderBoard::proclaim) of a manager.
pub(crate) async fn proclaim(
    inner: &Inner,
    name: &str,
    value: &str,
) -> Result<Proclamation, LockAcquisitionError> {
    check_board_name(name)?;
    check_published_value(name, value)?;
    let holder_id = inner.holder_id().and_then(|id| {
        published_holder_id(id)
            .strip_prefix(HOLDER_APPLICATION_NAME_PREFIX)
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
    });
    let row = board_statement(inner, name, &PROCLAIM, &[&name, &holder_id, &value]).await?;
    proclamation(name, &row)
}

/// [`LeaderBoard::retire`](locks_port::LeaderBoard::retire) of a manager.
pub(crate) async fn retire(
    inner: &Inner,
    name: &str,
    term: u64,
) -> Result<(), LockAcquisitionError> {
    let term = i64::try_from(term).unwrap_or(i64::MAX);
    board_statement(inner, name, &RETIRE, &[&name, &term])
        .await
        .map(drop)
}

/// [`LeaderBoard::latest`](locks_port::LeaderBoard::latest) of a manager.
pub(crate) async fn latest(
    inner: &Inner,
    name: &str,
) -> Result<Option<Proclamation>, LockAcquisitionError> {
    let row = board_statement(inner, name, &LATEST, &[&name]).await?;
    match row.try_get::<_, Option<i64>>(0) {
        Ok(None) => Ok(None),
        _ => proclamation(name, &row).map(Some),
    }
}

/// Runs one board statement on a pooled connection ([`one_statement`]): its one row.
async fn board_statement(
    inner: &Inner,
    name: &str,
    query: &'static Query,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Row, LockAcquisitionError> {
    // A name `text` cannot hold, or one past what the index of names holds, fails alike
    // on every board, before anything is asked of the server.
    check_board_name(name)?;
    one_statement(inner, name, query, params, "for the board")
        .await?
        .map_err(|error| {
            with_install_hint(
                name,
                driver_error(name, error),
                "create the leader board's table once with locks_postgres::install_leader_board",
            )
        })
}

fn proclamation(name: &str, row: &Row) -> Result<Proclamation, LockAcquisitionError> {
    let unexpected = |what: &str| {
        LockAcquisitionError::new(
            name,
            AcquisitionErrorKind::Backend,
            format!("the leader board's row has an unexpected {what}"),
        )
    };
    let term: i64 = row.try_get(0).map_err(|_| unexpected("term"))?;
    let holder_id: Option<String> = row.try_get(1).map_err(|_| unexpected("holder_id"))?;
    let value: String = row.try_get(2).map_err(|_| unexpected("value"))?;
    let micros: i64 = row.try_get(3).map_err(|_| unexpected("since"))?;
    let retired: bool = row.try_get(4).map_err(|_| unexpected("retired"))?;
    let since = OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
        .map_err(|_| unexpected("since"))?;
    let term = u64::try_from(term).map_err(|_| unexpected("term"))?;
    Ok(Proclamation::new(term, holder_id, value, since, retired))
}
