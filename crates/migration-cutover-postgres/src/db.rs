//! Connections in a transaction that never go back to the pool half-done, and errors that
//! carry the server's own words.

use std::fmt;

use deadpool_postgres::{Object, Pool, PoolError};
use locks_port::BoxError;
use locks_postgres::CancelPath;
use tokio_postgres::error::SqlState;

/// A database operation failed; the text is the operation and the server's own words
/// (message, SQLSTATE, detail), the driver's error stays reachable as the source.
#[derive(Debug, thiserror::Error)]
#[error("{}{words}", operation(what))]
pub(crate) struct DbFailure {
    what: &'static str,
    words: String,
    code: Option<SqlState>,
    #[source]
    source: Option<BoxError>,
}

fn operation(what: &str) -> String {
    if what.is_empty() {
        String::new()
    } else {
        format!("{what}: ")
    }
}

impl DbFailure {
    /// The same failure without the operation's name, for a parent error that names it.
    pub(crate) fn unnamed(mut self) -> Self {
        self.what = "";
        self
    }

    pub(crate) fn driver(what: &'static str, error: tokio_postgres::Error) -> Self {
        Self {
            what,
            words: server_words(&error),
            code: error.code().cloned(),
            source: Some(Box::new(error)),
        }
    }

    pub(crate) fn pool(what: &'static str, error: PoolError) -> Self {
        match error {
            PoolError::Backend(error) => Self::driver(what, error),
            other => Self {
                what,
                words: format!("no connection from the pool ({other})"),
                code: None,
                source: None,
            },
        }
    }

    pub(crate) fn refused(what: &'static str, words: String) -> Self {
        Self {
            what,
            words,
            code: None,
            source: None,
        }
    }

    /// The SQLSTATE, when the server answered with an error.
    pub(crate) fn code(&self) -> Option<&SqlState> {
        self.code.as_ref()
    }
}

/// The text that tells databases apart: name, server address and port, and the server's
/// start time (two stores in one database share it; two clusters on one port do not).
const IDENTIFY: &str = "SELECT current_database()::text || '@' \
     || coalesce(host(inet_server_addr()), 'socket') || ':' \
     || coalesce(inet_server_port(), 0)::text || '/' || pg_postmaster_start_time()::text";

/// Which database `pool` reaches, asked once and kept in `cell`.
pub(crate) async fn identity<'a>(
    cell: &'a tokio::sync::OnceCell<String>,
    pool: &Pool,
) -> Result<&'a str, DbFailure> {
    const WHAT: &str = "identify the database";
    cell.get_or_try_init(|| async {
        let client = pool
            .get()
            .await
            .map_err(|error| DbFailure::pool(WHAT, error))?;
        let row = client
            .query_one(IDENTIFY, &[])
            .await
            .map_err(|error| DbFailure::driver(WHAT, error))?;
        Ok(row.get(0))
    })
    .await
    .map(String::as_str)
}

/// Checks out a connection and runs `sql` (prepared once per connection) with `params`:
/// the one query path of the repositories, whose failures name `what`.
///
/// # Cancel safety
/// Dropping the future while the statement is on its way (a cutover step cut short by
/// its pause budget) cancels the statement and closes the connection, as a dropped
/// [`Transaction`] does: the statement cannot land later, and no other caller gets a
/// connection still busy with it (which would wait behind it, whatever its own timeout).
pub(crate) async fn repository_query(
    pool: &Pool,
    what: &'static str,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, migration_cutover::RepositoryError> {
    let failed =
        |failure: DbFailure| migration_cutover::RepositoryError::new(what, failure.unnamed());
    let in_flight = InFlight::checkout(pool)
        .await
        .map_err(|error| failed(DbFailure::pool(what, error)))?;
    let rows = {
        let client = in_flight.client();
        match client.prepare_cached(sql).await {
            Ok(statement) => client.query(&statement, params).await,
            Err(error) => Err(error),
        }
    };
    in_flight.answered();
    rows.map_err(|error| failed(DbFailure::driver(what, error)))
}

/// A pooled connection with a statement on its way: dropped before the answer came, it
/// cancels the statement and closes the connection instead of giving it back (a caller
/// cut short by a timeout leaves no busy connection in the pool for the next one to wait
/// behind, and no statement to land later).
pub(crate) struct InFlight {
    object: Option<Object>,
    cancel: CancelPath,
}

impl InFlight {
    /// A connection of `pool`, to send statements on.
    pub(crate) async fn checkout(pool: &Pool) -> Result<Self, deadpool_postgres::PoolError> {
        Ok(Self {
            object: Some(pool.get().await?),
            cancel: CancelPath::of(pool),
        })
    }

    pub(crate) fn client(&self) -> &Object {
        self.object
            .as_ref()
            .expect("the connection is held until answered() gives it back")
    }

    /// Every statement was answered (rows or an error): the connection is idle, and goes
    /// back to the pool.
    pub(crate) fn answered(mut self) {
        drop(self.object.take());
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            self.cancel.cancel_and_close(object);
        }
    }
}

/// A failed `COMMIT` as a store error: with an answer from the server (an SQLSTATE) the
/// transaction was not committed ([`StoreError::Unavailable`]); without one (the
/// connection broke once the `COMMIT` was on its way) nobody here knows whether it was
/// ([`StoreError::CommitUncertain`]).
pub(crate) fn commit_failure(failure: DbFailure) -> migration_cutover::StoreError {
    if failure.code().is_none() {
        migration_cutover::StoreError::CommitUncertain {
            source: Box::new(failure),
        }
    } else {
        migration_cutover::StoreError::unavailable(failure)
    }
}

/// What the server said, without the driver's "db error" wrapper.
pub(crate) fn server_words(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut words = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                words.push_str(": ");
                words.push_str(detail);
            }
            words
        }
        None => {
            // Not a server error (I/O, closed connection): the driver's text and causes.
            let mut words = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                words.push_str(": ");
                words.push_str(&cause.to_string());
                source = cause.source();
            }
            words
        }
    }
}

/// A pooled connection with an open transaction.
///
/// [`commit`](Self::commit) and [`rollback`](Self::rollback) end the transaction and give
/// the connection back; on every other path (an error in between, the future dropped)
/// dropping it detaches the connection from the pool and closes it, so the server aborts
/// the transaction and frees its transaction-scoped locks at once. A statement still
/// running (a lock wait) is cancelled first so the server leaves the lock queue.
pub(crate) struct Transaction {
    object: Option<Object>,
    in_flight: bool,
    /// The pool's cancel path (its TLS connector), for a statement in flight at drop.
    cancel: CancelPath,
}

impl fmt::Debug for Transaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction")
            .field("open", &self.object.is_some())
            .finish()
    }
}

impl Transaction {
    /// Checks out a connection and runs `BEGIN` followed by `setup` (simple-protocol
    /// text, one round trip).
    pub(crate) async fn begin(
        pool: &Pool,
        what: &'static str,
        setup: &str,
    ) -> Result<Self, DbFailure> {
        let object = pool
            .get()
            .await
            .map_err(|error| DbFailure::pool(what, error))?;
        let mut transaction = Self {
            object: Some(object),
            in_flight: false,
            cancel: CancelPath::of(pool),
        };
        let batch = format!("BEGIN; {setup}");
        transaction.batch(what, &batch).await?;
        Ok(transaction)
    }

    pub(crate) fn client(&self) -> &Object {
        self.object
            .as_ref()
            .expect("a transaction holds its connection until it is consumed")
    }

    /// Runs simple-protocol statements, cancelling them if the future is dropped.
    pub(crate) async fn batch(&mut self, what: &'static str, sql: &str) -> Result<(), DbFailure> {
        self.in_flight = true;
        let result = self.client().batch_execute(sql).await;
        self.in_flight = false;
        result.map_err(|error| DbFailure::driver(what, error))
    }

    /// Runs simple-protocol statements through a shared reference (no cancel on drop:
    /// for short statements inside a transaction whose owner handles the rest).
    pub(crate) async fn statements(&self, what: &'static str, sql: &str) -> Result<(), DbFailure> {
        self.client()
            .batch_execute(sql)
            .await
            .map_err(|error| DbFailure::driver(what, error))
    }

    /// Commits and gives the connection back to the pool.
    pub(crate) async fn commit(mut self, what: &'static str) -> Result<(), DbFailure> {
        self.batch(what, "COMMIT").await?;
        drop(self.object.take());
        Ok(())
    }

    /// Rolls back and gives the connection back; a failed rollback closes it.
    pub(crate) async fn rollback(mut self) {
        if self.batch("rollback", "ROLLBACK").await.is_ok() {
            drop(self.object.take());
        }
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        let Some(object) = self.object.take() else {
            return;
        };
        if self.in_flight {
            // Best effort: closing the connection frees the locks in any case.
            self.cancel.cancel_and_close(object);
        } else {
            drop(Object::take(object));
        }
    }
}

/// Milliseconds for a timeout setting (`idle_in_transaction_session_timeout`): at least 1
/// (0 would mean "never"), saturating at `i32::MAX` (the setting's upper bound).
pub(crate) fn setting_ms(timeout: std::time::Duration) -> u64 {
    u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, i32::MAX.unsigned_abs().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timeout_settings_never_mean_forever_and_saturate() {
        assert_eq!(setting_ms(Duration::ZERO), 1);
        assert_eq!(setting_ms(Duration::from_micros(10)), 1);
        assert_eq!(setting_ms(Duration::from_millis(250)), 250);
        assert_eq!(setting_ms(Duration::MAX), 2_147_483_647);
    }
}
