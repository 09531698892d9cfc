//! The cutover on real PostgreSQL: instances with their own `PostgresLockManager`s (each
//! on its own pool, as separate processes would be) race to cut over one tenant, and a
//! session holding the same advisory lock id outside Rust (as a Python instance would)
//! keeps the cutover out.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_port::{lock_id, migration_lock_key};
use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::{self, NoTls};
use migration_cutover::{
    CutoverOutcome, Event, InMemoryEventStore, InMemoryMigrationRepository,
    InMemoryRoutingRepository, InMemoryWritePause, MigrationConfig, MigrationCoordinator,
    MigrationPorts, Phase, RepositoryError, RoutingRepository, RoutingState, Stores, TenantRoute,
    WriteRouter,
};
use tokio::sync::Barrier;
use uuid::Uuid;

fn database_url() -> String {
    throwaway_pg::database_url().unwrap_or_else(|error| {
        panic!("no PostgreSQL for the tests: set LOCKS_DATABASE_URL or install PostgreSQL: {error}")
    })
}

fn pool() -> Pool {
    locks_postgres::plain_pool(&database_url(), 4).expect("pool")
}

/// How long the paused step of a cutover takes here (well inside the 500 ms budget).
const CUTOVER_WORK: Duration = Duration::from_millis(100);

/// The in-memory routing table, counting how often each instance flips it to `migrated`.
#[derive(Debug, Clone, Default)]
struct CountingRouting {
    inner: InMemoryRoutingRepository,
    migrated_puts: Arc<AtomicUsize>,
    history: Arc<Mutex<Vec<RoutingState>>>,
}

impl RoutingRepository for CountingRouting {
    fn get(
        &self,
        tenant_id: Uuid,
    ) -> impl Future<Output = Result<Option<TenantRoute>, RepositoryError>> + Send {
        self.inner.get(tenant_id)
    }

    fn put(&self, route: TenantRoute) -> impl Future<Output = Result<(), RepositoryError>> + Send {
        if route.state == RoutingState::Migrated {
            self.migrated_puts.fetch_add(1, Ordering::SeqCst);
        }
        self.history.lock().expect("history").push(route.state);
        let inner = self.inner.clone();
        async move {
            if route.state == RoutingState::CutoverPaused {
                // A routing store across the network: the cutover holds the lock long
                // enough for the other instance to arrive while it is held.
                tokio::time::sleep(CUTOVER_WORK).await;
            }
            inner.put(route).await
        }
    }
}

type Ports = MigrationPorts<
    InMemoryEventStore,
    CountingRouting,
    InMemoryWritePause,
    InMemoryMigrationRepository,
>;
type Coordinator = MigrationCoordinator<
    PostgresLockManager,
    InMemoryEventStore,
    CountingRouting,
    InMemoryWritePause,
    InMemoryMigrationRepository,
>;

struct World {
    tenant: Uuid,
    source: InMemoryEventStore,
    target: InMemoryEventStore,
    routing: CountingRouting,
    ports: Ports,
}

impl World {
    async fn new() -> Self {
        let source = InMemoryEventStore::new();
        let target = InMemoryEventStore::new();
        let routing = CountingRouting::default();
        let ports = MigrationPorts::new(
            Stores::new()
                .with_store("shared", source.clone())
                .with_store("dedicated", target.clone()),
            routing.clone(),
            InMemoryWritePause::new(),
            InMemoryMigrationRepository::new(),
        );
        let tenant = Uuid::new_v4();
        routing
            .put(TenantRoute::normal(tenant, "shared"))
            .await
            .expect("route");
        Self {
            tenant,
            source,
            target,
            routing,
            ports,
        }
    }

    /// One instance: its own lock manager on its own pool, with a connection open.
    async fn instance(&self, name: &str, lock_timeout: Duration) -> Coordinator {
        let locks = PostgresLockManager::builder(pool()).holder_id(name).build();
        drop(locks.pool().get().await.expect("a connection"));
        MigrationCoordinator::new(self.ports.clone(), locks)
            .with_config(MigrationConfig::new().with_lock_timeout(lock_timeout))
    }

    async fn write(&self, n: usize) {
        let router = WriteRouter::new(&self.ports, &MigrationConfig::new());
        for i in 0..n {
            router
                .append(self.tenant, &[Event::new("Written", i.to_string())])
                .await
                .expect("write");
        }
    }

    /// Started, copied and in dual write; returns the migration id.
    async fn in_dual_write(&self, coordinator: &Coordinator) -> Uuid {
        let migration = coordinator
            .start_migration(self.tenant, "shared", "dedicated")
            .await
            .expect("start");
        coordinator.bulk_copy(migration.id).await.expect("copy");
        coordinator
            .enable_dual_write(migration.id)
            .await
            .expect("dual write");
        migration.id
    }
}

async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&database_url(), NoTls)
        .await
        .expect("admin");
    tokio::spawn(connection);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_race_and_exactly_one_cuts_over() {
    let admin = admin().await;
    for lock_timeout in [Duration::ZERO, Duration::from_millis(500)] {
        for round in 0..5 {
            let world = World::new().await;
            let first = Arc::new(world.instance("instance-a", lock_timeout).await);
            let second = Arc::new(world.instance("instance-b", lock_timeout).await);
            world.write(25).await;
            let migration = world.in_dual_write(&first).await;

            let barrier = Arc::new(Barrier::new(2));
            let racers: Vec<_> = [first.clone(), second.clone()]
                .into_iter()
                .map(|coordinator| {
                    let barrier = barrier.clone();
                    tokio::spawn(async move {
                        barrier.wait().await;
                        coordinator.cutover(migration).await
                    })
                })
                .collect();
            let mut successes = 0;
            let mut lock_refusals = 0;
            let mut found_done = 0;
            for racer in racers {
                match racer.await.expect("racer") {
                    Ok(result) if result.success() => successes += 1,
                    Ok(result) => match result.outcome() {
                        CutoverOutcome::LockNotAcquired(error) => {
                            assert!(error.is_timeout(), "{error}");
                            assert!(
                                result
                                    .message()
                                    .starts_with("Failed to acquire cutover lock: "),
                                "{}",
                                result.message()
                            );
                            lock_refusals += 1;
                        }
                        // Waited for the lock, then re-checked: the winner had finished.
                        CutoverOutcome::AlreadyCompleted => found_done += 1,
                        other => panic!("round {round}: unexpected outcome {other:?}"),
                    },
                    Err(error) => panic!("round {round}: unexpected error {error}"),
                }
            }
            if lock_timeout.is_zero() {
                assert_eq!(
                    lock_refusals, 1,
                    "one try only: the loser is refused by the lock"
                );
            } else {
                assert_eq!(
                    found_done, 1,
                    "the loser waits, takes the lock and finds it done"
                );
            }
            assert_eq!(successes, 1, "exactly one instance cuts over");
            assert_eq!(
                world.routing.migrated_puts.load(Ordering::SeqCst),
                1,
                "routing flipped once"
            );
            let route = world.routing.inner.route(world.tenant).expect("route");
            assert_eq!(
                (route.store_id.as_str(), route.state),
                ("dedicated", RoutingState::Migrated)
            );
            assert_eq!(
                first.migration(migration).await.expect("migration").phase,
                Phase::Completed
            );
            let ids = |store: &InMemoryEventStore| {
                store
                    .events(world.tenant)
                    .into_iter()
                    .map(|stored| stored.event.id)
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                ids(&world.source),
                ids(&world.target),
                "every event copied once, in order"
            );
            let key = migration_lock_key(world.tenant, Some("cutover"));
            let held: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
                     AND ((classid::bigint << 32) | objid::bigint) = $1",
                    &[&lock_id(&key)],
                )
                .await
                .expect("pg_locks")
                .get(0);
            assert_eq!(held, 0, "the cutover lock is released on the server");
            assert_eq!(
                first
                    .lock_manager()
                    .map(locks_port::LockRegistry::held_lock_count),
                Some(0)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_session_holding_the_same_lock_id_keeps_the_cutover_out() {
    let world = World::new().await;
    let coordinator = world
        .instance("rust-instance", Duration::from_millis(100))
        .await;
    world.write(5).await;
    let migration = world.in_dual_write(&coordinator).await;

    // A Python instance derives the same id for the same key and holds it on its session.
    let python_like = admin().await;
    let key = migration_lock_key(world.tenant, Some("cutover"));
    python_like
        .simple_query(&format!("SELECT pg_advisory_lock({})", lock_id(&key)))
        .await
        .expect("foreign lock");

    let result = coordinator.cutover(migration).await.expect("cutover runs");
    assert!(!result.success());
    assert!(matches!(
        result.outcome(),
        CutoverOutcome::LockNotAcquired(_)
    ));
    assert_eq!(
        result.message(),
        format!(
            "Failed to acquire cutover lock: Failed to acquire lock '{key}': Timeout after 0.1s"
        )
    );
    assert_eq!(
        world.routing.migrated_puts.load(Ordering::SeqCst),
        0,
        "nothing changed"
    );
    assert_eq!(
        coordinator
            .migration(migration)
            .await
            .expect("migration")
            .phase,
        Phase::DualWrite
    );

    python_like
        .simple_query(&format!("SELECT pg_advisory_unlock({})", lock_id(&key)))
        .await
        .expect("foreign unlock");
    let result = coordinator.cutover(migration).await.expect("cutover runs");
    assert!(result.success(), "{}", result.message());
    assert_eq!(
        world.routing.history.lock().expect("history").last(),
        Some(&RoutingState::Migrated)
    );
}
