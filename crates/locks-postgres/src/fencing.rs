//! Fencing tokens: a counter per lock id in a table of their own, incremented in the
//! holder's session right after each grant.
//!
//! The counter row is updated and committed while the lock is held, so two grants of
//! one key are ordered by the lock and get strictly increasing tokens, whichever
//! process (or language) took them, as long as they share the table. The token is
//! durable once the statement returns; across a failover it survives only with
//! synchronous replication (an asynchronous standby can be promoted without the last
//! increments, and would hand out a token again).

use std::collections::HashMap;

use locks_port::{AcquisitionErrorKind, LockAcquisitionError};

use crate::connection::Session;
use crate::errors::{driver_error, with_install_hint};
use crate::inner::Inner;
use crate::limit::{Expired, Limit};
use crate::query::Query;
use crate::xact::install_under_lock;

/// The table of fencing tokens (in the connection's `search_path` schema).
pub const FENCING_TABLE: &str = "advisory_lock_fencing_tokens";

/// The statement that creates the table of fencing tokens, for migration tools: what
/// [`install_fencing`] runs.
pub const FENCING_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS advisory_lock_fencing_tokens (\
     lock_id bigint PRIMARY KEY, \
     token bigint NOT NULL CHECK (token > 0), \
     granted_at timestamptz NOT NULL DEFAULT now())";

/// The next token of the lock `$1`: one row, the token.
static NEXT_TOKEN: Query = Query::new(
    "INSERT INTO advisory_lock_fencing_tokens AS t (lock_id, token) \
     VALUES ($1, 1) ON CONFLICT (lock_id) \
     DO UPDATE SET token = t.token + 1, granted_at = now() RETURNING token",
);

/// The key whose transaction lock [`install_fencing`] holds while it creates the table.
pub const FENCING_INSTALL_KEY: &str = "locks-postgres:install:advisory_lock_fencing_tokens";

/// Creates the table of fencing tokens if it does not exist: the explicit install step
/// of [`PostgresLockManagerBuilder::fencing`](crate::PostgresLockManagerBuilder::fencing).
/// Run it once per database (a migration, a deploy step); the manager never creates it
/// on its own. Idempotent, and safe to run from several processes at once: it holds a
/// transaction lock on [`FENCING_INSTALL_KEY`] meanwhile (two concurrent `CREATE TABLE
/// IF NOT EXISTS` can otherwise fail with a unique violation in the server's catalog).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 4)?;
/// let client = pool.get().await?;
/// locks_postgres::install_fencing(&client).await?;
/// let locks = locks_postgres::PostgresLockManager::builder(pool).fencing(true).build();
/// # drop(locks);
/// # Ok(())
/// # }
/// ```
///
/// A holder then stores its token beside the data it protects and lets the database
/// refuse a write from a holder that paused past the loss of its lock:
///
/// ```sql
/// UPDATE accounts SET balance = $2, fencing_token = $3
///  WHERE id = $1 AND fencing_token < $3;   -- 0 rows: a newer holder wrote already
/// ```
///
/// # Errors
/// The driver's error when the statement fails (for example, no `CREATE` privilege).
pub async fn install_fencing(client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    install_under_lock(client, FENCING_INSTALL_KEY, FENCING_SCHEMA).await
}

/// The next tokens of several lock ids at once (a group of `acquire_many`), in one
/// statement: one row, the lock ids and their tokens as two arrays in the same order.
static NEXT_TOKENS: Query = Query::new(
    "WITH next AS (INSERT INTO advisory_lock_fencing_tokens AS t (lock_id, token) \
     SELECT id, 1 FROM unnest($1::bigint[]) AS id ON CONFLICT (lock_id) \
     DO UPDATE SET token = t.token + 1, granted_at = now() RETURNING lock_id, token) \
     SELECT array_agg(lock_id), array_agg(token) FROM next",
);

/// The next token of `lock_id`, taken in the session that holds it. On failure the
/// session is dropped (closed), which frees the lock, and the acquisition fails.
pub(crate) async fn next_fencing_token(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    session: &mut Session,
) -> Result<i64, LockAcquisitionError> {
    let limit = Limit::Waiting(inner.settings().answer_timeout);
    let answer = session
        .query_within(&NEXT_TOKEN, &[&lock_id], limit)
        .await
        .map(|row| row?.try_get::<_, i64>(0));
    fencing_answer(key, answer)
}

/// The next tokens of `lock_ids` (distinct), taken in the session that holds them
/// all, by lock id; one round trip. On failure, as
/// [`next_fencing_token`](next_fencing_token).
pub(crate) async fn next_fencing_tokens(
    inner: &Inner,
    key: &str,
    lock_ids: &[i64],
    session: &mut Session,
) -> Result<HashMap<i64, i64>, LockAcquisitionError> {
    let limit = Limit::Waiting(inner.settings().answer_timeout);
    let answer = session
        .query_within(&NEXT_TOKENS, &[&lock_ids], limit)
        .await
        .map(|row| {
            let row = row?;
            let ids: Option<Vec<i64>> = row.try_get(0)?;
            let tokens: Option<Vec<i64>> = row.try_get(1)?;
            Ok(ids
                .unwrap_or_default()
                .into_iter()
                .zip(tokens.unwrap_or_default())
                .collect())
        });
    fencing_answer(key, answer)
}

/// The outcome of a fencing-token statement, with a hint when the table is missing.
fn fencing_answer<T>(
    key: &str,
    answer: Result<Result<T, tokio_postgres::Error>, Expired>,
) -> Result<T, LockAcquisitionError> {
    match answer {
        Ok(Ok(tokens)) => Ok(tokens),
        Ok(Err(error)) => Err(with_install_hint(
            key,
            driver_error(key, error),
            "fencing is on: create the token table once with locks_postgres::install_fencing",
        )),
        // The statement is still in flight: the session, dropped, cancels and closes it.
        Err(Expired) => Err(LockAcquisitionError::new(
            key,
            AcquisitionErrorKind::ConnectionLost,
            "Database error: the server did not answer the fencing-token statement",
        )),
    }
}
