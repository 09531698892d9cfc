//! Cutover, first step under the lock: read again what the lock protects (another
//! instance may have cut over meanwhile), check the route is the migration's, and move
//! the phase to `cutover`.

use locks_port::DistributedLock;
use uuid::Uuid;

use crate::coordinator::MigrationCoordinator;
use crate::error::{MigrationError, StateError};
use crate::ports::{
    EventStore, Migration, MigrationRepository, RoutingRepository, TenantRoute, WritePause,
};
use crate::{Phase, RoutingState, TransitionError};

/// What the re-read found.
pub(super) enum Recheck {
    /// The cutover is done (by another instance, or by this one before its record was
    /// written; the record is completed now).
    AlreadyCompleted(Migration),
    /// The cutover goes ahead, from this migration record and route.
    Proceed {
        migration: Migration,
        route: TenantRoute,
    },
}

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Reads the migration and route again, under the lock.
    ///
    /// # Errors
    /// A state or transition error when the migration or route is no longer one a
    /// cutover can start from, [`MigrationError::NotRoutedToSource`], unknown stores,
    /// port failures; nothing has changed then.
    pub(super) async fn recheck_under_lock(
        &self,
        migration_id: Uuid,
    ) -> Result<Recheck, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        let route = self.route(migration.tenant_id).await?;
        let flipped =
            route.state == RoutingState::Migrated && route.store_id == migration.target_store_id;
        match migration.phase {
            Phase::Completed => return Ok(Recheck::AlreadyCompleted(migration)),
            Phase::Cutover if flipped => {
                migration.phase = migration.phase.transition_to(Phase::Completed)?;
                self.save(&mut migration).await?;
                return Ok(Recheck::AlreadyCompleted(migration));
            }
            Phase::DualWrite | Phase::Cutover => {}
            actual => {
                return Err(StateError {
                    migration_id,
                    expected: Phase::DualWrite,
                    actual,
                }
                .into());
            }
        }
        if route.store_id != migration.source_store_id {
            return Err(MigrationError::NotRoutedToSource {
                tenant_id: migration.tenant_id,
                routed: route.store_id,
                expected: migration.source_store_id,
            });
        }
        if !matches!(
            route.state,
            RoutingState::DualWrite | RoutingState::CutoverPaused
        ) {
            return Err(TransitionError::Routing {
                from: route.state,
                to: RoutingState::CutoverPaused,
            }
            .into());
        }
        Ok(Recheck::Proceed { migration, route })
    }

    /// The phase `dual_write → cutover` (already there for a cutover run again).
    pub(super) async fn enter_cutover_phase(
        &self,
        migration: &mut Migration,
    ) -> Result<(), MigrationError> {
        if migration.phase == Phase::DualWrite {
            migration.phase = migration.phase.transition_to(Phase::Cutover)?;
            self.save(migration).await?;
        }
        Ok(())
    }
}
