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
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// A gauge's reads stay at most this share of the time: after a read that took `t`, the
/// next one comes no sooner than `t ×` this.
const READS_PER_TIME: u32 = 100;

/// [`lock_table_usage`](crate::PostgresLockManager::lock_table_usage) for a gauge polled
/// on a schedule (a metrics callback, a health endpoint), with its cost bounded: it asks
/// the server at most once per `every` given to
/// [`lock_table_gauge`](crate::PostgresLockManager::lock_table_gauge), and at most once per
/// 100 times its last read's duration, and answers every other call with the last
/// reading. The read copies the server's whole lock table (`pg_locks`), under every lock
/// partition's lock, and grows with the locks held (see `docs/capacity.md`), so the bound
/// keeps its share of the server's time at 1 % or less whoever polls it how often. Calls
/// at once share one read. Clones share the reading.
///
/// ```no_run
/// # async fn run(locks: locks_postgres::PostgresLockManager) -> Result<(), Box<dyn std::error::Error>> {
/// let gauge = locks.lock_table_gauge(std::time::Duration::from_secs(15));
/// // However often this runs, the server is asked at most every 15 s.
/// let usage = gauge.usage().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockTableGauge {
    inner: Arc<Inner>,
    every: Duration,
    last: Arc<tokio::sync::Mutex<Option<Reading>>>,
}

/// One read of the gauge: when it finished, how long it took, what it said.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    took: Duration,
    usage: LockTableUsage,
}

impl LockTableGauge {
    pub(crate) fn new(inner: Arc<Inner>, every: Duration) -> Self {
        Self {
            inner,
            every,
            last: Arc::default(),
        }
    }

    /// The lock table's usage: the last reading while it is younger than the bound, else
    /// a new read (which records the `eventsource.server.lock_table.*` gauges).
    ///
    /// # Errors
    /// As [`lock_table_usage`](crate::PostgresLockManager::lock_table_usage); a failed
    /// read keeps the last reading for the next call's comparison.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; a call dropped mid-read leaves the last reading.
    pub async fn usage(&self) -> Result<LockTableUsage, InspectError> {
        let mut last = self.last.lock().await;
        if let Some(reading) = *last
            && reading.at.elapsed() < self.every.max(reading.took.saturating_mul(READS_PER_TIME))
        {
            return Ok(reading.usage);
        }
        let started = Instant::now();
        let usage = recorded_usage(&self.inner).await?;
        *last = Some(Reading {
            at: Instant::now(),
            took: started.elapsed(),
            usage,
        });
        Ok(usage)
    }
}

impl fmt::Debug for LockTableGauge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockTableGauge")
            .field("every", &self.every)
            .finish_non_exhaustive()
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
/// Its cost grows with every lock held on the server: `pg_locks` copies the whole lock
/// table, holding up other sessions' lock requests meanwhile (`docs/capacity.md`, "What
/// each observation read costs").
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
