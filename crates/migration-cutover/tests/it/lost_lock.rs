//! The cutover lock lost in the paused window: the cutover must not flip without it.

use std::time::Duration;

use migration_cutover::locks_port::{DistributedLock, LostReason, migration_lock_key};
use migration_cutover::{CutoverFailureReason, CutoverOutcome, Phase, RoutingState};

use crate::support::{Harness, SOURCE, config};

/// The lock is taken away (its session ended) while the cutover waits for the target's
/// health check; another instance can take it at once. The cutover must notice and roll
/// back instead of flipping the tenant with no lock held.
#[tokio::test]
async fn a_cutover_whose_lock_is_lost_before_the_flip_rolls_back() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = h.to_dual_write(&coordinator).await;
    let key = migration_lock_key(h.tenant, Some("cutover"));
    // Long enough to lose the lock in the paused window, well inside the 500 ms budget.
    h.target.faults.ping.delay(Duration::from_millis(150));

    let other_instance = h.table.manager();
    let (result, taken_by_other) = tokio::join!(coordinator.cutover(migration), async {
        h.until_paused().await;
        let locks = coordinator.lock_manager().expect("a lock manager");
        assert!(locks.lose(&key, LostReason::ConnectionClosed));
        // The key is free for another instance now: no exclusion is left.
        other_instance.try_acquire(&key).await.unwrap()
    });
    assert!(taken_by_other.is_some(), "another instance took the lock");
    let result = result.unwrap();

    assert!(
        !result.success(),
        "the cutover flipped the tenant after losing its lock: {}",
        result.message()
    );
    let CutoverOutcome::RolledBack(error) = result.outcome() else {
        panic!("expected a rollback, got {:?}", result.outcome());
    };
    assert_eq!(error.reason(), CutoverFailureReason::LockLost, "{error}");
    assert!(error.to_string().contains(&key), "{error}");
    let route = h.route();
    assert_eq!(
        (route.store_id.as_str(), route.state),
        (SOURCE, RoutingState::DualWrite)
    );
    assert_eq!(
        coordinator.migration(migration).await.unwrap().phase,
        Phase::DualWrite
    );
    assert!(!h.is_paused());
}
