//! Cutover, on any failure after the pause: routing back to the source in
//! `dual_write`, the migration back to `dual_write` with the reason recorded. Writes
//! resume afterwards, before the lock is released (see [`Held`](super::lock::Held)).

use locks_port::DistributedLock;
use tracing::{error, warn};

use super::{millis, step};
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

    /// Routing back to `dual_write` on the source (one compare-and-set from the route
    /// as it is now), then the record. A route found `migrated` on the target means the
    /// flip took effect although its answer was lost: nothing is rolled back then, and
    /// `cutover` run again completes the record.
    async fn route_and_record_back_to_dual_write(
        &self,
        migration: &mut Migration,
        error: &CutoverError,
    ) -> Result<(), MigrationError> {
        let route = self.route(migration.tenant_id).await?;
        if route.state == RoutingState::Migrated && route.store_id == migration.target_store_id {
            return Err(MigrationError::AlreadyFlipped {
                migration_id: migration.id,
                tenant_id: migration.tenant_id,
                target: route.store_id,
            });
        }
        let back = TenantRoute {
            tenant_id: migration.tenant_id,
            store_id: migration.source_store_id.clone(),
            state: RoutingState::DualWrite,
            migration_id: Some(migration.id),
            target_store_id: Some(migration.target_store_id.clone()),
        };
        if route != back {
            let ours = route.migration_id == Some(migration.id)
                && route.store_id == migration.source_store_id
                && route.state == RoutingState::CutoverPaused;
            let unexpected = || MigrationError::UnexpectedRoute {
                migration_id: migration.id,
                tenant_id: migration.tenant_id,
                state: route.state,
                store_id: route.store_id.clone(),
                resolves: "the rollback found a route it did not write: call `cutover` or \
                           `abort` again",
            };
            if !ours {
                return Err(unexpected());
            }
            let rolled_back = self
                .ports
                .routing()
                .compare_and_set(&route, back)
                .await
                .map_err(MigrationError::Routing)?;
            if !rolled_back {
                return Err(unexpected());
            }
        }
        migration.phase = migration.phase.transition_to(Phase::DualWrite)?;
        migration.last_error = Some(error.to_string());
        self.save(migration).await?;
        step("rolled_back");
        Ok(())
    }
}
