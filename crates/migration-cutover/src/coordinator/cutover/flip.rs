//! Cutover, the last step under pause: the flip, routing `cutover_paused` on the source
//! to `migrated` on the target in **one** compare-and-set (so no crash can leave it
//! half-written); then, with writes about to resume, the migration `completed`.

use locks_port::DistributedLock;
use tracing::error;

use super::{PausedCutover, step};
use crate::RoutingState;
use crate::coordinator::MigrationCoordinator;
use crate::error::{CutoverError, MigrationError};
use crate::ports::{
    EventStore, Migration, MigrationRepository, RepositoryError, RoutingRepository, TenantRoute,
    WritePause,
};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// The routing flip: one compare-and-set from the `cutover_paused` route this
    /// cutover wrote to `migrated` on the target. A failure changed nothing (a lost
    /// answer is sorted out by the rollback, which reads the route again).
    pub(super) async fn flip_routing_to_target(
        &self,
        paused: &mut PausedCutover<'_, S>,
    ) -> Result<(), CutoverError> {
        let migrated = TenantRoute {
            store_id: paused.migration.target_store_id.clone(),
            state: RoutingState::Migrated,
            target_store_id: None,
            ..paused.route.clone()
        };
        let flipped = self
            .ports
            .routing()
            .compare_and_set(&paused.route, migrated.clone())
            .await
            .map_err(|source| CutoverError::RoutingUpdateFailed { source })?;
        if !flipped {
            return Err(CutoverError::RoutingUpdateFailed {
                source: RepositoryError::new(
                    "routing flip",
                    "the route is no longer the `cutover_paused` route this cutover wrote",
                ),
            });
        }
        paused.route = migrated;
        step("flipped");
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
        if let Err(error) = self.complete_record(migration).await {
            error!(error = %error, "cutover took effect but the migration record could not be completed");
            return Err(error);
        }
        step("recorded");
        Ok(())
    }
}
