//! Cutover, under pause: routing `cutover_paused` (so other processes refuse writes
//! too), and the pause budget every step under pause must fit in (500 ms by default).

use std::time::{Duration, Instant};

use locks_port::DistributedLock;

use super::{PausedCutover, millis, step};
use crate::RoutingState;
use crate::coordinator::MigrationCoordinator;
use crate::error::{CutoverError, CutoverTimeout};
use crate::ports::{
    EventStore, MigrationRepository, RepositoryError, RoutingRepository, TenantRoute, WritePause,
};

/// How long writes may stay paused, from the moment they were paused.
#[derive(Debug, Clone, Copy)]
pub(super) struct PauseBudget {
    paused_at: Instant,
    limit: Duration,
}

impl PauseBudget {
    /// A budget of `limit` from now.
    pub(super) fn start(limit: Duration) -> Self {
        Self {
            paused_at: Instant::now(),
            limit,
        }
    }

    /// The whole budget.
    pub(super) fn limit(&self) -> Duration {
        self.limit
    }

    /// [`CutoverError::Timeout`] if the budget is spent.
    pub(super) fn check(&self) -> Result<(), CutoverError> {
        let elapsed = self.paused_at.elapsed();
        if elapsed > self.limit {
            return Err(self.exceeded_after(elapsed));
        }
        Ok(())
    }

    /// The timeout error now that the budget ran out.
    pub(super) fn exceeded(&self) -> CutoverError {
        self.exceeded_after(self.paused_at.elapsed())
    }

    fn exceeded_after(&self, elapsed: Duration) -> CutoverError {
        CutoverTimeout {
            elapsed_ms: millis(elapsed),
            limit_ms: millis(self.limit),
        }
        .into()
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
    /// Routing state `cutover_paused`, by a compare-and-set from the route as it is now
    /// that writes are paused: read again, because before the pause a writer may have
    /// rolled back a `cutover_paused` left by a cutover that died (already so for a
    /// cutover run again, when no writer did).
    pub(super) async fn enter_cutover_paused(
        &self,
        paused: &mut PausedCutover<'_, S>,
    ) -> Result<(), CutoverError> {
        let routing = self.ports.routing();
        let failed = |source| CutoverError::RoutingUpdateFailed { source };
        let moved = |route: &TenantRoute| {
            failed(RepositoryError::new(
                "routing update",
                format!(
                    "the route moved before the pause: `{}` on `{}`",
                    route.state, route.store_id
                ),
            ))
        };
        let route = routing
            .get(paused.migration.tenant_id)
            .await
            .map_err(failed)?
            .unwrap_or_else(|| paused.route.clone());
        let ours = route.migration_id == Some(paused.migration.id)
            && route.store_id == paused.migration.source_store_id;
        let next = TenantRoute {
            state: RoutingState::CutoverPaused,
            ..route.clone()
        };
        match route.state {
            RoutingState::CutoverPaused if ours => {}
            RoutingState::DualWrite if ours => {
                if !routing
                    .compare_and_set(&route, next.clone())
                    .await
                    .map_err(failed)?
                {
                    return Err(moved(&route));
                }
            }
            _ => return Err(moved(&route)),
        }
        paused.route = next;
        step("routing_paused");
        Ok(())
    }
}
