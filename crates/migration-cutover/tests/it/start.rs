//! Starting a migration: one migration of a tenant at a time.

use migration_cutover::{MigrationError, Phase, RoutingState};

use crate::support::{Harness, SOURCE, TARGET, config};

/// A `pending` migration marks the tenant's route (still `normal`): a second
/// `start_migration` of the tenant is refused with `TenantBusy` naming the first, and
/// changes nothing (the PostgreSQL routing table refuses the takeover too, but only after
/// the second record was saved).
#[tokio::test]
async fn a_second_migration_of_a_tenant_with_a_pending_one_is_refused() {
    let h = Harness::new().await;
    let coordinator = h.coordinator(config());
    let first = coordinator
        .start_migration(h.tenant, SOURCE, TARGET)
        .await
        .unwrap();
    assert_eq!(h.route().state, RoutingState::Normal);

    let second = coordinator.start_migration(h.tenant, SOURCE, TARGET).await;
    match second {
        Err(MigrationError::TenantBusy {
            tenant_id,
            migration_id,
        }) => {
            assert_eq!(tenant_id, h.tenant);
            assert_eq!(migration_id, Some(first.id));
        }
        other => panic!("expected TenantBusy naming the pending migration, got {other:?}"),
    }
    let route = h.route();
    assert_eq!(
        route.migration_id,
        Some(first.id),
        "the route is still the first's"
    );
    // The first migration goes on.
    coordinator.bulk_copy(first.id).await.unwrap();
    assert_eq!(
        coordinator.migration(first.id).await.unwrap().phase,
        Phase::BulkCopy
    );
}
