//! Every failure of the paused window rolls back to dual write on the source, and
//! writes resume before the lock is released.

use std::time::{Duration, Instant};

use migration_cutover::{
    CutoverError, CutoverFailureReason, CutoverOutcome, CutoverResult, CutoverTimeout, Event,
    LagTooHigh, Phase, RoutingState,
};
use uuid::Uuid;

use crate::support::{Coordinator, Harness, SOURCE, TARGET, config};

/// Asserts the documented state after a failed cutover and returns its error.
async fn assert_rolled_back<'r>(
    h: &Harness,
    coordinator: &Coordinator,
    migration: Uuid,
    result: &'r CutoverResult,
    reason: CutoverFailureReason,
) -> &'r CutoverError {
    assert!(!result.success());
    assert!(result.rolled_back());
    let CutoverOutcome::RolledBack(error) = result.outcome() else {
        panic!("expected a clean rollback, got {:?}", result.outcome());
    };
    assert_eq!(error.reason(), reason, "{error}");
    assert_eq!(
        result.message(),
        format!("Cutover failed and was rolled back: {error}")
    );

    let record = coordinator.migration(migration).await.unwrap();
    assert_eq!(record.phase, Phase::DualWrite);
    assert_eq!(record.last_error, Some(error.to_string()));
    let route = h.route();
    assert_eq!(route.store_id.as_str(), SOURCE);
    assert_eq!(route.state, RoutingState::DualWrite);
    assert_eq!(
        route.target_store_id.as_ref().map(|t| t.as_str()),
        Some(TARGET)
    );
    assert_eq!(route.migration_id, Some(migration));

    // Writes resumed and the lock is free again.
    assert!(!h.is_paused());
    assert!(h.table.is_empty(), "the cutover lock is released");
    let receipt = h
        .router()
        .append_within(
            h.tenant,
            &[Event::new("AfterFailure", "")],
            Duration::from_millis(100),
        )
        .await
        .expect("writes resumed");
    assert_eq!(receipt.store_id.as_str(), SOURCE);
    error
}

#[tokio::test]
async fn lag_too_high_rolls_back_and_a_retry_after_catch_up_succeeds() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    h.target.faults.append.fail(true); // mirroring fails: the target falls behind
    h.write(3).await;
    h.target.faults.append.fail(false);

    let result = coordinator.cutover(migration).await.unwrap();
    let error = assert_rolled_back(
        &h,
        &coordinator,
        migration,
        &result,
        CutoverFailureReason::LagTooHigh,
    )
    .await;
    assert!(matches!(
        error,
        CutoverError::LagTooHigh(LagTooHigh { current: 3, max: 0 })
    ));
    assert_eq!(
        h.routing.puts_of(RoutingState::CutoverPaused),
        0,
        "the lag is checked before routing says cutover_paused"
    );

    // The write after the rollback was mirrored, and mirroring filled the gap first.
    assert_eq!(coordinator.sync_lag(migration).await.unwrap().events(), 0);
    assert_eq!(
        coordinator.catch_up(migration).await.unwrap().events_copied,
        0
    );
    assert!(
        coordinator
            .cutover_readiness(migration)
            .await
            .unwrap()
            .is_ready()
    );
    let retry = coordinator.cutover(migration).await.unwrap();
    assert!(retry.success(), "{}", retry.message());
    assert_eq!(h.source.ids(h.tenant), h.target.ids(h.tenant));
    assert_eq!(
        coordinator.migration(migration).await.unwrap().last_error,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceeding_the_pause_budget_rolls_back_and_the_waiting_write_goes_through() {
    let h = Harness::new().await;
    let budget = Duration::from_millis(100);
    let coordinator = h.coordinator(config().with_pause_budget(budget).unwrap());
    let migration = h.to_dual_write(&coordinator).await;
    h.target.faults.ping.delay(Duration::from_secs(3)); // the health check hangs

    let cutover = tokio::spawn(async move {
        let result = coordinator.cutover(migration).await.unwrap();
        (coordinator, result)
    });
    h.until_paused().await;
    let event = Event::new("DuringPause", "");
    let waited = Instant::now();
    let receipt = h
        .router()
        .append_within(
            h.tenant,
            std::slice::from_ref(&event),
            Duration::from_secs(10),
        )
        .await
        .expect("the paused write goes through once writes resume");
    let waited = waited.elapsed();
    let (coordinator, result) = cutover.await.unwrap();
    h.target.faults.ping.delay(Duration::ZERO);

    let error = assert_rolled_back(
        &h,
        &coordinator,
        migration,
        &result,
        CutoverFailureReason::Timeout,
    )
    .await;
    let CutoverError::Timeout(CutoverTimeout {
        elapsed_ms,
        limit_ms,
    }) = *error
    else {
        panic!("{error:?}");
    };
    assert_eq!(limit_ms, 100);
    assert!(elapsed_ms >= 100, "{elapsed_ms}");
    assert!(
        waited < Duration::from_millis(2500),
        "writes resumed when the budget ran out, not when the slow step ended ({waited:?})"
    );
    assert_eq!(receipt.store_id.as_str(), SOURCE);
    assert_eq!(
        receipt.mirrored_to.as_ref().map(|t| t.as_str()),
        Some(TARGET)
    );
    for store in [&h.source, &h.target] {
        let ids = store.ids(h.tenant);
        assert_eq!(ids.iter().filter(|id| **id == event.id).count(), 1);
    }
}

#[tokio::test]
async fn an_unhealthy_target_rolls_back_before_routing_points_at_it() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    h.target.faults.ping.fail(true);

    let result = coordinator.cutover(migration).await.unwrap();
    let error = assert_rolled_back(
        &h,
        &coordinator,
        migration,
        &result,
        CutoverFailureReason::TargetHealthCheckFailed,
    )
    .await;
    assert!(error.to_string().contains("store `target`"), "{error}");
    let pointed_at_target = h
        .routing
        .puts
        .lock()
        .unwrap()
        .iter()
        .filter(|route| route.store_id.as_str() == TARGET)
        .count();
    assert_eq!(pointed_at_target, 0);
}

#[tokio::test]
async fn a_failing_flip_changes_nothing_and_is_rolled_back() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    h.routing.fail_puts_of(Some(RoutingState::Migrated));

    let result = coordinator.cutover(migration).await.unwrap();
    h.routing.fail_puts_of(None);
    let error = assert_rolled_back(
        &h,
        &coordinator,
        migration,
        &result,
        CutoverFailureReason::RoutingUpdateFailed,
    )
    .await;
    assert!(matches!(error, CutoverError::RoutingUpdateFailed { .. }));
    assert!(error.to_string().contains("injected failure"), "{error}");
    // The flip is one write: it failed, so the route never pointed at the target, not
    // even half-way.
    let puts = h.routing.puts.lock().unwrap().clone();
    let states: Vec<_> = puts
        .iter()
        .map(|route| (route.state, route.store_id.as_str()))
        .collect();
    assert!(
        states.iter().all(|(_, store)| *store == SOURCE),
        "{states:?}"
    );
    assert_eq!(
        &states[states.len() - 2..],
        [
            (RoutingState::CutoverPaused, SOURCE),
            (RoutingState::DualWrite, SOURCE)
        ]
    );
}

#[tokio::test]
async fn a_lag_that_cannot_be_measured_rolls_back() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    h.target.faults.position.fail(true);
    let result = coordinator.cutover(migration).await.unwrap();
    h.target.faults.position.fail(false);
    let error = assert_rolled_back(
        &h,
        &coordinator,
        migration,
        &result,
        CutoverFailureReason::LagCalculationFailed,
    )
    .await;
    assert!(
        error.to_string().contains("injected position failure"),
        "{error}"
    );
}

#[tokio::test]
async fn a_half_done_cutover_is_resolved_by_the_next_call() {
    // An instance died after pausing: the record says cutover, routing cutover_paused.
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let state = RoutingState::CutoverPaused;
    let migration = left_by_a_dead_cutover(&h, &coordinator, state, SOURCE).await;
    let result = coordinator.cutover(migration).await.unwrap();
    assert!(result.success(), "{}", result.message());
    assert_eq!(h.route().state, RoutingState::Migrated);

    // An instance flipped routing but could not complete the record. (Of another
    // migration: the records take no save of `cutover` over the `completed` one above.)
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = left_by_a_dead_cutover(&h, &coordinator, RoutingState::Migrated, TARGET).await;
    let result = coordinator.cutover(migration).await.unwrap();
    assert!(matches!(result.outcome(), CutoverOutcome::AlreadyCompleted));
    assert_eq!(
        coordinator.migration(migration).await.unwrap().phase,
        Phase::Completed
    );
    // The flip written by hand; completing the record writes no route.
    assert_eq!(h.routing.puts_of(RoutingState::Migrated), 1);
}

/// What a cutover that died leaves, written by hand: the record in `cutover` and the
/// route as `state` on `store`.
async fn left_by_a_dead_cutover(
    h: &Harness,
    coordinator: &Coordinator,
    state: RoutingState,
    store: &str,
) -> Uuid {
    use migration_cutover::{MigrationRepository, RoutingRepository, StoreId};

    let migration = h.to_dual_write(coordinator).await;
    let mut record = coordinator.migration(migration).await.unwrap();
    record.phase = Phase::Cutover;
    h.ports.migrations().save(&record).await.unwrap();
    // The cutover's writes up to `state`: `cutover_paused` on the source first (the
    // routing table takes no other way on from `dual_write`), then `state` on `store`.
    let paused = (RoutingState::CutoverPaused, SOURCE);
    let steps = if state == RoutingState::DualWrite {
        vec![(state, store)]
    } else {
        vec![paused, (state, store)]
    };
    let mut route = h.route();
    for (state, store) in steps {
        route.state = state;
        route.store_id = StoreId::new(store);
        if state == RoutingState::Migrated {
            route.target_store_id = None;
        }
        h.ports.routing().put(route.clone()).await.unwrap();
    }
    migration
}

#[tokio::test]
async fn abort_resolves_a_cutover_that_died_before_the_flip() {
    for state in [RoutingState::DualWrite, RoutingState::CutoverPaused] {
        let h = Harness::new().await;
        let coordinator = h.coordinator(config());
        let migration = left_by_a_dead_cutover(&h, &coordinator, state, SOURCE).await;
        let record = coordinator.abort(migration).await.unwrap();
        assert_eq!(record.phase, Phase::Aborted, "{state}");
        let route = h.route();
        assert_eq!(
            (route.store_id.as_str(), route.state),
            (SOURCE, RoutingState::Normal)
        );
    }
}

/// A cutover that lost its lock while its flip's statement was on its way: the flip
/// lands after `abort` (under the lock now) read the route `cutover_paused` and before it
/// writes. Before the fix `abort` overwrote the flip with `normal` on the source, so
/// writes already routed to the target were stranded there; now its write is a
/// compare-and-set, which fails, and the route read again is refused as flipped.
#[tokio::test]
async fn abort_does_not_overwrite_a_flip_that_lands_after_its_read() {
    use migration_cutover::{MigrationError, StoreId};

    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let state = RoutingState::CutoverPaused;
    let migration = left_by_a_dead_cutover(&h, &coordinator, state, SOURCE).await;
    let mut flipped = h.route();
    flipped.state = RoutingState::Migrated;
    flipped.store_id = StoreId::new(TARGET);
    flipped.target_store_id = None;
    h.routing.after_next_get(flipped.clone());

    let error = coordinator.abort(migration).await.unwrap_err();
    assert!(
        matches!(error, MigrationError::AlreadyFlipped { .. }),
        "{error}"
    );
    assert_eq!(h.route(), flipped, "the flip stands");
    let record = coordinator.migration(migration).await.unwrap();
    assert_eq!(record.phase, Phase::Cutover);
}

#[tokio::test]
async fn abort_refuses_a_flip_that_took_effect_and_cutover_completes_it() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = left_by_a_dead_cutover(&h, &coordinator, RoutingState::Migrated, TARGET).await;
    let error = coordinator.abort(migration).await.unwrap_err();
    assert!(
        matches!(
            error,
            migration_cutover::MigrationError::AlreadyFlipped { .. }
        ),
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains("`migrated`") && text.contains("call `cutover` again"),
        "{text}"
    );
    let result = coordinator.cutover(migration).await.unwrap();
    assert!(matches!(result.outcome(), CutoverOutcome::AlreadyCompleted));
    assert_eq!(
        coordinator.migration(migration).await.unwrap().phase,
        Phase::Completed
    );
}

#[tokio::test]
async fn cutover_completes_a_half_written_flip_that_abort_refuses() {
    // A flip in two writes (an older version) killed between them: paused, on the target.
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration =
        left_by_a_dead_cutover(&h, &coordinator, RoutingState::CutoverPaused, TARGET).await;
    let error = coordinator.abort(migration).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("`cutover_paused` on `target`") && text.contains("call `cutover` again"),
        "{text}"
    );
    let result = coordinator.cutover(migration).await.unwrap();
    assert!(matches!(result.outcome(), CutoverOutcome::AlreadyCompleted));
    let route = h.route();
    assert_eq!(
        (route.store_id.as_str(), route.state),
        (TARGET, RoutingState::Migrated)
    );
}

#[tokio::test]
async fn a_route_a_cutover_cannot_start_from_is_named_with_its_resolution() {
    use migration_cutover::{MigrationError, RoutingRepository, TenantRoute};

    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    h.ports
        .routing()
        .put(TenantRoute::normal(h.tenant, "elsewhere"))
        .await
        .unwrap();
    let error = coordinator.cutover(migration).await.unwrap_err();
    assert!(
        matches!(error, MigrationError::UnexpectedRoute { .. }),
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains("`normal` on `elsewhere`") && text.contains("abort"),
        "{text}"
    );
}
