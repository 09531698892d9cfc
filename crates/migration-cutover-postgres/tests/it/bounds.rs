//! The documented bounds, each asserted as an outcome: how long a dual write waits for its
//! mirror, how many pauses the history keeps, how long a writer waits while a cutover
//! lives. Bounds on time are the documented bound plus a stated slack for a loaded 2-core
//! machine, and each test's own timeouts are far beyond them, so a bound that does not
//! hold shows as a wait of the other timeout, not as a few milliseconds too many.

use std::time::{Duration, Instant};

use migration_cutover::uuid::Uuid;
use migration_cutover::{
    Event, EventStore, MigrationConfig, RoutingRepository, RoutingState, Stores, TenantRoute,
    WritePause,
};
use migration_cutover_postgres::{
    PostgresEventStore, PostgresRoutingRepository, PostgresWritePause, PostgresWriteRouter,
    install_store,
};

use crate::fleet::ACQUIRE;
use crate::support::{Fleet, SOURCE, TARGET, connect, pool, table, test_config};

/// Scheduling slack on a loaded 2-core machine, added to every documented bound here.
const SLACK: Duration = Duration::from_millis(1_500);

/// A write timeout far beyond every bound below: a writer that is not let go within its
/// bound would wait this long (and fail with `Paused`).
const WRITE_TIMEOUT: Duration = Duration::from_secs(15);

/// A dual write whose target is in the source's own database mirrors inside the source's
/// transaction; it gives up on the mirror as a dual write to another database does
/// (`a_dual_write_does_not_wait_long_for_a_target_that_does_not_answer`): after the
/// router's mirror wait of 1 s, leaving the events to the next catch-up, not after the
/// write's whole timeout. The target's append lock is held by another session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_write_in_one_database_gives_up_on_its_mirror_after_the_mirror_wait() {
    const MIRROR_WAIT: Duration = Duration::from_secs(1);
    let fleet = Fleet::create("mirror1db").await;
    let a = pool(&fleet.a, 8);
    install_store(&a, &table("dedicated.events"))
        .await
        .expect("target table in the source's database");
    let source = PostgresEventStore::new(a.clone(), table("shared.events"));
    let target = PostgresEventStore::new(a.clone(), table("dedicated.events"));
    let stores = Stores::new()
        .with_store(SOURCE, source.clone())
        .with_store(TARGET, target.clone());
    let routing = PostgresRoutingRepository::new(a.clone(), table("fleet.routes"));
    let pause = PostgresWritePause::new(&stores, &routing);
    let migrations = migration_cutover_postgres::PostgresMigrationRepository::new(
        a.clone(),
        table("fleet.migrations"),
    );
    let ports = migration_cutover::MigrationPorts::new(stores, routing.clone(), pause, migrations);
    let config = MigrationConfig::new().with_write_timeout(WRITE_TIMEOUT);
    let router = PostgresWriteRouter::new(&ports, &config);

    let (tenant, migration) = (Uuid::new_v4(), Uuid::new_v4());
    for state in [
        RoutingState::Normal,
        RoutingState::BulkCopy,
        RoutingState::DualWrite,
    ] {
        routing
            .put(TenantRoute {
                state,
                migration_id: Some(migration),
                target_store_id: Some(TARGET.into()),
                ..TenantRoute::normal(tenant, SOURCE)
            })
            .await
            .expect("route");
    }
    let receipt = router.append(tenant, &[Event::new("A", "")]).await;
    let receipt = receipt.expect("a dual write");
    assert_eq!(
        receipt.mirrored_to.as_ref().map(|id| id.as_str()),
        Some(TARGET)
    );

    let holder = connect(Some(&fleet.a)).await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({})",
            locks_port::lock_id(&format!("append:dedicated.events:{tenant}"))
        ))
        .await
        .expect("hold the target's append lock");
    let started = Instant::now();
    let receipt = router.append(tenant, &[Event::new("B", "")]).await;
    let took = started.elapsed();
    let receipt = receipt.expect("the write lands on the source without its mirror");
    assert_eq!((receipt.store_id.as_str(), receipt.position), (SOURCE, 2));
    assert_eq!(receipt.mirrored_to, None);
    assert!(
        took <= MIRROR_WAIT + SLACK,
        "the dual write waited {took:?} for its mirror, more than the mirror wait \
         {MIRROR_WAIT:?} + slack {SLACK:?} (its write timeout is {WRITE_TIMEOUT:?})"
    );
    holder.batch_execute("COMMIT").await.expect("release");

    // The next dual write copies the gap.
    let receipt = router.append(tenant, &[Event::new("C", "")]).await;
    let receipt = receipt.expect("a dual write");
    assert_eq!(
        receipt.mirrored_to.as_ref().map(|id| id.as_str()),
        Some(TARGET)
    );
    assert_eq!(target.position(tenant).await.expect("target head"), 3);
    drop(router);
    drop(holder);
    fleet.drop_databases().await;
}

/// `PostgresWritePause::history` keeps the last 64 pauses this process took and
/// released, oldest first, each requested, then granted, then released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pause_history_keeps_the_last_64_pauses_oldest_first() {
    const KEPT: usize = 64;
    let fleet = Fleet::create("history").await;
    let instance = fleet.instance(test_config(), ACQUIRE);
    let tenants: Vec<Uuid> = (0..KEPT + 6).map(|_| Uuid::new_v4()).collect();
    for (i, tenant) in tenants.iter().enumerate() {
        instance
            .routing
            .put(TenantRoute::normal(*tenant, SOURCE))
            .await
            .expect("route");
        let guard = instance.pause.pause(*tenant).await.expect("pause");
        if i % 2 == 0 {
            migration_cutover::PauseGuard::resume(guard).await;
        } else {
            drop(guard); // a dropped guard is a released pause too
        }
        assert_eq!(instance.pause.history().len(), (i + 1).min(KEPT));
    }
    let history = instance.pause.history();
    let kept: Vec<Uuid> = history.iter().map(|record| record.tenant_id).collect();
    assert_eq!(
        kept,
        tenants[tenants.len() - KEPT..],
        "the last 64, oldest first"
    );
    for pair in history.windows(2) {
        assert!(pair[0].released_at <= pair[1].requested_at, "{pair:?}");
    }
    for record in &history {
        assert!(
            record.requested_at <= record.acquired_at && record.acquired_at <= record.released_at,
            "{record:?}"
        );
    }
    drop(instance);
    fleet.drop_databases().await;
}
