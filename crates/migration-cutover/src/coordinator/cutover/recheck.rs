//! Cutover, first step under the lock: read again what the lock protects (another
//! instance may have cut over meanwhile, or died half-way), resolve what a dead instance
//! left, check the route is the migration's, and move the phase to `cutover`.

use locks_port::DistributedLock;
use uuid::Uuid;

use crate::coordinator::MigrationCoordinator;
use crate::error::{MigrationError, StateError};
use crate::ports::{
    EventStore, Migration, MigrationRepository, RoutingRepository, TenantRoute, WritePause,
};
use crate::{Phase, RoutingState};

/// What the re-read found.
pub(super) enum Recheck {
    /// The cutover is done (by another instance, or by one that died before its record
    /// was written; the record is completed now).
    AlreadyCompleted(Migration),
    /// The cutover goes ahead, from this migration record and route.
    Proceed {
        migration: Migration,
        route: TenantRoute,
    },
}

/// What resolves a route a cutover of `migration` cannot start from.
pub(in crate::coordinator) fn route_resolution(
    migration: &Migration,
    route: &TenantRoute,
) -> &'static str {
    let on_source = route.store_id == migration.source_store_id;
    let on_target = route.store_id == migration.target_store_id;
    if route.migration_id.is_some() && route.migration_id != Some(migration.id) {
        return "the route belongs to another migration: finish or abort that one first";
    }
    match route.state {
        RoutingState::Migrated if on_target => {
            "the tenant is migrated already while this migration is not in `cutover`: abort it"
        }
        RoutingState::Normal | RoutingState::BulkCopy if on_source => {
            "dual write is not enabled on the route: call `enable_dual_write`, or `abort`"
        }
        _ if !on_source && !on_target => {
            "the tenant is routed to neither the migration's source nor its target: abort \
             the migration, or set the route by hand"
        }
        _ => "the route does not belong to this migration's cutover: abort the migration",
    }
}

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Reads the migration and route again, under the lock, and resolves what a cutover
    /// that died left:
    ///
    /// | phase | route | what this does |
    /// | --- | --- | --- |
    /// | `completed` | any | nothing: [`Recheck::AlreadyCompleted`] |
    /// | `cutover` | `migrated` on the target | completes the record (the flip took effect) |
    /// | `cutover` | `cutover_paused` on the target (half-written by a two-write flip of an older version) | completes the flip (one compare-and-set), then the record |
    /// | `dual_write`, `cutover` | `dual_write` or `cutover_paused` on the source | runs the cutover (again) |
    ///
    /// # Errors
    /// [`StateError`] in another phase; [`MigrationError::UnexpectedRoute`] (naming the
    /// state found and what resolves it) for any other route; port failures. Nothing
    /// has changed then.
    pub(super) async fn recheck_under_lock(
        &self,
        migration_id: Uuid,
    ) -> Result<Recheck, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        let route = self.route(migration.tenant_id).await?;
        match migration.phase {
            Phase::Completed => return Ok(Recheck::AlreadyCompleted(migration)),
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
        let ours = route.migration_id == Some(migration.id);
        let on_source = route.store_id == migration.source_store_id;
        let on_target = route.store_id == migration.target_store_id;
        let unexpected = |resolves| MigrationError::UnexpectedRoute {
            migration_id,
            tenant_id: migration.tenant_id,
            state: route.state,
            store_id: route.store_id.clone(),
            resolves,
        };
        match route.state {
            RoutingState::Migrated if on_target && migration.phase == Phase::Cutover => {
                self.complete_record(&mut migration).await?;
                Ok(Recheck::AlreadyCompleted(migration))
            }
            RoutingState::CutoverPaused
                if on_target && ours && migration.phase == Phase::Cutover =>
            {
                let migrated = TenantRoute {
                    state: RoutingState::Migrated,
                    target_store_id: None,
                    ..route.clone()
                };
                let finished = self
                    .ports
                    .routing()
                    .compare_and_set(&route, migrated)
                    .await
                    .map_err(MigrationError::Routing)?;
                if !finished {
                    return Err(unexpected(
                        "the route moved while the half-written flip was completed: call \
                         `cutover` again",
                    ));
                }
                tracing::warn!(tenant_id = %migration.tenant_id, "completed a half-written flip");
                self.complete_record(&mut migration).await?;
                Ok(Recheck::AlreadyCompleted(migration))
            }
            RoutingState::DualWrite | RoutingState::CutoverPaused if on_source && ours => {
                Ok(Recheck::Proceed { migration, route })
            }
            _ => Err(unexpected(route_resolution(&migration, &route))),
        }
    }

    /// The record of a migration whose flip took effect: `completed`.
    pub(super) async fn complete_record(
        &self,
        migration: &mut Migration,
    ) -> Result<(), MigrationError> {
        migration.phase = migration.phase.transition_to(Phase::Completed)?;
        migration.last_error = None;
        self.save(migration).await
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
