//! Cutover, on any failure after the pause: routing back to the source in
//! `dual_write`, the migration back to `dual_write` with the reason recorded. Writes
//! resume afterwards, before the lock is released (see [`Held`](super::lock::Held)).

use locks_port::DistributedLock;
use tracing::{error, warn};

use super::millis;
use crate::coordinator::MigrationCoordinator;
use crate::error::{CutoverError, MigrationError};
use crate::ports::{
    EventStore, Migration, MigrationRepository, RepositoryError, RoutingRepository, TenantRoute,
    WritePause,
};
use crate::report::CutoverOutcome;
use crate::timer::{Elapsed, timeout};
use crate::{Phase, RoutingState};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Rolls back after `error`; bounded by the pause budget (writes are still
    /// paused). The outcome says whether the rollback itself worked.
    pub(super) async fn roll_back(
        &self,
        migration: &mut Migration,
        error: CutoverError,
    ) -> CutoverOutcome {
        warn!(reason = error.reason().as_str(), error = %error, "cutover failed; rolling back");
        let budget = self.config.pause_budget();
        let rolled_back = match timeout(
            budget,
            self.route_and_record_back_to_dual_write(migration, &error),
        )
        .await
        {
            Ok(result) => result,
            Err(Elapsed) => Err(MigrationError::Routing(RepositoryError::new(
                "cutover rollback",
                format!("did not finish within {} ms", millis(budget)),
            ))),
        };
        match rolled_back {
            Ok(()) => CutoverOutcome::RolledBack(error),
            Err(rollback) => {
                error!(error = %rollback, "cutover rollback failed");
                CutoverOutcome::RollbackFailed { error, rollback }
            }
        }
    }

    async fn route_and_record_back_to_dual_write(
        &self,
        migration: &mut Migration,
        error: &CutoverError,
    ) -> Result<(), MigrationError> {
        let route = self.route(migration.tenant_id).await?;
        let back = TenantRoute {
            tenant_id: migration.tenant_id,
            store_id: migration.source_store_id.clone(),
            state: RoutingState::DualWrite,
            migration_id: Some(migration.id),
            target_store_id: Some(migration.target_store_id.clone()),
        };
        if route.state != RoutingState::DualWrite {
            route.state.transition_to(RoutingState::DualWrite)?;
        }
        if route != back {
            self.ports
                .routing()
                .put(back)
                .await
                .map_err(MigrationError::Routing)?;
        }
        migration.phase = migration.phase.transition_to(Phase::DualWrite)?;
        migration.last_error = Some(error.to_string());
        self.save(migration).await
    }
}
