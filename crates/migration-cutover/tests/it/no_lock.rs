//! A coordinator without a lock manager, and the refusals before the lock.

use migration_cutover::{
    InMemoryMigrationRepository, InMemoryWritePause, MigrationCoordinator, MigrationError,
    NoLockManager, NotReady, Phase, RoutingState, StateError,
};
use uuid::Uuid;

use crate::support::{FaultyRouting, FaultyStore, Harness, SOURCE, TARGET, config};

#[tokio::test]
async fn without_a_lock_manager_everything_but_cutover_works() {
    let h = Harness::new().await;
    let coordinator: MigrationCoordinator<
        NoLockManager,
        FaultyStore,
        FaultyRouting,
        InMemoryWritePause,
        InMemoryMigrationRepository,
    > = MigrationCoordinator::without_lock_manager(h.ports.clone());
    assert!(coordinator.lock_manager().is_none());
    h.write(5).await;
    let migration = coordinator
        .start_migration(h.tenant, SOURCE, TARGET)
        .await
        .unwrap();
    let copy = coordinator.bulk_copy(migration.id).await.unwrap();
    assert_eq!(copy.events_copied, 5);
    coordinator.enable_dual_write(migration.id).await.unwrap();
    let ids = h.write(2).await;
    assert!(
        h.target.ids(h.tenant).ends_with(&ids),
        "dual writes reach the target"
    );

    let readiness = coordinator.cutover_readiness(migration.id).await.unwrap();
    assert!(matches!(readiness.blockers[..], [NotReady::NoLockManager]));
    assert_eq!(readiness.lock_free, None);

    let error = coordinator.cutover(migration.id).await.unwrap_err();
    assert!(matches!(error, MigrationError::LockManagerRequired));
    assert_eq!(
        error.to_string(),
        "a lock manager is required for cutover: build the coordinator with `MigrationCoordinator::new` and a lock manager"
    );
    assert_eq!(
        coordinator.migration(migration.id).await.unwrap().phase,
        Phase::DualWrite
    );
    let route = h.route();
    assert_eq!(
        (route.store_id.as_str(), route.state),
        (SOURCE, RoutingState::DualWrite)
    );
    assert!(!h.is_paused());
    assert_eq!(h.routing.puts_of(RoutingState::CutoverPaused), 0);
}

#[tokio::test]
async fn cutover_outside_dual_write_is_a_state_error_naming_both_phases() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let migration = coordinator
        .start_migration(h.tenant, SOURCE, TARGET)
        .await
        .unwrap();
    coordinator.bulk_copy(migration.id).await.unwrap();
    let error = coordinator.cutover(migration.id).await.unwrap_err();
    let MigrationError::State(state) = error else {
        panic!("{error:?}");
    };
    assert_eq!(
        state,
        StateError {
            migration_id: migration.id,
            expected: Phase::DualWrite,
            actual: Phase::BulkCopy,
        }
    );
    assert!(
        state
            .to_string()
            .contains("`bulk_copy`; this step needs `dual_write`")
    );
    assert!(h.table.is_empty(), "refused before the lock");

    let missing = Uuid::new_v4();
    assert!(matches!(
        coordinator.cutover(missing).await,
        Err(MigrationError::NotFound { migration_id }) if migration_id == missing
    ));
}

#[tokio::test]
async fn starting_checks_the_stores_and_the_tenant() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    assert!(matches!(
        coordinator.start_migration(h.tenant, SOURCE, SOURCE).await,
        Err(MigrationError::SameStore { .. })
    ));
    assert!(matches!(
        coordinator
            .start_migration(h.tenant, SOURCE, "nowhere")
            .await,
        Err(MigrationError::UnknownStore { .. })
    ));
    assert!(matches!(
        coordinator.start_migration(h.tenant, TARGET, SOURCE).await,
        Err(MigrationError::NotRoutedToSource { .. })
    ));
    let first = coordinator
        .start_migration(h.tenant, SOURCE, TARGET)
        .await
        .unwrap();
    coordinator.bulk_copy(first.id).await.unwrap();
    assert!(matches!(
        coordinator.start_migration(h.tenant, SOURCE, TARGET).await,
        Err(MigrationError::TenantBusy { migration_id: Some(id), .. }) if id == first.id
    ));
    assert!(matches!(
        coordinator.bulk_copy(first.id).await,
        Ok(report) if report.events_copied == 0
    ));
    assert!(coordinator.enable_dual_write(first.id).await.is_ok());
    assert!(matches!(
        coordinator.bulk_copy(first.id).await,
        Err(MigrationError::State(StateError {
            expected: Phase::Pending,
            actual: Phase::DualWrite,
            ..
        }))
    ));
}
