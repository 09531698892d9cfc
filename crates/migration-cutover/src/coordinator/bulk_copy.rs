//! Step 2 of a migration: copy the tenant's history to the target (and, later, catch up
//! whatever the target is missing).

use locks_port::DistributedLock;
use tracing::{Instrument, info};
use uuid::Uuid;

use super::MigrationCoordinator;
use crate::copy::{measure_lag, sync_to};
use crate::error::{MigrationError, StateError};
use crate::ports::{EventStore, Migration, MigrationRepository, RoutingRepository, WritePause};
use crate::report::{CopyReport, SyncLag};
use crate::{Phase, RoutingState};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Copies the tenant's history to the target in batches, then runs catch-up
    /// rounds for what was written meanwhile. Moves `pending → bulk_copy` (routing
    /// `normal → bulk_copy`); may be called again in `bulk_copy` to resume, and goes
    /// on from the target's head.
    ///
    /// # Errors
    /// [`MigrationError::State`] unless `pending` or `bulk_copy`; a store failure
    /// (call again to resume).
    pub async fn bulk_copy(&self, migration_id: Uuid) -> Result<CopyReport, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        let span = step_span!("migration.bulk_copy", migration);
        async move {
            match migration.phase {
                Phase::Pending => {
                    let mut route = self.route_of(&migration).await?;
                    self.move_route(&mut route, RoutingState::BulkCopy).await?;
                    migration.phase = migration.phase.transition_to(Phase::BulkCopy)?;
                    self.save(&mut migration).await?;
                }
                Phase::BulkCopy => {}
                actual => {
                    return Err(StateError {
                        migration_id,
                        expected: Phase::Pending,
                        actual,
                    }
                    .into());
                }
            }
            self.copy_and_record(&mut migration, self.config.catch_up_rounds())
                .await
        }
        .instrument(span)
        .await
    }

    /// Copies to the target whatever it is missing (after a target outage, say), in
    /// `bulk_copy` or `dual_write`.
    ///
    /// # Errors
    /// [`MigrationError::State`] in any other phase; a store failure.
    pub async fn catch_up(&self, migration_id: Uuid) -> Result<CopyReport, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        let span = step_span!("migration.catch_up", migration);
        async move {
            if !matches!(migration.phase, Phase::BulkCopy | Phase::DualWrite) {
                return Err(StateError {
                    migration_id,
                    expected: Phase::DualWrite,
                    actual: migration.phase,
                }
                .into());
            }
            self.copy_and_record(&mut migration, self.config.catch_up_rounds())
                .await
        }
        .instrument(span)
        .await
    }

    /// How far the target is behind the source now.
    ///
    /// # Errors
    /// [`MigrationError::NotFound`], or a store failure.
    pub async fn sync_lag(&self, migration_id: Uuid) -> Result<SyncLag, MigrationError> {
        let migration = self.migration(migration_id).await?;
        let source = self.store(&migration.source_store_id)?;
        let target = self.store(&migration.target_store_id)?;
        Ok(measure_lag(migration.tenant_id, source, target).await?)
    }

    /// [`copy_rounds`](Self::copy_rounds), then the copied count added to the
    /// migration's record and saved.
    pub(super) async fn copy_and_record(
        &self,
        migration: &mut Migration,
        catch_up_rounds: u32,
    ) -> Result<CopyReport, MigrationError> {
        let report = self.copy_rounds(migration, catch_up_rounds).await?;
        migration.events_copied += report.events_copied;
        self.save(migration).await?;
        Ok(report)
    }

    /// Copy passes until the target has caught up or `catch_up_rounds` extra passes
    /// have run.
    async fn copy_rounds(
        &self,
        migration: &Migration,
        catch_up_rounds: u32,
    ) -> Result<CopyReport, MigrationError> {
        let tenant_id = migration.tenant_id;
        let source = self.store(&migration.source_store_id)?;
        let target = self.store(&migration.target_store_id)?;
        let mut report = CopyReport {
            events_copied: 0,
            rounds: 0,
            lag: measure_lag(tenant_id, source, target).await?,
        };
        while !report.lag.is_synced() && report.rounds <= catch_up_rounds {
            let copied = sync_to(
                tenant_id,
                source,
                target,
                report.lag.source_position,
                self.config.batch_size(),
            )
            .await?;
            report.events_copied += copied;
            report.rounds += 1;
            report.lag = measure_lag(tenant_id, source, target).await?;
            info!(
                round = report.rounds,
                copied,
                lag = report.lag.events(),
                "copy pass done"
            );
        }
        Ok(report)
    }
}
