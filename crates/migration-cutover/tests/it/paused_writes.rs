//! Writes that arrive while a cutover holds them back.

use std::time::{Duration, Instant};

use migration_cutover::{Event, RoutingRepository, RoutingState, WriteError};

use crate::support::{Harness, SOURCE, TARGET, config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_during_the_pause_waits_and_then_lands_in_the_target_once() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config().with_pause_budget(Duration::from_secs(5)).unwrap());
    let migration = h.to_dual_write(&coordinator).await;
    h.target.faults.ping.delay(Duration::from_millis(200)); // a slow step in the window

    let cutover = tokio::spawn(async move { coordinator.cutover(migration).await.unwrap() });
    h.until_paused().await;
    let event = Event::new("DuringPause", "");
    let started = Instant::now();
    let receipt = h
        .router()
        .append_within(
            h.tenant,
            std::slice::from_ref(&event),
            Duration::from_secs(10),
        )
        .await
        .expect("the write waits out the pause");
    let waited = started.elapsed();
    let result = cutover.await.unwrap();
    assert!(result.success(), "{}", result.message());

    assert!(
        waited >= Duration::from_millis(100),
        "the write was held back ({waited:?})"
    );
    assert_eq!(
        receipt.store_id.as_str(),
        TARGET,
        "it went where routing pointed after the flip"
    );
    assert_eq!(h.target.ids(h.tenant), [event.id]);
    assert!(h.source.ids(h.tenant).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_during_the_pause_fails_clearly_after_its_own_timeout_and_is_not_written() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config().with_pause_budget(Duration::from_secs(5)).unwrap());
    let migration = h.to_dual_write(&coordinator).await;
    h.target.faults.ping.delay(Duration::from_millis(400));

    let cutover = tokio::spawn(async move { coordinator.cutover(migration).await.unwrap() });
    h.until_paused().await;
    let event = Event::new("TooImpatient", "");
    let error = h
        .router()
        .append_within(
            h.tenant,
            std::slice::from_ref(&event),
            Duration::from_millis(50),
        )
        .await
        .unwrap_err();
    let WriteError::Paused(paused) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(paused.tenant_id, h.tenant);
    assert!(paused.waited >= Duration::from_millis(50), "{paused:?}");
    assert!(
        error.to_string().starts_with(&format!(
            "writes to tenant {} are paused for a cutover; gave up after",
            h.tenant
        )),
        "{error}"
    );
    let result = cutover.await.unwrap();
    assert!(result.success(), "{}", result.message());
    for store in [&h.source, &h.target] {
        assert!(
            !store.ids(h.tenant).contains(&event.id),
            "the refused write is nowhere"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_route_no_pause_holds_is_rolled_back_by_the_next_write() {
    // A cutover wrote cutover_paused and was gone before resolving it: the write pause
    // (which covers every instance) is not held, so no live cutover is flipping. The
    // next write rolls the route back to dual_write and goes ahead, well within its
    // timeout; the record stays `cutover` for the next `cutover` or `abort`.
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    let mut route = h.route();
    route.state = RoutingState::CutoverPaused;
    h.ports.routing().put(route.clone()).await.unwrap();
    assert!(!h.is_paused());

    let receipt = h
        .router()
        .append_within(h.tenant, &[Event::new("E", "")], Duration::from_millis(40))
        .await
        .unwrap();
    assert_eq!(receipt.store_id.as_str(), SOURCE);
    assert_eq!(h.source.events(h.tenant).len(), 1);
    assert_eq!(h.route().state, RoutingState::DualWrite);
    assert_eq!(h.route().store_id.as_str(), SOURCE);
    let result = coordinator.cutover(migration).await.unwrap();
    assert!(result.success(), "{}", result.message());

    // A route half-flipped (paused, already on the target: a two-write flip of an older
    // version) is not the writers' to resolve: they wait, and give up after their
    // timeout. The routing table takes it from `migrated` only on a migration's way:
    // back to `normal`, then on to `cutover_paused`.
    let mut half = h.route();
    half.target_store_id = Some(half.store_id.clone());
    for state in [
        RoutingState::Normal,
        RoutingState::BulkCopy,
        RoutingState::DualWrite,
        RoutingState::CutoverPaused,
    ] {
        half.state = state;
        h.ports.routing().put(half.clone()).await.unwrap();
    }
    let refused = h
        .router()
        .append_within(h.tenant, &[Event::new("E", "")], Duration::from_millis(40))
        .await;
    assert!(matches!(refused, Err(WriteError::Paused(_))), "{refused:?}");
}
