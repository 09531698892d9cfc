//! Stopping a migration before its cutover: routing back to the source, the record
//! `aborted`.

use locks_port::{DistributedLock, LockGuard};
use tracing::{Instrument, info};
use uuid::Uuid;

use super::{MigrationCoordinator, cutover_lock_key};
use crate::error::{MigrationError, StateError};
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
    /// Stops the migration: routing back to the source in `normal`, the migration
    /// `aborted`. The target keeps what was copied. Takes the cutover lock when the
    /// coordinator has a lock manager, so it cannot interleave with a cutover.
    ///
    /// A migration left in `cutover` by a cutover that died is aborted too, as long as
    /// the flip had not taken effect (the route is still on the source, in `dual_write`
    /// or `cutover_paused`); this needs the lock manager, so that no live cutover is
    /// running.
    ///
    /// # Errors
    /// [`MigrationError::Transition`] for a finished migration;
    /// [`MigrationError::AlreadyFlipped`] in `cutover` with the route `migrated` on the
    /// target, and [`MigrationError::UnexpectedRoute`] with it half-flipped (in both
    /// cases call `cutover` again, which completes the migration);
    /// [`MigrationError::State`] in `cutover` on a coordinator without a lock manager;
    /// [`MigrationError::Lock`] when the lock could not be taken; port failures.
    ///
    /// # Cancel safety
    /// Dropping the future releases the lock (its guard is dropped); the routing may
    /// then be back on the source with the record not yet `aborted`: call `abort` again.
    pub async fn abort(&self, migration_id: Uuid) -> Result<Migration, MigrationError> {
        let migration = self.migration(migration_id).await?;
        let span = step_span!("migration.abort", migration);
        async move {
            let lock = match &self.lock_manager {
                None => None,
                Some(locks) => {
                    let key = cutover_lock_key(migration.tenant_id);
                    Some(locks.acquire(&key, self.cutover_lock_options()).await?)
                }
            };
            let result = self.abort_under_lock(migration_id).await;
            if let Some(lock) = lock {
                lock.release().await;
            }
            result
        }
        .instrument(span)
        .await
    }

    /// The abort itself, with the cutover lock held (when there is a lock manager). The
    /// route goes back by a compare-and-set from the route as read: one that moved in
    /// between (the flip of a cutover that lost its lock while the flip's statement was
    /// on its way, or a writer rolling an abandoned pause back) is read again and decided
    /// on afresh, so a flip that took effect is refused, never overwritten.
    async fn abort_under_lock(&self, migration_id: Uuid) -> Result<Migration, MigrationError> {
        // Each of those writers moves the route at most once while the lock is held here.
        const READS: usize = 3;
        let mut read = 1;
        loop {
            let mut migration = self.migration(migration_id).await?;
            let next = migration.phase.transition_to(Phase::Aborted)?;
            let route = self.route(migration.tenant_id).await?;
            if migration.phase == Phase::Cutover {
                self.refuse_abort_in_cutover(&migration, &route)?;
            }
            if route.migration_id == Some(migration.id) {
                let normal =
                    TenantRoute::normal(migration.tenant_id, migration.source_store_id.clone());
                let set = (self.ports.routing().compare_and_set(&route, normal).await)
                    .map_err(MigrationError::Routing)?;
                if !set && read < READS {
                    read += 1;
                    continue;
                }
                if !set {
                    return Err(MigrationError::UnexpectedRoute {
                        migration_id,
                        tenant_id: migration.tenant_id,
                        state: route.state,
                        store_id: route.store_id,
                        resolves: "the route kept moving while the abort ran: call `abort` again",
                    });
                }
            }
            migration.phase = next;
            self.save(&mut migration).await?;
            info!("migration aborted");
            return Ok(migration);
        }
    }

    /// Why a migration left in `cutover` cannot be aborted, if it cannot.
    fn refuse_abort_in_cutover(
        &self,
        migration: &Migration,
        route: &TenantRoute,
    ) -> Result<(), MigrationError> {
        if self.lock_manager.is_none() {
            return Err(StateError {
                migration_id: migration.id,
                expected: Phase::DualWrite,
                actual: migration.phase,
            }
            .into());
        }
        if route.store_id != migration.target_store_id {
            return Ok(());
        }
        if route.state == RoutingState::Migrated {
            return Err(MigrationError::AlreadyFlipped {
                migration_id: migration.id,
                tenant_id: migration.tenant_id,
                target: route.store_id.clone(),
            });
        }
        Err(MigrationError::UnexpectedRoute {
            migration_id: migration.id,
            tenant_id: migration.tenant_id,
            state: route.state,
            store_id: route.store_id.clone(),
            resolves: "the flip is half-written (two writes, by an older version) and the \
                       target holds every event: call `cutover` again to complete it",
        })
    }
}
