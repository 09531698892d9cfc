//! The whole migration on the in-memory adapters, with writers running throughout.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use migration_cutover::locks_port::LockRegistry;
use migration_cutover::{CutoverOutcome, Event, MigrationCoordinator, Phase, RoutingState};
use uuid::Uuid;

use crate::support::{Harness, SOURCE, TARGET, config};

/// Keeps writing one event at a time until told to stop; returns what it wrote, in
/// the order the writes were acknowledged.
fn spawn_writer(
    harness: &Harness,
    name: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(Uuid, String)>> {
    let router = harness.router();
    let tenant = harness.tenant;
    tokio::spawn(async move {
        let mut written = Vec::new();
        let mut i = 0u32;
        while !stop.load(Ordering::SeqCst) {
            let event = Event::new(name, i.to_string());
            let receipt = router
                .append(tenant, std::slice::from_ref(&event))
                .await
                .expect("a write during the migration succeeds");
            written.push((event.id, receipt.store_id.to_string()));
            i += 1;
            tokio::time::sleep(Duration::from_micros(300)).await;
        }
        written
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_written_before_during_and_after_the_copy_end_in_the_target_once_and_in_order() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config().with_batch_size(7).unwrap());
    let before = h.write(40).await;

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = ["w1", "w2", "w3"]
        .into_iter()
        .map(|name| spawn_writer(&h, name, stop.clone()))
        .collect();
    tokio::time::sleep(Duration::from_millis(5)).await;

    let migration = coordinator
        .start_migration(h.tenant, SOURCE, TARGET)
        .await
        .unwrap();
    assert_eq!(migration.phase, Phase::Pending);
    let copy = coordinator.bulk_copy(migration.id).await.unwrap();
    assert!(copy.events_copied >= 40, "{copy:?}");
    assert_eq!(h.route().state, RoutingState::BulkCopy);
    tokio::time::sleep(Duration::from_millis(10)).await;
    coordinator.enable_dual_write(migration.id).await.unwrap();
    assert_eq!(h.route().state, RoutingState::DualWrite);
    tokio::time::sleep(Duration::from_millis(10)).await;

    let result = coordinator.cutover(migration.id).await.unwrap();
    assert!(result.success(), "{}", result.message());
    assert!(matches!(result.outcome(), CutoverOutcome::Completed));
    assert!(result.error().is_none());
    assert!(result.duration() > Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(10)).await;
    stop.store(true, Ordering::SeqCst);
    let mut written = Vec::new();
    for writer in writers {
        written.push(writer.await.unwrap());
    }
    let after = h.write(5).await;

    // The source holds exactly what was written before the flip; the target holds
    // that, in the same order, then what was written after it.
    let source = h.source.ids(h.tenant);
    let target = h.target.ids(h.tenant);
    assert_eq!(
        &target[..source.len()],
        &source[..],
        "the target starts with the source's stream"
    );
    assert_eq!(&source[..40], &before[..]);
    let unique: HashSet<_> = target.iter().collect();
    assert_eq!(unique.len(), target.len(), "no event twice in the target");
    let total: usize = before.len() + after.len() + written.iter().map(Vec::len).sum::<usize>();
    assert_eq!(
        target.len(),
        total,
        "every acknowledged write is in the target"
    );
    assert_eq!(&target[target.len() - 5..], &after[..]);
    for stream in &written {
        // Each writer's events appear in the target in the order it wrote them, and
        // went to the target exactly when the routing had flipped.
        let positions: Vec<_> = stream
            .iter()
            .map(|(id, _)| target.iter().position(|t| t == id).unwrap())
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]));
        for (id, store) in stream {
            assert_eq!(source.contains(id), store == SOURCE, "{id} went to {store}");
        }
    }
    assert!(
        written.iter().all(|stream| !stream.is_empty()),
        "every writer wrote during the migration"
    );

    let done = coordinator.migration(migration.id).await.unwrap();
    assert_eq!(done.phase, Phase::Completed);
    assert_eq!(done.last_error, None);
    let route = h.route();
    assert_eq!(route.store_id.as_str(), TARGET);
    assert_eq!(route.state, RoutingState::Migrated);
    assert!(!h.is_paused());
    assert_eq!(coordinator.lock_manager().unwrap().held_lock_count(), 0);
    assert!(h.table.is_empty(), "the cutover lock is released");
    assert_eq!(
        coordinator.sync_lag(migration.id).await.unwrap().events(),
        0
    );
}

#[tokio::test]
async fn after_cutover_writes_go_to_the_target_only() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    h.write(3).await;
    let migration = h.to_dual_write(&coordinator).await;
    h.write(2).await;
    assert_eq!(h.source.ids(h.tenant), h.target.ids(h.tenant));
    let result = coordinator.cutover(migration).await.unwrap();
    assert!(result.success(), "{}", result.message());
    assert_eq!(
        result.events_synced(),
        0,
        "dual writes had kept the target in sync"
    );
    assert!(
        result.message().starts_with("Cutover completed"),
        "{}",
        result.message()
    );

    let event = Event::new("After", "x");
    let receipt = h
        .router()
        .append(h.tenant, std::slice::from_ref(&event))
        .await
        .unwrap();
    assert_eq!(receipt.store_id.as_str(), TARGET);
    assert_eq!(receipt.position, 6);
    assert_eq!(receipt.mirrored_to, None);
    assert!(h.target.ids(h.tenant).contains(&event.id));
    assert!(!h.source.ids(h.tenant).contains(&event.id));
    assert_eq!(h.source.events(h.tenant).len(), 5);
    let read = h.router().read(h.tenant, 5, 10).await.unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].event, event);
}

#[tokio::test]
async fn the_final_catch_up_copies_what_the_lag_allowance_let_through() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config().with_max_lag(10));
    let migration = h.to_dual_write(&coordinator).await;
    // Mirroring fails for a while: the target falls 4 events behind.
    h.target.faults.append.fail(true);
    h.write(4).await;
    h.target.faults.append.fail(false);
    assert_eq!(coordinator.sync_lag(migration).await.unwrap().events(), 4);

    let result = coordinator.cutover(migration).await.unwrap();
    assert!(result.success(), "{}", result.message());
    assert_eq!(result.events_synced(), 4);
    assert_eq!(h.source.ids(h.tenant), h.target.ids(h.tenant));
}

#[tokio::test]
async fn readiness_probes_the_lock_without_holding_it() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    let ready = coordinator.cutover_readiness(migration).await.unwrap();
    assert!(ready.is_ready(), "{:?}", ready.blockers);
    assert_eq!(ready.phase, Phase::DualWrite);
    assert_eq!(ready.lock_free, Some(true));
    assert_eq!(ready.lag.unwrap().events(), 0);
    assert!(h.table.is_empty(), "the probe released the lock");
    assert_eq!(
        coordinator.migration(migration).await.unwrap().phase,
        Phase::DualWrite
    );
}

#[tokio::test]
async fn abort_routes_the_tenant_back_to_the_source_for_good() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    let aborted = coordinator.abort(migration).await.unwrap();
    assert_eq!(aborted.phase, Phase::Aborted);
    let route = h.route();
    assert_eq!(
        (route.store_id.as_str(), route.state),
        (SOURCE, RoutingState::Normal)
    );
    assert_eq!(route.migration_id, None);
    let ids = h.write(1).await;
    assert!(
        !h.target.ids(h.tenant).contains(&ids[0]),
        "no more mirroring"
    );
    assert!(coordinator.cutover(migration).await.is_err());
    assert!(
        coordinator.abort(migration).await.is_err(),
        "aborted is terminal"
    );
    assert!(h.table.is_empty());
    // The tenant can be migrated again; the copy goes on from the target's head.
    let again = h.to_dual_write(&coordinator).await;
    assert!(coordinator.cutover(again).await.unwrap().success());
    assert_eq!(h.source.ids(h.tenant), h.target.ids(h.tenant));
}

/// The lead's cross-crate race runs coordinators on spawned tasks with any lock
/// manager: the cutover future must be `Send + 'static` for any `L`.
#[allow(dead_code)]
fn cutover_futures_are_send_for_any_lock_manager<L>(coordinator: Arc<MigrationCoordinator<L>>)
where
    L: migration_cutover::locks_port::DistributedLock + 'static,
{
    fn assert_send<T: Send + 'static>(_: T) {}
    assert_send(async move { coordinator.cutover(Uuid::nil()).await.map(|r| r.success()) });
}

#[tokio::test]
async fn readiness_reports_lag_and_catch_up_clears_it() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    h.target.faults.append.fail(true);
    h.write(3).await;
    h.target.faults.append.fail(false);

    let readiness = coordinator.cutover_readiness(migration).await.unwrap();
    assert!(matches!(
        readiness.blockers[..],
        [migration_cutover::NotReady::LagTooHigh(
            migration_cutover::LagTooHigh { current: 3, max: 0 }
        )]
    ));
    assert_eq!(
        readiness.blockers[0].to_string(),
        "sync lag of 3 events is above the allowed maximum of 0"
    );
    let report = coordinator.catch_up(migration).await.unwrap();
    assert_eq!((report.events_copied, report.lag.events()), (3, 0));
    assert!(
        coordinator
            .cutover_readiness(migration)
            .await
            .unwrap()
            .is_ready()
    );
    assert_eq!(
        coordinator
            .migration(migration)
            .await
            .unwrap()
            .events_copied,
        3
    );
}
