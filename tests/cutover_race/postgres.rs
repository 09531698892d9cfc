//! The race on real PostgreSQL: each instance has its own `PostgresLockManager` on its
//! own pool, as separate processes would; and a session holding the same advisory lock
//! id outside Rust (as a Python instance would) keeps the cutover out.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use locks_port::{lock_id, migration_lock_key};
use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres;
use migration_cutover::{CutoverOutcome, Phase, RoutingState};
use throwaway_pg::testing::{admin, database_url};

use crate::harness::{
    Backend, World, a_lock_that_does_not_exclude_is_caught, exactly_one_cuts_over,
};

fn pool() -> Pool {
    locks_postgres::plain_pool(&database_url(), 4).expect("pool")
}

/// One server; an admin session reads `pg_locks`.
struct Postgres {
    admin: tokio_postgres::Client,
}

impl Postgres {
    async fn new() -> Self {
        Self {
            admin: admin().await,
        }
    }
}

impl Backend for Postgres {
    type Lock = PostgresLockManager;

    /// Its own lock manager on its own pool, with a connection open.
    async fn instance(&self, name: &str) -> Self::Lock {
        let locks = PostgresLockManager::builder(pool()).holder_id(name).build();
        drop(locks.pool().get().await.expect("a connection"));
        locks
    }

    /// The sessions the server says hold the advisory lock of `key`.
    fn leftover(&self, key: &str) -> impl Future<Output = usize> + Send {
        let id = lock_id(key);
        async move {
            throwaway_pg::testing::advisory_lock(&self.admin, id)
                .await
                .len()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_instances_race_and_exactly_one_cuts_over() {
    exactly_one_cuts_over("PostgreSQL", &Postgres::new().await, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_postgres_lock_that_does_not_exclude_the_race_sees_a_double_cutover() {
    a_lock_that_does_not_exclude_is_caught("PostgreSQL", Postgres::new().await, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_session_holding_the_same_lock_id_keeps_the_cutover_out() {
    let world = World::new().await;
    let coordinator = world.instance(
        Postgres::new().await.instance("rust-instance").await,
        Duration::from_millis(100),
    );
    world.write(5).await;
    let migration = world.to_dual_write(&coordinator).await;

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
