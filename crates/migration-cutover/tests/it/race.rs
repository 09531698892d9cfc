//! Instances racing for the cutover of one tenant, on one shared lock table.

use std::sync::Arc;
use std::time::Duration;

use migration_cutover::locks_port::{DistributedLock, LockGuard, migration_lock_key};
use migration_cutover::{CutoverOutcome, MigrationError, NotReady, Phase, RoutingState};
use tokio::sync::Barrier;

use crate::support::{Harness, TARGET, config};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_coordinators_race_and_exactly_one_flips_the_routing() {
    for lock_timeout in [Duration::ZERO, Duration::from_millis(500)] {
        for _ in 0..10 {
            let h = Harness::new().await;
            let config = config().with_lock_timeout(lock_timeout);
            let first = Arc::new(h.coordinator(config));
            let second = Arc::new(h.coordinator(config));
            h.write(20).await;
            let migration = h.to_dual_write(&first).await;

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
            for racer in racers {
                match racer.await.unwrap() {
                    Ok(result) if result.success() => successes += 1,
                    Ok(result) => match result.outcome() {
                        CutoverOutcome::LockNotAcquired(error) => {
                            assert!(error.is_timeout());
                            assert!(
                                result
                                    .message()
                                    .starts_with("Failed to acquire cutover lock: "),
                                "{}",
                                result.message()
                            );
                        }
                        CutoverOutcome::AlreadyCompleted => {
                            assert!(result.message().contains("already completed"));
                        }
                        other => panic!("unexpected outcome {other:?}"),
                    },
                    // Started after the winner had finished: refused before the lock.
                    Err(MigrationError::State(state)) => {
                        assert_eq!(state.actual, Phase::Completed);
                    }
                    Err(error) => panic!("unexpected error {error}"),
                }
            }
            assert_eq!(successes, 1, "exactly one instance cuts over");
            assert_eq!(
                h.routing.puts_of(RoutingState::Migrated),
                1,
                "routing flipped once"
            );
            let route = h.route();
            assert_eq!(
                (route.store_id.as_str(), route.state),
                (TARGET, RoutingState::Migrated)
            );
            assert_eq!(
                first.migration(migration).await.unwrap().phase,
                Phase::Completed
            );
            assert_eq!(h.source.ids(h.tenant), h.target.ids(h.tenant));
            assert!(h.table.is_empty());
            assert!(!h.is_paused());
        }
    }
}

#[tokio::test]
async fn a_held_cutover_lock_fails_the_cutover_and_changes_nothing() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config().with_lock_timeout(Duration::from_millis(50)));
    let migration = h.to_dual_write(&coordinator).await;
    let other_instance = h.table.manager();
    let key = migration_lock_key(h.tenant, Some("cutover"));
    let held = other_instance.try_acquire(&key).await.unwrap().unwrap();

    let readiness = coordinator.cutover_readiness(migration).await.unwrap();
    assert!(matches!(readiness.blockers[..], [NotReady::LockBusy]));
    assert_eq!(readiness.lock_free, Some(false));

    let puts_before = h.routing.puts.lock().unwrap().len();
    let result = coordinator.cutover(migration).await.unwrap();
    assert!(!result.success());
    assert!(!result.rolled_back());
    assert_eq!(
        result.message(),
        format!(
            "Failed to acquire cutover lock: Failed to acquire lock '{key}': Timeout after 0.05s"
        )
    );
    assert_eq!(result.events_synced(), 0);
    assert_eq!(
        h.routing.puts.lock().unwrap().len(),
        puts_before,
        "routing untouched"
    );
    assert_eq!(
        coordinator.migration(migration).await.unwrap().phase,
        Phase::DualWrite
    );
    assert!(!h.is_paused());
    assert!(other_instance.is_held(&key));

    held.release().await;
    assert!(
        coordinator
            .cutover_readiness(migration)
            .await
            .unwrap()
            .is_ready()
    );
    assert!(coordinator.cutover(migration).await.unwrap().success());
}
