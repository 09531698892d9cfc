//! The cutover lock held by another instance: the cutover fails and changes nothing.
//! (Instances racing for the cutover are in the workspace tests, `tests/cutover_race/`,
//! one harness for the in-memory and the PostgreSQL lock managers.)

use std::time::Duration;

use migration_cutover::locks_port::{DistributedLock, LockGuard, migration_lock_key};
use migration_cutover::{NotReady, Phase};

use crate::support::{Harness, config};

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
