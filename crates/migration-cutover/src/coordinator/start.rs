//! Step 1 of a migration: record it and mark the tenant's route with it.

use locks_port::DistributedLock;
use time::OffsetDateTime;
use tracing::{Instrument, info, info_span};
use uuid::Uuid;

use super::MigrationCoordinator;
use crate::copy::measure_lag;
use crate::error::MigrationError;
use crate::ports::{
    EventStore, Migration, MigrationRepository, RoutingRepository, StoreId, TenantRoute, WritePause,
};
use crate::{Phase, RoutingState};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Starts moving `tenant_id` from `source` to `target`: records a `pending`
    /// migration and marks the tenant's route with it. The tenant must be routed to
    /// `source` (a tenant without a route gets one to `source`) and have no migration
    /// under way (not even a `pending` one, whose mark is on the `normal` route).
    ///
    /// # Errors
    /// [`MigrationError::SameStore`], [`UnknownStore`](MigrationError::UnknownStore),
    /// [`NotRoutedToSource`](MigrationError::NotRoutedToSource),
    /// [`TenantBusy`](MigrationError::TenantBusy),
    /// [`TargetAhead`](MigrationError::TargetAhead), or a port failure.
    pub async fn start_migration(
        &self,
        tenant_id: Uuid,
        source: impl Into<StoreId>,
        target: impl Into<StoreId>,
    ) -> Result<Migration, MigrationError> {
        let (source_id, target_id) = (source.into(), target.into());
        let migration_id = Uuid::new_v4();
        let span =
            info_span!("migration.start", migration_id = %migration_id, tenant_id = %tenant_id);
        async move {
            if source_id == target_id {
                return Err(MigrationError::SameStore {
                    store_id: source_id,
                });
            }
            let (source, target) = (self.store(&source_id)?, self.store(&target_id)?);
            let mut route = match self.ports.routing().get(tenant_id).await {
                Err(error) => return Err(MigrationError::Routing(error)),
                Ok(None) => TenantRoute::normal(tenant_id, source_id.clone()),
                Ok(Some(route)) => {
                    // A `normal` route marked with a migration is that migration's,
                    // still `pending` (abort clears the mark); a `migrated` one keeps the
                    // mark of the migration that completed.
                    let pending = route.state == RoutingState::Normal
                        && route.migration_id.is_some();
                    if pending
                        || !matches!(route.state, RoutingState::Normal | RoutingState::Migrated)
                    {
                        return Err(MigrationError::TenantBusy {
                            tenant_id,
                            migration_id: route.migration_id,
                        });
                    }
                    if route.store_id != source_id {
                        return Err(MigrationError::NotRoutedToSource {
                            tenant_id,
                            routed: route.store_id,
                            expected: source_id,
                        });
                    }
                    route
                }
            };
            let lag = measure_lag(tenant_id, source, target).await?;
            if lag.target_position > lag.source_position {
                return Err(MigrationError::TargetAhead {
                    tenant_id,
                    source_position: lag.source_position,
                    target_position: lag.target_position,
                });
            }
            let now = OffsetDateTime::now_utc();
            let mut migration = Migration {
                id: migration_id,
                tenant_id,
                source_store_id: source_id,
                target_store_id: target_id.clone(),
                phase: Phase::Pending,
                events_copied: 0,
                created_at: now,
                updated_at: now,
                last_error: None,
            };
            self.save(&mut migration).await?;
            route.state = route.state.transition_to(RoutingState::Normal)?;
            route.migration_id = Some(migration_id);
            route.target_store_id = Some(target_id);
            self.ports
                .routing()
                .put(route)
                .await
                .map_err(MigrationError::Routing)?;
            info!(source = %migration.source_store_id, target = %migration.target_store_id, "migration started");
            Ok(migration)
        }
        .instrument(span)
        .await
    }
}
