//! Step 3 of a migration: writes go to both stores.

use locks_port::DistributedLock;
use tracing::{Instrument, info};
use uuid::Uuid;

use super::MigrationCoordinator;
use crate::error::{MigrationError, StateError};
use crate::ports::{EventStore, MigrationRepository, RoutingRepository, WritePause};
use crate::report::CopyReport;
use crate::{Phase, RoutingState};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Switches to dual writes (`bulk_copy → dual_write`, routing too), then copies
    /// what reached the source before the switch.
    ///
    /// # Errors
    /// [`MigrationError::State`] unless `bulk_copy`; a port failure (call again).
    pub async fn enable_dual_write(
        &self,
        migration_id: Uuid,
    ) -> Result<CopyReport, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        let span = step_span!("migration.dual_write", migration);
        async move {
            if migration.phase != Phase::BulkCopy {
                return Err(StateError {
                    migration_id,
                    expected: Phase::BulkCopy,
                    actual: migration.phase,
                }
                .into());
            }
            let mut route = self.route_of(&migration).await?;
            self.move_route(&mut route, RoutingState::DualWrite).await?;
            migration.phase = migration.phase.transition_to(Phase::DualWrite)?;
            self.save(&mut migration).await?;
            let report = self.copy_and_record(&mut migration, 0).await?;
            info!(lag = report.lag.events(), "dual write enabled");
            Ok(report)
        }
        .instrument(span)
        .await
    }
}
