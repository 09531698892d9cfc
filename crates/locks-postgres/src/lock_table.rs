//! The server's lock table: how full it is, and whether an error is its refusal.
//!
//! Advisory locks live in PostgreSQL's shared lock table, which is finite and shared by
//! every session and database of the server: about `max_locks_per_transaction ×
//! (max_connections + max_prepared_transactions)` entries. Advisory locks never take the
//! per-backend fast path, so each one held (or waited for) takes an entry until released.
//! When the table is full the server refuses *every* new lock that needs an entry, its own
//! queries' included, with "out of shared memory" (SQLSTATE 53200) and the hint to raise
//! `max_locks_per_transaction`.

use std::error::Error as _;

use locks_port::LockAcquisitionError;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::errors::describe;
use crate::inner::Inner;
use crate::inspect::InspectError;

/// How full the server's lock table is, from `pg_locks` and the server's settings.
///
/// ```
/// let usage = locks_postgres::LockTableUsage::new(4_800, 5_000, 6_400);
/// assert_eq!(usage.fraction(), 0.75);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockTableUsage {
    /// Advisory lock entries, held or waited for, by every session of the server (all
    /// databases: the table is shared).
    pub advisory: u64,
    /// Every entry outside the fast path (advisory locks and the rest), held or waited for.
    pub entries: u64,
    /// `max_locks_per_transaction × (max_connections + max_prepared_transactions)`: the
    /// capacity the server documents. The table takes a little more in practice (spare
    /// shared memory, the background processes' slots), so a refusal comes at or past it.
    pub capacity: u64,
}

impl LockTableUsage {
    /// A usage from its figures (for tests and dashboards).
    #[must_use]
    pub fn new(advisory: u64, entries: u64, capacity: u64) -> Self {
        Self {
            advisory,
            entries,
            capacity,
        }
    }

    /// `advisory / capacity`: 1.0 or more means new locks may be refused any moment.
    /// 0.0 for a capacity of 0 (which no server reports).
    #[must_use]
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    pub fn fraction(&self) -> f64 {
        if self.capacity == 0 {
            return 0.0;
        }
        self.advisory as f64 / self.capacity as f64
    }
}

/// [`PostgresLockManager::lock_table_usage`]: on a pooled connection, with the gauges
/// recorded.
pub(crate) async fn recorded_usage(inner: &Inner) -> Result<LockTableUsage, InspectError> {
    let client = crate::inspect::connection_for_read(inner).await?;
    let usage = lock_table_usage(&client).await?;
    inner.metrics().lock_table(usage.advisory, usage.capacity);
    Ok(usage)
}

/// [`PostgresLockManager::lock_table_usage`](crate::PostgresLockManager::lock_table_usage) without a manager, on `client`'s server.
///
/// # Errors
/// [`InspectError::Query`] when the server refuses.
pub async fn lock_table_usage(client: &Client) -> Result<LockTableUsage, InspectError> {
    let sql = "SELECT count(*) FILTER (WHERE locktype = 'advisory'), \
                      count(*) FILTER (WHERE NOT fastpath), \
                      current_setting('max_locks_per_transaction')::int8 \
                        * (current_setting('max_connections')::int8 \
                           + current_setting('max_prepared_transactions')::int8) \
               FROM pg_locks";
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|source| InspectError::Query {
            reason: describe(&source),
            source,
        })?;
    let unexpected = |what: &str| InspectError::UnexpectedAnswer {
        reason: format!("the lock table query gave an unreadable {what}"),
    };
    let row = messages
        .iter()
        .find_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .ok_or_else(|| unexpected("answer (no row)"))?;
    let number = |index: usize, what: &str| -> Result<u64, InspectError> {
        row.get(index)
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| unexpected(what))
    };
    Ok(LockTableUsage {
        advisory: number(0, "advisory count")?,
        entries: number(1, "entry count")?,
        capacity: number(2, "capacity")?,
    })
}

/// Whether `error` is the server refusing a lock because its lock table is full ("out of
/// shared memory", SQLSTATE 53200, hint: raise `max_locks_per_transaction`): by the
/// SQLSTATE of the driver error in its source chain. The error's kind is
/// [`Backend`](locks_port::AcquisitionErrorKind::Backend) and its reason the server's
/// message and hint. Nothing is wedged: the session stays usable and the lock can be
/// taken again once others release theirs.
#[must_use]
pub fn is_lock_table_full(error: &LockAcquisitionError) -> bool {
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(driver) = cause.downcast_ref::<tokio_postgres::Error>() {
            return driver.code() == Some(&SqlState::OUT_OF_MEMORY);
        }
        source = cause.source();
    }
    false
}
