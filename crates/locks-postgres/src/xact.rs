//! Transaction-scoped advisory locks: taken inside the caller's own transaction and released
//! by its `COMMIT` or `ROLLBACK`, never by hand.
//!
//! Every statement goes through the simple query protocol with the lock id written as an
//! integer literal: no prepared statement, so it works through PgBouncer in transaction mode
//! (1.18 and later), where a transaction is the unit that stays on one server session.

use std::time::Duration;

use locks_port::{KeyDerivation, LockMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::{SimpleQueryMessage, Transaction};
use tracing::{Instrument, Span};

use crate::errors::sqlstate;
use crate::settings::KeyVisibility;
use crate::telemetry::{acquire_span, record_failure};

mod error;

pub use self::error::TransactionLockError;

/// The savepoint a bounded wait runs in; rolled back to (and released) when the wait fails,
/// released when it succeeds. The name does not clash with tokio-postgres's `sp_N`.
const SAVEPOINT: &str = "locks_xact_wait";
/// Where a bounded wait keeps the caller's `lock_timeout` and `statement_timeout` meanwhile
/// (placeholder settings, local to the transaction).
const SAVED_LOCK_TIMEOUT: &str = "locks_xact.lock_timeout";
const SAVED_STATEMENT_TIMEOUT: &str = "locks_xact.statement_timeout";
/// The largest `lock_timeout` PostgreSQL accepts, in milliseconds (`INT_MAX`).
const MAX_LOCK_TIMEOUT_MS: u128 = i32::MAX as u128;

/// The port's [`LockMode`], under the name this crate used before the port had one.
#[deprecated(since = "0.2.0", note = "use `LockMode` (one name for one thing)")]
pub type AdvisoryLockMode = LockMode;

/// The function that waits for a lock of `mode`.
fn wait_function(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Shared => "pg_advisory_xact_lock_shared",
        _ => "pg_advisory_xact_lock",
    }
}

/// The function that tries a lock of `mode` once.
fn try_function(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Shared => "pg_try_advisory_xact_lock_shared",
        _ => "pg_try_advisory_xact_lock",
    }
}

/// Advisory locks that belong to the caller's transaction (`pg_advisory_xact_lock` and its
/// shared and `try` forms), keyed like [`PostgresLockManager`](crate::PostgresLockManager):
/// the same key gives the same lock id, so transaction locks and session locks (and the Python
/// library's) on one key exclude each other.
///
/// A lock taken here is released when the transaction commits or rolls back, and not before;
/// there is no guard and no unlock. It works with any pool, and through a transaction-pooling
/// PgBouncer. Pass a `tokio_postgres::Transaction` or (it derefs to one) a
/// `deadpool_postgres::Transaction`; a plain client is refused at compile time, because
/// outside a transaction block the lock would end with the statement.
///
/// How long a call waits is up to the call alone: the session's `lock_timeout` and
/// `statement_timeout` (a role's or server's default included) neither shorten nor outlast
/// it, and they are as before when the call returns. A failed wait leaves the transaction
/// usable: it runs in a savepoint that is rolled back to. (Meanwhile the caller's values are
/// kept in two transaction-local placeholder settings, `locks_xact.lock_timeout` and
/// `locks_xact.statement_timeout`, which stay visible to `SHOW` until the transaction ends.)
///
/// ```no_run
/// use std::time::Duration;
///
/// use locks_postgres::TransactionLocks;
/// use locks_postgres::locks_port::LockMode;
///
/// # async fn run(pool: locks_postgres::deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// let locks = TransactionLocks::new();
/// let mut client = pool.get().await?;
/// let tx = client.transaction().await?;
/// locks
///     .lock_with_timeout(&tx, "cutover:tenant-1", LockMode::Exclusive, Duration::from_secs(5))
///     .await?;
/// tx.execute("UPDATE routing SET store = 'dedicated' WHERE tenant = 1", &[]).await?;
/// tx.commit().await?; // releases the lock
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TransactionLocks {
    derivation: KeyDerivation,
    key_visibility: KeyVisibility,
    span_level: tracing::Level,
}

impl Default for TransactionLocks {
    fn default() -> Self {
        Self {
            derivation: KeyDerivation::default(),
            key_visibility: KeyVisibility::default(),
            span_level: crate::telemetry::DEFAULT_SPAN_LEVEL,
        }
    }
}

/// What one attempt found.
enum Attempt {
    Granted,
    Busy,
}

/// Runs `ddl` (an idempotent install step, `CREATE TABLE IF NOT EXISTS ...`) in a
/// transaction that first takes the transaction lock of `install_key`: two concurrent
/// `CREATE TABLE IF NOT EXISTS` of a new table can otherwise fail with a unique
/// violation in the server's catalog (23505 on `pg_type`). On failure the transaction
/// is rolled back, so the session stays usable for whoever reuses it.
pub(crate) async fn install_under_lock(
    client: &tokio_postgres::Client,
    install_key: &str,
    ddl: &str,
) -> Result<(), tokio_postgres::Error> {
    let lock_id = locks_port::lock_id(install_key);
    let installed = client
        .batch_execute(&format!(
            "BEGIN; {}{ddl}; COMMIT",
            TransactionLocks::statements(lock_id, LockMode::Exclusive, None)
        ))
        .await;
    if installed.is_err() {
        let _ = client.batch_execute("ROLLBACK").await;
    }
    installed
}

impl TransactionLocks {
    /// Locks keyed with [`KeyDerivation::CURRENT`], keys shown in spans.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The key derivation; it must be the one of every process contending for the same keys
    /// (the manager's [`key_derivation`](crate::PostgresLockManagerBuilder::key_derivation)).
    #[must_use]
    pub fn key_derivation(mut self, derivation: KeyDerivation) -> Self {
        self.derivation = derivation;
        self
    }

    /// Whether keys appear in spans (see [`KeyVisibility`]).
    #[must_use]
    pub fn key_visibility(mut self, key_visibility: KeyVisibility) -> Self {
        self.key_visibility = key_visibility;
        self
    }

    /// The level of the acquisition spans: DEBUG by default (see
    /// [`PostgresLockManagerBuilder::span_level`](crate::PostgresLockManagerBuilder::span_level)).
    #[must_use]
    pub fn span_level(mut self, level: tracing::Level) -> Self {
        self.span_level = level;
        self
    }

    /// The lock id of `key`.
    #[must_use]
    pub fn lock_id(&self, key: &str) -> i64 {
        self.derivation.lock_id(key)
    }

    /// The statements that take the lock `lock_id` in `mode` as part of a simple-query
    /// batch the caller sends inside an open transaction block (after its own `BEGIN`, say,
    /// so that opening a transaction and locking cost one round trip), for code that runs
    /// its own transactions on pooled connections (the migration cutover's stores).
    ///
    /// With a `timeout`, the batch first sets the transaction's `lock_timeout` to it (in
    /// whole milliseconds rounded up, at least 1 ms, at most `i32::MAX` ms ≈ 24.8 days:
    /// longer timeouts saturate there), and the setting stays for the rest of the
    /// transaction, so lock statements that follow in it are bounded by the same deadline.
    /// Without one, the wait is bounded by whatever `lock_timeout` the transaction has.
    /// When the wait runs out, the batch fails with SQLSTATE 55P03 (`LOCK_NOT_AVAILABLE`)
    /// and the transaction is aborted: unlike [`lock_with_timeout`](Self::lock_with_timeout)
    /// there is no savepoint, so roll back (or close the connection).
    ///
    /// Ends with `; `, so batches can be chained. Nothing is sent here.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use locks_postgres::TransactionLocks;
    /// use locks_postgres::locks_port::LockMode;
    ///
    /// let locks = TransactionLocks::new();
    /// let id = locks.lock_id("cutover:tenant-123");
    /// assert_eq!(
    ///     TransactionLocks::statements(id, LockMode::Shared, Some(Duration::from_micros(1500))),
    ///     "SELECT set_config('lock_timeout', '2ms', true); \
    ///      SELECT pg_advisory_xact_lock_shared(7696161359070260854); ",
    /// );
    /// assert_eq!(
    ///     TransactionLocks::statements(id, LockMode::Exclusive, None),
    ///     "SELECT pg_advisory_xact_lock(7696161359070260854); ",
    /// );
    /// ```
    #[must_use]
    pub fn statements(lock_id: i64, mode: LockMode, timeout: Option<Duration>) -> String {
        let lock = format!("SELECT {}({lock_id}); ", wait_function(mode));
        match timeout {
            None => lock,
            Some(timeout) => {
                let ms = lock_timeout_ms(timeout).unwrap_or(1);
                format!("SELECT set_config('lock_timeout', '{ms}ms', true); {lock}")
            }
        }
    }

    /// Takes the lock if it is free right now (`pg_try_advisory_xact_lock[_shared]`); `false`
    /// when someone else holds it in a conflicting mode, or waits for it ahead of us.
    /// Never waits. One round trip.
    ///
    /// # Errors
    /// [`TransactionLockError::Backend`] when the statement fails; the transaction is then
    /// aborted, as after any failed statement.
    ///
    /// # Cancel safety
    /// Dropping the future after the statement was sent leaves the lock taken or not, as the
    /// server decides; either way it ends with the transaction.
    pub async fn try_lock(
        &self,
        tx: &Transaction<'_>,
        key: &str,
        mode: LockMode,
    ) -> Result<bool, TransactionLockError> {
        refuse_empty(key)?;
        let lock_id = self.lock_id(key);
        let span = self.span(key, lock_id, "pg_try_advisory_xact_lock", None);
        let result = try_once(tx, lock_id, mode)
            .instrument(span.clone())
            .await
            .map(|attempt| matches!(attempt, Attempt::Granted))
            .map_err(|error| TransactionLockError::from_driver(key, None, error));
        finish(&span, &result.as_ref().map(|granted| *granted));
        result
    }

    /// Takes the lock, waiting in the server's queue as long as it takes; nothing but a
    /// deadlock, a cancellation or a failure ends the wait (not the session's
    /// `lock_timeout` or `statement_timeout`). One round trip when the lock is free, one more
    /// when it has to wait (and one more again when the wait fails).
    ///
    /// # Errors
    /// [`TransactionLockError::Deadlock`] (the transaction is usable but still holds what it
    /// held: roll it back so the other side can go on), [`TransactionLockError::Cancelled`]
    /// (`pg_cancel_backend`), [`TransactionLockError::Backend`].
    ///
    /// # Cancel safety
    /// Once the wait is sent, the server carries it out whatever happens to the future.
    /// Dropped while waiting: if the wait then succeeds, the lock is held until the
    /// transaction ends and the settings are restored, as if the call had returned; if it
    /// fails, the transaction is left aborted (its next statement fails), so roll it back.
    pub async fn lock(
        &self,
        tx: &Transaction<'_>,
        key: &str,
        mode: LockMode,
    ) -> Result<(), TransactionLockError> {
        self.acquire(tx, key, mode, None).await
    }

    /// Takes the lock, waiting in the server's queue for at most `timeout` (a server-side
    /// `lock_timeout`, in whole milliseconds rounded up, at most `i32::MAX` ms ≈ 24.8 days:
    /// longer timeouts saturate there). [`Duration::ZERO`] tries once without waiting.
    ///
    /// # Errors
    /// [`TransactionLockError::Timeout`] when the lock stayed busy for `timeout`; the
    /// transaction is usable and its `lock_timeout` is as before. Otherwise as
    /// [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Self::lock).
    pub async fn lock_with_timeout(
        &self,
        tx: &Transaction<'_>,
        key: &str,
        mode: LockMode,
        timeout: Duration,
    ) -> Result<(), TransactionLockError> {
        self.acquire(tx, key, mode, Some(timeout)).await
    }

    async fn acquire(
        &self,
        tx: &Transaction<'_>,
        key: &str,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<(), TransactionLockError> {
        refuse_empty(key)?;
        let lock_id = self.lock_id(key);
        let span = self.span(key, lock_id, "pg_advisory_xact_lock", timeout);
        let result = async {
            match try_once(tx, lock_id, mode).await {
                Ok(Attempt::Granted) => return Ok(()),
                Ok(Attempt::Busy) => {}
                Err(error) => return Err(TransactionLockError::from_driver(key, timeout, error)),
            }
            let lock_timeout_ms = match timeout {
                None => 0,
                Some(timeout) => match lock_timeout_ms(timeout) {
                    Some(ms) => ms,
                    None => {
                        return Err(TransactionLockError::Timeout {
                            key: key.to_owned(),
                            timeout,
                        });
                    }
                },
            };
            wait(tx, lock_id, mode, lock_timeout_ms)
                .await
                .map_err(|error| TransactionLockError::from_driver(key, timeout, error))
        }
        .instrument(span.clone())
        .await;
        finish(&span, &result.as_ref().map(|()| true));
        result
    }

    fn span(
        &self,
        key: &str,
        lock_id: i64,
        operation: &'static str,
        timeout: Option<Duration>,
    ) -> Span {
        let key = match self.key_visibility {
            KeyVisibility::Hidden => None,
            _ => Some(key),
        };
        acquire_span(self.span_level, key, lock_id, operation, timeout)
    }
}

/// Records the outcome on the span.
fn finish(span: &Span, result: &Result<bool, &TransactionLockError>) {
    match result {
        Ok(acquired) => {
            span.record("lock.acquired", *acquired);
        }
        Err(error) => {
            span.record("lock.acquired", false);
            let code = error.source_error().and_then(sqlstate);
            record_failure(span, error.kind(), code);
        }
    }
}

/// `lock_timeout` in milliseconds for `timeout`: rounded up, saturating at `INT_MAX`;
/// `None` for a zero timeout (which `lock_timeout` would read as "no timeout").
fn lock_timeout_ms(timeout: Duration) -> Option<u128> {
    if timeout.is_zero() {
        return None;
    }
    let ms = timeout.as_nanos().div_ceil(1_000_000);
    Some(ms.clamp(1, MAX_LOCK_TIMEOUT_MS))
}

async fn try_once(
    tx: &Transaction<'_>,
    lock_id: i64,
    mode: LockMode,
) -> Result<Attempt, tokio_postgres::Error> {
    let sql = format!("SELECT {}({lock_id})", try_function(mode));
    let messages = tx.simple_query(&sql).await?;
    let granted = first_row(&messages).and_then(|row| row.get(0)) == Some("t");
    Ok(if granted {
        Attempt::Granted
    } else {
        Attempt::Busy
    })
}

/// The waiting lock in a savepoint, under our own `lock_timeout` and no `statement_timeout`,
/// then the settings restored and the savepoint released: one simple query, so once sent the
/// server finishes it whatever happens to the future. A failed wait skips the rest of the
/// query; the savepoint is then rolled back to (a second query), which undoes the settings.
///
/// The caller's settings are kept in two placeholder settings (`locks_xact.*`, local to the
/// transaction) set before the savepoint, because releasing a savepoint keeps the
/// `set_config(…, true)` made inside it. They are changed in a statement of their own before
/// the lock's: since PostgreSQL 13 each statement of a simple query gets its own
/// `statement_timeout`, so the lock's statement runs without one.
async fn wait(
    tx: &Transaction<'_>,
    lock_id: i64,
    mode: LockMode,
    lock_timeout_ms: u128,
) -> Result<(), tokio_postgres::Error> {
    let sql = format!(
        "SELECT set_config('{SAVED_LOCK_TIMEOUT}', current_setting('lock_timeout'), true), \
                set_config('{SAVED_STATEMENT_TIMEOUT}', current_setting('statement_timeout'), true); \
         SAVEPOINT {SAVEPOINT}; \
         SELECT set_config('lock_timeout', '{lock_timeout_ms}ms', true), \
                set_config('statement_timeout', '0', true); \
         SELECT {}({lock_id}); \
         SELECT set_config('lock_timeout', current_setting('{SAVED_LOCK_TIMEOUT}'), true), \
                set_config('statement_timeout', current_setting('{SAVED_STATEMENT_TIMEOUT}'), true); \
         RELEASE SAVEPOINT {SAVEPOINT}",
        wait_function(mode)
    );
    match tx.batch_execute(&sql).await {
        Ok(()) => Ok(()),
        Err(error) => {
            if error.code() != Some(&SqlState::IN_FAILED_SQL_TRANSACTION) && !error.is_closed() {
                // Undoes the settings with the savepoint; the transaction goes on as before.
                // If that fails the transaction is not usable, and that is what to report.
                tx.batch_execute(&format!(
                    "ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}"
                ))
                .await?;
            }
            Err(error)
        }
    }
}

/// The first data row of a simple query's answer.
fn first_row(messages: &[SimpleQueryMessage]) -> Option<&tokio_postgres::SimpleQueryRow> {
    messages.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    })
}

/// The empty key, refused as the managers refuse it.
fn refuse_empty(key: &str) -> Result<(), TransactionLockError> {
    match locks_port::check_key(key) {
        Ok(()) => Ok(()),
        Err(_) => Err(TransactionLockError::InvalidKey {
            key: key.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_round_up_to_milliseconds_and_saturate() {
        assert_eq!(lock_timeout_ms(Duration::ZERO), None);
        assert_eq!(lock_timeout_ms(Duration::from_nanos(1)), Some(1));
        assert_eq!(lock_timeout_ms(Duration::from_micros(1500)), Some(2));
        assert_eq!(lock_timeout_ms(Duration::from_secs(5)), Some(5000));
        assert_eq!(lock_timeout_ms(Duration::MAX), Some(MAX_LOCK_TIMEOUT_MS));
    }

    #[test]
    fn batched_statements_never_wait_forever_and_saturate() {
        let shared = |timeout| TransactionLocks::statements(7, LockMode::Shared, Some(timeout));
        assert_eq!(
            shared(Duration::ZERO),
            "SELECT set_config('lock_timeout', '1ms', true); \
             SELECT pg_advisory_xact_lock_shared(7); "
        );
        assert_eq!(
            shared(Duration::MAX),
            "SELECT set_config('lock_timeout', '2147483647ms', true); \
             SELECT pg_advisory_xact_lock_shared(7); "
        );
        assert_eq!(
            TransactionLocks::statements(-3, LockMode::Exclusive, None),
            "SELECT pg_advisory_xact_lock(-3); "
        );
    }
}
