//! The fleet-wide write pause: shared and exclusive transaction-scoped advisory locks on
//! the tenant's write key, in every database that holds a store.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::{Future, ready};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use locks_port::uuid::Uuid;
use locks_port::{LockMode, lock_id, migration_lock_key};
use locks_postgres::TransactionLocks;
use migration_cutover::{PauseGuard, RepositoryError, Stores, WritePause, WritesPaused};
use tokio_postgres::error::SqlState;

use migration_cutover::RoutingRepository;

use crate::db::{DbFailure, Transaction, setting_ms};
use crate::{PostgresEventStore, PostgresRoutingRepository};

/// The operation of the tenant's write key: `write:{tenant uuid}`.
pub const WRITE_LOCK_OPERATION: &str = "write";

/// The advisory-lock id of the tenant's write key `write:{tenant uuid}`, derived with
/// [`locks_port::lock_id`] (bit-exact with the Python library's derivation), so any
/// process of the fleet, in any language, contends on the same server lock.
///
/// ```
/// use migration_cutover_postgres::write_lock_id;
/// use migration_cutover_postgres::migration_cutover::uuid::Uuid;
///
/// let tenant = Uuid::nil();
/// assert_eq!(
///     write_lock_id(tenant),
///     locks_port::lock_id("write:00000000-0000-0000-0000-000000000000"),
/// );
/// ```
#[must_use]
pub fn write_lock_id(tenant_id: Uuid) -> i64 {
    lock_id(&migration_lock_key(tenant_id, Some(WRITE_LOCK_OPERATION)))
}

/// One pause as this process saw it (wall-clock times, comparable across processes of
/// one machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseRecord {
    /// The paused tenant.
    pub tenant_id: Uuid,
    /// When the exclusive lock was asked for (writers queue behind it from here on).
    pub requested_at: SystemTime,
    /// When it was granted in every database (every earlier write had finished).
    pub acquired_at: SystemTime,
    /// When it was released.
    pub released_at: SystemTime,
}

/// How many pause records [`PostgresWritePause::history`] keeps.
const HISTORY: usize = 64;

/// A [`WritePause`] for a whole fleet, with no process telling another anything.
///
/// Every write of a tenant (through [`PostgresWriteRouter`](crate::PostgresWriteRouter))
/// takes the *shared* transaction-scoped advisory lock on the tenant's write key
/// ([`write_lock_id`]) inside the transaction that appends, in the store's own database
/// (and, in `dual_write`, in the target's database before the source commits, held until
/// the mirror is committed); writers do not exclude each other.
/// [`pause`](WritePause::pause) takes the *exclusive* one in the databases of the tenant's
/// routed store and migration target, in that order (the writers' order, so they cannot
/// deadlock), each in a transaction it keeps open, so:
///
/// - the pause is granted only once every write under way, its mirror included, has
///   committed or rolled back ([`drained`](PauseGuard::drained) has nothing left to wait
///   for, and the lag it measures has no mirror in flight);
/// - from the moment it is asked for, new writes in every process queue behind it on the
///   server (PostgreSQL grants a lock only when it conflicts with no earlier waiter);
/// - they resume the moment the guard commits (or its connection closes: a crashed
///   cutover frees the writers with its session).
///
/// Waits are bounded on the server: the pause waits at most
/// [`acquire_timeout`](Self::with_acquire_timeout) for writes under way (`lock_timeout`,
/// then [`RepositoryError`]: the coordinator rolls back), writers at most their own
/// timeout; a pause that sits idle longer than its [max hold](Self::with_max_hold) is
/// ended by the server. Databases are told apart by `current_database()`, the server's address and
/// port and its start time, so two stores in one database are locked once.
///
/// [`admit`](WritePause::admit) (for the generic `migration_cutover::WriteRouter`) takes
/// the shared lock in every database and holds it in the permit; dropping the permit
/// closes those connections. Prefer [`PostgresWriteRouter`](crate::PostgresWriteRouter),
/// which takes it in the append's own transaction.
#[derive(Clone)]
pub struct PostgresWritePause {
    inner: Arc<Inner>,
}

struct Inner {
    stores: Stores<PostgresEventStore>,
    routing: PostgresRoutingRepository,
    acquire_timeout: Duration,
    max_hold: Duration,
    paused: Mutex<HashMap<Uuid, usize>>,
    history: Mutex<VecDeque<PauseRecord>>,
}

impl fmt::Debug for PostgresWritePause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresWritePause")
            .field("stores", &self.inner.stores)
            .field("acquire_timeout", &self.inner.acquire_timeout)
            .field("max_hold", &self.inner.max_hold)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Copies a store registry (the stores are cheap handles).
pub(crate) fn copy_stores(stores: &Stores<PostgresEventStore>) -> Stores<PostgresEventStore> {
    let mut copy = Stores::new();
    for id in stores.ids() {
        if let Some(store) = stores.get(id.as_str()) {
            copy.insert(id.clone(), PostgresEventStore::clone(store));
        }
    }
    copy
}

/// The statements that bound the transaction's lock waits by `timeout` and take the
/// tenant's write lock in `mode`: the adapter's transaction-lock statements, so the
/// fleet's write lock is the lock a `TransactionLocks` or a session lock on
/// `write:{tenant uuid}` contends on.
pub(crate) fn write_lock_statement(tenant_id: Uuid, mode: LockMode, timeout: Duration) -> String {
    TransactionLocks::statements(write_lock_id(tenant_id), mode, Some(timeout))
}

impl PostgresWritePause {
    /// How long a pause waits by default for the writes under way: 250 ms.
    pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_millis(250);

    /// How long a pause may sit idle on the server by default before the server ends
    /// it: 2 s (four default pause budgets).
    pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(2);

    /// A pause over `stores` (every store of the fleet, as registered in the ports),
    /// locking the databases of a tenant's routed store and migration target as
    /// `routing` says. Does no I/O.
    #[must_use]
    pub fn new(stores: &Stores<PostgresEventStore>, routing: &PostgresRoutingRepository) -> Self {
        Self::build(
            copy_stores(stores),
            routing.clone(),
            Self::DEFAULT_ACQUIRE_TIMEOUT,
            Self::DEFAULT_MAX_HOLD,
        )
    }

    fn build(
        stores: Stores<PostgresEventStore>,
        routing: PostgresRoutingRepository,
        acquire_timeout: Duration,
        max_hold: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                stores,
                routing,
                acquire_timeout,
                max_hold,
                paused: Mutex::new(HashMap::new()),
                history: Mutex::new(VecDeque::new()),
            }),
        }
    }

    /// The same pause waiting at most `timeout` for the writes under way (at least
    /// 1 ms; saturates at `i32::MAX` ms). Writers wait this long plus the pause
    /// budget at most, so keep it small.
    #[must_use]
    pub fn with_acquire_timeout(self, timeout: Duration) -> Self {
        Self::build(
            copy_stores(&self.inner.stores),
            self.inner.routing.clone(),
            timeout,
            self.inner.max_hold,
        )
    }

    /// The same pause, ended by the server once it has sat idle for `max_hold` (at least
    /// 1 ms; saturates at `i32::MAX` ms): each pause transaction sets
    /// `idle_in_transaction_session_timeout` for itself. A coordinator that dies frees
    /// the writers with its sockets at once; this bounds the pause of one that stops
    /// without closing them (frozen, or its host gone: the server would otherwise wait
    /// for TCP keepalives, hours by default). Keep it above twice the coordinator's pause
    /// budget (the paused window plus its rollback).
    ///
    /// **Nothing checks this**: the pause does not know the coordinator's budget (it is
    /// in the `MigrationConfig`, given elsewhere), and the server cannot tell a frozen
    /// coordinator from a live one in a long paused window. With a max hold below the
    /// paused window, the server ends a *live* cutover's pause: its writers go on at once,
    /// the first of them rolls the `cutover_paused` route back, the cutover's flip
    /// compare-and-set then fails and it rolls back (it completes only if its flip landed
    /// first). No write is lost or doubled, but such a cutover fails whenever a writer
    /// reaches the route before its flip, and so can every retry whose paused window
    /// outlasts the max hold. A max hold of at least twice the budget does not end a
    /// live cutover's pause early.
    #[must_use]
    pub fn with_max_hold(self, max_hold: Duration) -> Self {
        Self::build(
            copy_stores(&self.inner.stores),
            self.inner.routing.clone(),
            self.inner.acquire_timeout,
            max_hold,
        )
    }

    /// How long a pause may sit idle on the server before the server ends it.
    #[must_use]
    pub fn max_hold(&self) -> Duration {
        self.inner.max_hold
    }

    /// How long a pause waits for the writes under way.
    #[must_use]
    pub fn acquire_timeout(&self) -> Duration {
        self.inner.acquire_timeout
    }

    /// The last pauses this process took and released, oldest first (at most 64).
    #[must_use]
    pub fn history(&self) -> Vec<PauseRecord> {
        lock(&self.inner.history).iter().copied().collect()
    }

    /// The stores whose databases a pause of the tenant locks, in the order writers
    /// lock them (the routed store, then the migration's target), one per database.
    async fn databases(&self, tenant_id: Uuid) -> Result<Vec<PostgresEventStore>, DbFailure> {
        const WHAT: &str = "find the tenant's databases";
        let route = self
            .inner
            .routing
            .get(tenant_id)
            .await
            .map_err(|error| DbFailure::refused(WHAT, error.to_string()))?
            .ok_or_else(|| DbFailure::refused(WHAT, format!("tenant {tenant_id} has no route")))?;
        let mut stores: Vec<PostgresEventStore> = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for id in std::iter::once(&route.store_id).chain(route.target_store_id.as_ref()) {
            let store = self.inner.stores.get(id.as_str()).ok_or_else(|| {
                DbFailure::refused(WHAT, format!("store `{id}` is not registered"))
            })?;
            let identity = store.identity().await?.to_owned();
            if !seen.contains(&identity) {
                seen.push(identity);
                stores.push(PostgresEventStore::clone(store));
            }
        }
        Ok(stores)
    }

    /// One open transaction per database of the tenant, in writers' order, each holding
    /// `mode`'s lock on the tenant's write key.
    async fn lock_all(
        &self,
        tenant_id: Uuid,
        mode: LockMode,
        timeout: Duration,
    ) -> Result<Vec<Transaction>, DbFailure> {
        let started = Instant::now();
        let mut locked = Vec::new();
        for store in self.databases(tenant_id).await? {
            let remaining = timeout.saturating_sub(started.elapsed());
            let mut setup = write_lock_statement(tenant_id, mode, remaining);
            if mode == LockMode::Exclusive {
                setup.push_str(&format!(
                    "SELECT set_config('idle_in_transaction_session_timeout', '{}', true);",
                    setting_ms(self.inner.max_hold)
                ));
            }
            locked.push(Transaction::begin(store.pool(), "write pause", &setup).await?);
        }
        Ok(locked)
    }

    fn count(&self, tenant_id: Uuid, delta: isize) {
        let mut paused = lock(&self.inner.paused);
        let count = paused.entry(tenant_id).or_default();
        *count = count.saturating_add_signed(delta);
        if *count == 0 {
            paused.remove(&tenant_id);
        }
    }
}

impl WritePause for PostgresWritePause {
    type Permit = PostgresWritePermit;
    type Guard = PostgresPauseGuard;

    /// Takes the exclusive lock in every database.
    ///
    /// # Cancel safety
    /// Dropping the future closes the connections it opened (cancelling a lock wait
    /// first), so no lock outlives it.
    fn pause(
        &self,
        tenant_id: Uuid,
    ) -> impl Future<Output = Result<Self::Guard, RepositoryError>> + Send {
        let pause = self.clone();
        async move {
            let requested_at = SystemTime::now();
            let timeout = pause.inner.acquire_timeout;
            let transactions = pause
                .lock_all(tenant_id, LockMode::Exclusive, timeout)
                .await
                .map_err(|failure| {
                    let what = if failure.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                        "pausing writes (writes under way did not finish in time)"
                    } else {
                        "pausing writes"
                    };
                    RepositoryError::new(what, failure.unnamed())
                })?;
            pause.count(tenant_id, 1);
            Ok(PostgresPauseGuard {
                pause,
                tenant_id,
                transactions,
                requested_at,
                acquired_at: SystemTime::now(),
            })
        }
    }

    fn admit(
        &self,
        tenant_id: Uuid,
        timeout: Duration,
    ) -> impl Future<Output = Result<Self::Permit, WritesPaused>> + Send {
        let pause = self.clone();
        async move {
            let started = Instant::now();
            match pause.lock_all(tenant_id, LockMode::Shared, timeout).await {
                Ok(transactions) => Ok(PostgresWritePermit {
                    _transactions: transactions,
                }),
                // Any failure counts as "not admitted within the timeout": the port's
                // admit has no other error, and the write is not made.
                Err(failure) => {
                    tracing::debug!(tenant_id = %tenant_id, error = %failure, "write not admitted");
                    Err(WritesPaused {
                        tenant_id,
                        waited: started.elapsed(),
                    })
                }
            }
        }
    }

    /// Whether this process holds a pause of the tenant now (pauses of other processes
    /// are not known here; their writers just wait on the server).
    fn is_paused(&self, tenant_id: Uuid) -> bool {
        lock(&self.inner.paused).contains_key(&tenant_id)
    }
}

/// A write admitted by [`PostgresWritePause::admit`]: the shared lock in every database,
/// held until it is dropped (which closes those connections).
#[must_use = "the write counts as running only while the permit is held"]
pub struct PostgresWritePermit {
    _transactions: Vec<Transaction>,
}

impl fmt::Debug for PostgresWritePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresWritePermit")
            .finish_non_exhaustive()
    }
}

/// A pause in force: the exclusive lock on the tenant's write key in every database.
///
/// [`resume`](PauseGuard::resume) commits the transactions (writers go on at once);
/// dropping the guard without it closes their connections, which frees the locks as
/// soon as the server sees the sockets close.
#[must_use = "dropping the guard resumes writes"]
pub struct PostgresPauseGuard {
    pause: PostgresWritePause,
    tenant_id: Uuid,
    transactions: Vec<Transaction>,
    requested_at: SystemTime,
    acquired_at: SystemTime,
}

impl fmt::Debug for PostgresPauseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresPauseGuard")
            .field("tenant_id", &self.tenant_id)
            .field("databases", &self.transactions.len())
            .finish_non_exhaustive()
    }
}

impl Drop for PostgresPauseGuard {
    fn drop(&mut self) {
        // Closes any connection not committed by `resume`.
        self.transactions.clear();
        self.pause.count(self.tenant_id, -1);
        let mut history = lock(&self.pause.inner.history);
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(PauseRecord {
            tenant_id: self.tenant_id,
            requested_at: self.requested_at,
            acquired_at: self.acquired_at,
            released_at: SystemTime::now(),
        });
    }
}

impl PauseGuard for PostgresPauseGuard {
    fn tenant_id(&self) -> Uuid {
        self.tenant_id
    }

    /// Ready at once: the exclusive lock was granted only after every write holding
    /// the shared one had finished.
    fn drained(&self) -> impl Future<Output = ()> + Send {
        ready(())
    }

    fn resume(mut self) -> impl Future<Output = ()> + Send {
        let transactions = std::mem::take(&mut self.transactions);
        async move {
            for transaction in transactions {
                if let Err(error) = transaction.commit("resume writes").await {
                    // The connection is closed by the failed commit's drop: the lock
                    // goes with it.
                    tracing::warn!(tenant_id = %self.tenant_id, error = %error, "resuming writes failed; connection closed");
                }
            }
            drop(self);
        }
    }
}
