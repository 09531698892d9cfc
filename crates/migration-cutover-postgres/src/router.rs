//! The write path of a fleet instance: appends that take the shared write lock in their
//! own transaction and follow the shared routing state.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use locks_port::uuid::Uuid;
use migration_cutover::{
    Event, EventStore, MigrationConfig, RepositoryError, RoutingRepository, RoutingState,
    StoreError, StoreFailure, StoreId, StoredEvent, Stores, TenantRoute, WriteError, WritesPaused,
};
use tokio_postgres::error::SqlState;
use tracing::{debug, warn};

use crate::db::{Transaction, commit_failure, setting_ms};
use crate::pause::{copy_stores, write_lock_statement};
use crate::{PostgresEventStore, PostgresMigrationPorts, PostgresRoutingRepository};
use locks_port::LockMode;

/// How often a write looks again at a route that says `cutover_paused` while no pause
/// holds it back (a cutover that died between pausing and resolving the route).
const PAUSED_ROUTE_POLL: Duration = Duration::from_millis(10);

/// How long a dual write waits for the target's database (or, in one database, for the
/// target's append lock) before it leaves the mirror to the next catch-up (it holds the
/// source's transaction meanwhile).
const MIRROR_OPEN_TIMEOUT: Duration = Duration::from_secs(1);

/// Where one write went, and how long it waited for the write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresWriteReceipt {
    /// The store that took the write (the tenant's store of record).
    pub store_id: StoreId,
    /// The head of the tenant's stream there after the write.
    pub position: u64,
    /// The store the write was mirrored to in `dual_write`, when mirroring worked.
    pub mirrored_to: Option<StoreId>,
    /// How long the write waited for the shared write lock, over all its attempts (a
    /// pause in force shows here; a write that waited out a cutover then goes again to
    /// the new store).
    pub lock_wait: Duration,
    /// When the write first asked for the lock (wall clock).
    pub lock_requested_at: SystemTime,
    /// When the lock was granted to the attempt that wrote (wall clock).
    pub admitted_at: SystemTime,
}

/// Appends a tenant's events where the fleet's shared routing table says, like
/// `migration_cutover::WriteRouter`, with the pause on the server:
///
/// 1. read the route, pick the routed store;
/// 2. in one transaction on that store's database: `set_config('lock_timeout', …,
///    true)` with the write's remaining timeout, `pg_advisory_xact_lock_shared` on the
///    tenant's write key ([`write_lock_id`](crate::write_lock_id)), the store's append lock;
/// 3. read the route again, in a statement that starts after the lock was granted (a
///    statement's snapshot is taken when it starts, so the route must not be read in the
///    locking statement), inside the same transaction when the routing table is in the
///    store's database: if a cutover moved the tenant meanwhile, roll back and start
///    over on the new store; if it says `cutover_paused` on the source, the cutover that
///    wrote it is gone (a live one holds the pause, which excludes this lock): roll the
///    route back to `dual_write` by compare-and-set and write; `cutover_paused` on the
///    target (never written by this crate): roll back and wait;
/// 4. append and commit (which releases the shared lock);
/// 5. in `dual_write`, before the source commits, take the shared lock in the target's
///    database too (or, in one database, mirror inside the same transaction), then mirror
///    the events at their position (copying a gap first); a failed mirror is logged, the
///    next catch-up copies it. So a granted pause never has a mirror in flight, and the
///    lag it measures is the real one.
///
/// So no write is accepted by the source once the cutover flipped the route: a write
/// that held the shared lock before the pause finished before the pause was granted
/// (and is copied by the final sync); one that got it after sees the flipped route.
#[derive(Clone)]
pub struct PostgresWriteRouter {
    stores: Arc<Stores<PostgresEventStore>>,
    routing: PostgresRoutingRepository,
    timeout: Duration,
    write_lock: bool,
}

impl fmt::Debug for PostgresWriteRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresWriteRouter")
            .field("stores", &self.stores)
            .field("timeout", &self.timeout)
            .field("write_lock", &self.write_lock)
            .finish_non_exhaustive()
    }
}

/// The store's failure as the write's: [`WriteError::CommitUncertain`] when the answer to
/// the commit was lost, [`WriteError::Store`] otherwise.
fn fail(store_id: &StoreId, error: StoreError) -> WriteError {
    WriteError::from(StoreFailure {
        store_id: store_id.clone(),
        error,
    })
}

impl PostgresWriteRouter {
    /// A router over `ports`' stores and routing table, with the write timeout of
    /// `config`.
    #[must_use]
    pub fn new(ports: &PostgresMigrationPorts, config: &MigrationConfig) -> Self {
        Self {
            stores: Arc::new(copy_stores(ports.stores())),
            routing: ports.routing().clone(),
            timeout: config.write_timeout(),
            write_lock: true,
        }
    }

    /// The same router with another write timeout: how long a write waits out a pause
    /// (sent to the server as `lock_timeout`, so it holds even if this process stalls).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same router **without the shared write lock**: writes are then not held back
    /// by a pause, and a cutover can lose the writes it races (they land on the source
    /// after its final copy). For measuring the lock's cost and for negative tests only.
    #[must_use]
    pub fn without_write_lock(mut self) -> Self {
        self.write_lock = false;
        self
    }

    /// The write timeout.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn route(&self, tenant_id: Uuid) -> Result<TenantRoute, WriteError> {
        self.routing
            .get(tenant_id)
            .await
            .map_err(WriteError::Routing)?
            .ok_or(WriteError::NoRoute { tenant_id })
    }

    fn store(&self, id: &StoreId) -> Result<&PostgresEventStore, WriteError> {
        self.stores
            .get(id.as_str())
            .map(AsRef::as_ref)
            .ok_or_else(|| WriteError::UnknownStore {
                store_id: id.clone(),
            })
    }

    /// Appends `events` to the tenant's stream (see the type's documentation), waiting
    /// out a pause for up to the router's timeout.
    ///
    /// # Errors
    /// [`WriteError::Paused`] when the pause outlasted the timeout (the server's
    /// `lock_timeout` fired). [`WriteError::CommitUncertain`] when the connection broke
    /// after the `COMMIT` was sent and before its answer came: the write may or may not
    /// have been made; call `append` again with the **same events** (the same ids) until
    /// it answers with a receipt: events that are stored already are not appended again
    /// (the store answers with their position), so they land exactly once, even if the
    /// tenant was cut over in between (the copy keeps event ids). Otherwise the routing
    /// or store failure, and nothing was written to the store of record.
    ///
    /// # Cancel safety
    /// Dropping the future before the commit closes the transaction's connection: the
    /// server rolls the append back and frees the shared lock. Dropped during the commit,
    /// the write may or may not have been made (as [`WriteError::CommitUncertain`]).
    pub async fn append(
        &self,
        tenant_id: Uuid,
        events: &[Event],
    ) -> Result<PostgresWriteReceipt, WriteError> {
        let started = Instant::now();
        let mut lock_wait = Duration::ZERO;
        let mut lock_requested_at = None;
        let paused = |started: Instant| WritesPaused {
            tenant_id,
            waited: started.elapsed(),
        };
        loop {
            let remaining = self.timeout.saturating_sub(started.elapsed());
            let guess = self.route(tenant_id).await?;
            let store = self.store(&guess.store_id)?;
            let setup = self.lock_setup(store, tenant_id, remaining);
            let lock_started = Instant::now();
            lock_requested_at.get_or_insert_with(SystemTime::now);
            let transaction =
                match Transaction::begin(store.pool(), "take the write lock", &setup).await {
                    Ok(transaction) => transaction,
                    Err(failure) if failure.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                        return Err(paused(started).into());
                    }
                    Err(failure) => {
                        return Err(fail(&guess.store_id, StoreError::unavailable(failure)));
                    }
                };
            lock_wait += lock_started.elapsed();
            let admitted_at = SystemTime::now();
            let mut route = self
                .route_after_lock(store, &transaction, tenant_id)
                .await?;
            if let Some(resumed) = route.abandoned_pause_rollback().filter(|_| self.write_lock) {
                match self
                    .roll_back_abandoned_pause(store, &transaction, &route, &resumed)
                    .await
                {
                    Ok(true) => route = resumed,
                    Ok(false) => {
                        transaction.rollback().await;
                        continue;
                    }
                    Err(error) => {
                        transaction.rollback().await;
                        return Err(WriteError::Routing(error));
                    }
                }
            }
            if route.store_id != guess.store_id {
                debug!(tenant_id = %tenant_id, from = %guess.store_id, to = %route.store_id, "route moved while waiting; retrying");
                transaction.rollback().await;
                continue;
            }
            if !route.state.accepts_writes() {
                transaction.rollback().await;
                if started.elapsed() >= self.timeout {
                    return Err(paused(started).into());
                }
                tokio::time::sleep(remaining.min(PAUSED_ROUTE_POLL)).await;
                continue;
            }
            let position = match store.insert_in(&transaction, tenant_id, None, events).await {
                Ok(position) => position,
                Err(error) => {
                    transaction.rollback().await;
                    return Err(fail(&route.store_id, error));
                }
            };
            let start = position.saturating_sub(u64::try_from(events.len()).unwrap_or(u64::MAX));
            let mirror = if route.state == RoutingState::DualWrite {
                let remaining = self.timeout.saturating_sub(started.elapsed());
                self.open_mirror(&route, store, &transaction, start, events, remaining)
                    .await
            } else {
                Mirror::None
            };
            transaction
                .commit("commit the write")
                .await
                .map_err(|failure| fail(&route.store_id, commit_failure(failure)))?;
            let mirrored_to = self
                .finish_mirror(mirror, store, tenant_id, start, events)
                .await;
            return Ok(PostgresWriteReceipt {
                store_id: route.store_id.clone(),
                position,
                mirrored_to,
                lock_wait,
                lock_requested_at: lock_requested_at.unwrap_or(admitted_at),
                admitted_at,
            });
        }
    }

    /// Whether the routing table is in `store`'s database.
    async fn routing_shares_database(&self, store: &PostgresEventStore) -> bool {
        match (store.identity().await, self.routing.identity().await) {
            (Ok(store), Ok(routing)) => store == routing,
            _ => false,
        }
    }

    /// Rolls back a `cutover_paused` route that no live cutover holds to `resumed`
    /// (`dual_write` on the source), by one compare-and-set. The write holds the shared
    /// write lock in the routed store's database, and a live cutover holds the exclusive
    /// one there from before it writes `cutover_paused` until after it has flipped or
    /// rolled back: so the cutover that wrote this route is gone (its session ended and
    /// the server freed its locks). Of two writers doing this at once one wins; the
    /// other looks again. In the routing table's own database the compare-and-set runs
    /// in the write's transaction and commits with the append.
    async fn roll_back_abandoned_pause(
        &self,
        store: &PostgresEventStore,
        transaction: &Transaction,
        route: &TenantRoute,
        resumed: &TenantRoute,
    ) -> Result<bool, RepositoryError> {
        let rolled_back = if self.routing_shares_database(store).await {
            self.routing
                .compare_and_set_in(transaction, route, resumed)
                .await?
        } else {
            self.routing.compare_and_set(route, resumed.clone()).await?
        };
        if rolled_back {
            warn!(
                tenant_id = %route.tenant_id,
                migration_id = ?route.migration_id,
                "rolled back a `cutover_paused` route that no live cutover holds"
            );
        }
        Ok(rolled_back)
    }

    /// The route as it is now that the write lock is held: read inside the write's own
    /// transaction when the routing table is in the store's database (one connection per
    /// write), otherwise on the routing repository's pool.
    async fn route_after_lock(
        &self,
        store: &PostgresEventStore,
        transaction: &Transaction,
        tenant_id: Uuid,
    ) -> Result<TenantRoute, WriteError> {
        if !self.routing_shares_database(store).await {
            return self.route(tenant_id).await;
        }
        self.routing
            .get_in(transaction, tenant_id)
            .await
            .map_err(WriteError::Routing)?
            .ok_or(WriteError::NoRoute { tenant_id })
    }

    /// The statements that open a write's transaction on `store`: the shared write lock
    /// (unless disabled), then the store's append lock.
    fn lock_setup(
        &self,
        store: &PostgresEventStore,
        tenant_id: Uuid,
        remaining: Duration,
    ) -> String {
        let mut setup = String::new();
        if self.write_lock {
            setup = write_lock_statement(tenant_id, LockMode::Shared, remaining);
        }
        setup.push_str(&store.append_lock(tenant_id));
        setup
    }

    /// Starts a dual write's mirror while the source transaction is still open, so the
    /// pause (which locks the source's database, then the target's) finds the mirror
    /// either not started or committed. In one database the mirror runs in the source's
    /// own transaction (behind a savepoint, so a failed mirror does not fail the write);
    /// otherwise a transaction on the target takes the shared lock there first.
    async fn open_mirror(
        &self,
        route: &TenantRoute,
        source: &PostgresEventStore,
        transaction: &Transaction,
        start: u64,
        events: &[Event],
        remaining: Duration,
    ) -> Mirror {
        let tenant_id = route.tenant_id;
        let Some(target_id) = route.target_store_id.clone() else {
            warn!(tenant_id = %tenant_id, "dual_write without a target store; not mirrored");
            return Mirror::None;
        };
        let Ok(target) = self.store(&target_id) else {
            warn!(tenant_id = %tenant_id, target = %target_id, "dual_write to an unregistered store; not mirrored");
            return Mirror::None;
        };
        let same_database = match (source.identity().await, target.identity().await) {
            (Ok(source), Ok(target)) => source == target,
            _ => false,
        };
        let wait = remaining.min(MIRROR_OPEN_TIMEOUT);
        if same_database {
            // The target's append lock waits at most the mirror wait, as a mirror on
            // another database does (`SET LOCAL` is undone with the savepoint, and kept
            // after its release only for the commit, which waits for no lock).
            let savepoint = format!(
                "SAVEPOINT mirror; SET LOCAL lock_timeout = '{}ms'; {}",
                setting_ms(wait),
                target.append_lock(tenant_id)
            );
            let mirrored = match transaction.statements("open the mirror", &savepoint).await {
                Ok(()) => mirror_in(transaction, source, target, tenant_id, start, events).await,
                Err(failure) => Err(StoreError::unavailable(failure)),
            };
            let end = if mirrored.is_ok() {
                "RELEASE SAVEPOINT mirror"
            } else {
                "ROLLBACK TO SAVEPOINT mirror"
            };
            // If even this fails, the commit that follows fails and reports it.
            let _ = transaction.statements("close the mirror", end).await;
            return match mirrored {
                Ok(()) => Mirror::Done(target_id),
                Err(error) => {
                    warn!(tenant_id = %tenant_id, target = %target_id, error = %error, "mirroring a dual write failed; the next catch-up copies it");
                    Mirror::None
                }
            };
        }
        let setup = self.lock_setup(target, tenant_id, remaining);
        // The source's transaction (and its shared lock) stays open meanwhile: a target
        // that does not answer is not waited for long (dropping the attempt closes it).
        let open = Transaction::begin(target.pool(), "open the mirror", &setup);
        match tokio::time::timeout(wait, open).await {
            Ok(Ok(mirror)) => Mirror::Open(target_id, Box::new(mirror)),
            Ok(Err(failure)) => {
                warn!(tenant_id = %tenant_id, target = %target_id, error = %failure, "mirroring a dual write failed; the next catch-up copies it");
                Mirror::None
            }
            Err(_) => {
                warn!(tenant_id = %tenant_id, target = %target_id, "the target did not open the mirror in time; the next catch-up copies it");
                Mirror::None
            }
        }
    }

    /// Completes a mirror opened on another database, after the source committed.
    async fn finish_mirror(
        &self,
        mirror: Mirror,
        source: &PostgresEventStore,
        tenant_id: Uuid,
        start: u64,
        events: &[Event],
    ) -> Option<StoreId> {
        let (target_id, transaction) = match mirror {
            Mirror::None => return None,
            Mirror::Done(target_id) => return Some(target_id),
            Mirror::Open(target_id, transaction) => (target_id, *transaction),
        };
        let target = self.store(&target_id).ok()?;
        let result = match mirror_in(&transaction, source, target, tenant_id, start, events).await {
            Ok(()) => transaction
                .commit("commit the mirror")
                .await
                .map_err(StoreError::unavailable),
            Err(error) => {
                transaction.rollback().await;
                Err(error)
            }
        };
        match result {
            Ok(()) => Some(target_id),
            Err(error) => {
                warn!(tenant_id = %tenant_id, target = %target_id, error = %error, "mirroring a dual write failed; the next catch-up copies it");
                None
            }
        }
    }

    /// Up to `limit` of the tenant's events after `after`, from its routed store.
    ///
    /// # Errors
    /// The routing or store failure.
    pub async fn read(
        &self,
        tenant_id: Uuid,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, WriteError> {
        let route = self.route(tenant_id).await?;
        self.store(&route.store_id)?
            .read(tenant_id, after, limit)
            .await
            .map_err(|error| fail(&route.store_id, error))
    }
}

/// A dual write's mirror, between the source's append and its commit.
enum Mirror {
    /// No mirror (not `dual_write`, or it could not be started; logged).
    None,
    /// Done inside the source's transaction (one database).
    Done(StoreId),
    /// A transaction on the target's database holding the shared lock there.
    Open(StoreId, Box<Transaction>),
}

/// Appends `events`, which start after position `start` in the source, to the target
/// inside `transaction` (which holds the target's append lock): directly when the
/// target's head is `start`; after copying the gap from the source when it is behind;
/// only the missing tail when a copier got part of the way already.
async fn mirror_in(
    transaction: &Transaction,
    source: &PostgresEventStore,
    target: &PostgresEventStore,
    tenant_id: Uuid,
    start: u64,
    events: &[Event],
) -> Result<(), StoreError> {
    let actual = match target
        .insert_in(transaction, tenant_id, Some(start), events)
        .await
    {
        Ok(_) => return Ok(()),
        Err(StoreError::Conflict { actual, .. }) => actual,
        Err(error) => return Err(error),
    };
    if actual >= start {
        let skip = usize::try_from(actual - start).unwrap_or(usize::MAX);
        if skip >= events.len() {
            return Ok(());
        }
        return target
            .insert_in(transaction, tenant_id, Some(actual), &events[skip..])
            .await
            .map(|_| ());
    }
    let missing = start - actual;
    let gap = source
        .read(
            tenant_id,
            actual,
            usize::try_from(missing).unwrap_or(usize::MAX),
        )
        .await?;
    if u64::try_from(gap.len()).unwrap_or(u64::MAX) != missing {
        return Err(StoreError::unavailable(format!(
            "the source returned {} of the {missing} events the target misses",
            gap.len()
        )));
    }
    let mut all: Vec<Event> = gap.into_iter().map(|stored| stored.event).collect();
    all.extend_from_slice(events);
    target
        .insert_in(transaction, tenant_id, Some(actual), &all)
        .await
        .map(|_| ())
}
