//! Cutover, the last step under pause: point routing at the target and set it
//! `migrated` (pointing it back at the source if that fails); then, with writes about
//! to resume, the migration `completed`.

use locks_port::DistributedLock;
use tracing::error;

use super::PausedCutover;
use crate::coordinator::MigrationCoordinator;
use crate::error::{CutoverError, MigrationError};
use crate::ports::{
    EventStore, Migration, MigrationRepository, RoutingRepository, TenantRoute, WritePause,
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
    /// The routing flip. When setting `migrated` fails, routing is pointed back at the
    /// source before the failure is reported (`compensated` says whether that worked).
    pub(super) async fn flip_routing_to_target(
        &self,
        paused: &mut PausedCutover<'_, S>,
    ) -> Result<(), CutoverError> {
        let routing = self.ports.routing();
        let migration = paused.migration;
        let route = &mut paused.route;
        route.store_id = migration.target_store_id.clone();
        routing
            .put(route.clone())
            .await
            .map_err(|source| CutoverError::RoutingUpdateFailed {
                source,
                compensated: false,
            })?;
        let migrated = TenantRoute {
            state: RoutingState::Migrated,
            target_store_id: None,
            ..route.clone()
        };
        if let Err(error) = routing.put(migrated).await {
            // Compensate: point routing back at the source before reporting.
            route.store_id = migration.source_store_id.clone();
            let compensated = match routing.put(route.clone()).await {
                Ok(()) => true,
                Err(compensation) => {
                    error!(error = %compensation, "could not point routing back at the source");
                    false
                }
            };
            return Err(CutoverError::RoutingUpdateFailed {
                source: error,
                compensated,
            });
        }
        Ok(())
    }

    /// The migration `completed`, its last error cleared.
    ///
    /// # Errors
    /// [`MigrationError::Record`] when the record could not be saved: the flip took
    /// effect, and calling `cutover` again completes the record.
    pub(super) async fn record_completed(
        &self,
        migration: &mut Migration,
    ) -> Result<(), MigrationError> {
        migration.phase = migration.phase.transition_to(Phase::Completed)?;
        migration.last_error = None;
        if let Err(error) = self.save(migration).await {
            error!(error = %error, "cutover took effect but the migration record could not be completed");
            return Err(error);
        }
        Ok(())
    }
}
