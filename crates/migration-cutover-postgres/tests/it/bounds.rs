//! The documented bounds, each asserted as an outcome: how long a dual write waits for its
//! mirror, how many pauses the history keeps, how long a writer waits while a cutover
//! lives. Bounds on time are the documented bound plus a stated slack for a loaded 2-core
//! machine, and each test's own timeouts are far beyond them, so a bound that does not
//! hold shows as a wait of the other timeout, not as a few milliseconds too many.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use migration_cutover::uuid::Uuid;
use migration_cutover::{
    CutoverOutcome, Event, EventStore, MigrationConfig, Phase, RoutingRepository, RoutingState,
    Stores, TenantRoute, WritePause,
};
use migration_cutover_postgres::{
    PostgresEventStore, PostgresRoutingRepository, PostgresWritePause, PostgresWriteRouter,
    install_store,
};

use crate::fleet::{ACQUIRE, BUDGET, all_events, prepare};
use crate::support::{Fleet, SOURCE, TARGET, connect, pool, table, test_config, until};

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

/// While a cutover lives, a writer waits at most the pause's acquire timeout plus the
/// pause budget, plus the rollback, itself bounded by the budget (ADR 0008). Here both
/// use their whole budget: another session holds the tenant's route row (`FOR UPDATE`),
/// so the cutover's `cutover_paused` compare-and-set waits until the budget runs out;
/// then it holds the migration record's row, so the rollback's record write waits until
/// its budget runs out too. Writers write all along; the longest write must have been
/// held back (by at least the budget) and let go within acquire timeout + 2 × budget +
/// slack, far inside its own timeout. Nothing is stuck afterwards: once the rows are
/// free, the cutover completes and every acknowledged write is on the target once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_cutover_lives_a_writer_waits_at_most_acquire_timeout_and_two_budgets() {
    let bound = ACQUIRE + BUDGET + BUDGET + SLACK;
    let fleet = Fleet::create("writerbound").await;
    let config = test_config().with_write_timeout(WRITE_TIMEOUT);
    let instance = fleet.instance(config, ACQUIRE);
    assert_eq!(instance.coordinator.config().pause_budget(), BUDGET);
    let tenant = Uuid::new_v4();
    let migration = prepare(&instance.coordinator, tenant).await;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (router, stop) = (instance.router.clone(), Arc::clone(&stop));
        async move {
            let mut written = Vec::new();
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let event = Event::new("W", "");
                let started = Instant::now();
                let receipt = router.append(tenant, std::slice::from_ref(&event)).await;
                longest = longest.max(started.elapsed());
                receipt.unwrap_or_else(|error| panic!("a write failed: {error}"));
                written.push(event.id);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (written, longest)
        }
    });

    let rows = connect(Some(&fleet.a)).await;
    rows.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM fleet.routes WHERE tenant_id = '{tenant}' FOR UPDATE"
    ))
    .await
    .expect("hold the route's row");
    let (result, ()) = tokio::join!(instance.coordinator.cutover(migration), async {
        until("the pause granted", async || {
            instance.pause.is_paused(tenant)
        })
        .await;
        rows.batch_execute(&format!(
            "SELECT 1 FROM fleet.migrations WHERE id = '{migration}' FOR UPDATE"
        ))
        .await
        .expect("hold the record's row");
    });
    let result = result.expect("the cutover ran");
    let CutoverOutcome::RollbackFailed { error, rollback } = result.outcome() else {
        panic!("expected a stalled rollback: {}", result.message());
    };
    assert_eq!(
        error.reason(),
        migration_cutover::CutoverFailureReason::Timeout,
        "{error}"
    );
    assert!(
        rollback.to_string().contains("did not finish"),
        "{rollback}"
    );
    // Writes go on while the rows are still held: the pause is over.
    let after = Event::new("after", "");
    let write = instance.router.append(tenant, std::slice::from_ref(&after));
    let receipt = tokio::time::timeout(WRITE_TIMEOUT + SLACK, write).await;
    let receipt = receipt.expect("a write after the failed cutover waited past its timeout");
    receipt.expect("a write after the failed cutover");
    rows.batch_execute("ROLLBACK").await.expect("free the rows");
    stop.store(true, Ordering::Relaxed);
    let writer = tokio::time::timeout(WRITE_TIMEOUT + SLACK, writer).await;
    let writer = writer.expect("a write waited past its own timeout");
    let (mut written, longest) = writer.expect("the writer");
    written.push(after.id);
    assert!(
        longest >= BUDGET,
        "no write was held back by the pause (longest write {longest:?})"
    );
    assert!(
        longest <= bound,
        "a writer waited {longest:?} while the cutover lived, more than acquire timeout \
         {ACQUIRE:?} + budget {BUDGET:?} + rollback budget {BUDGET:?} + slack {SLACK:?}"
    );

    let retry = instance.coordinator.cutover(migration).await;
    let retry = retry.expect("the retry ran");
    assert!(retry.success(), "{}", retry.message());
    let record = instance
        .coordinator
        .migration(migration)
        .await
        .expect("record");
    assert_eq!(record.phase, Phase::Completed);
    let on_target = all_events(&instance.target, tenant).await;
    for id in &written {
        assert_eq!(
            on_target.iter().filter(|stored| *stored == id).count(),
            1,
            "acknowledged write {id} on the target once"
        );
    }
    drop(rows);
    drop(instance);
    fleet.drop_databases().await;
}

/// A store read cut short (as a cutover step is by its pause budget) while the server
/// holds it behind a lock leaves no busy connection in the pool: the next caller, here a
/// health check of another table's store on the same one-connection pool, does not wait
/// behind the abandoned statement. Before, the connection went back to the pool still
/// running the read, and the health check queued behind it for as long as the lock was
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_read_cut_short_leaves_no_busy_connection_for_the_next_caller() {
    let fleet = Fleet::create("cutread").await;
    let one = pool(&fleet.b, 1);
    install_store(&one, &table("other.events"))
        .await
        .expect("a second table");
    let store = PostgresEventStore::new(one.clone(), table("dedicated.events"));
    let other = PostgresEventStore::new(one, table("other.events"));
    let holder = connect(Some(&fleet.b)).await;
    let hold = "BEGIN; LOCK TABLE dedicated.events IN ACCESS EXCLUSIVE MODE";
    holder.batch_execute(hold).await.expect("hold the table");
    let cut = tokio::time::timeout(Duration::from_millis(200), store.position(Uuid::new_v4()));
    assert!(cut.await.is_err(), "the read waits on the table's lock");
    let ping = tokio::time::timeout(Duration::from_secs(10), other.ping()).await;
    holder.batch_execute("ROLLBACK").await.expect("let go");
    assert!(
        matches!(ping, Ok(Ok(()))),
        "the health check waited behind the abandoned read: {ping:?}"
    );
    drop((store, other));
    fleet.drop_databases().await;
}
