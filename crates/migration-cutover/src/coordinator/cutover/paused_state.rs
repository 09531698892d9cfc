//! Cutover, under pause: routing `cutover_paused` (so other processes refuse writes
//! too), and the pause budget every step under pause must fit in (500 ms by default).

use std::time::{Duration, Instant};

use locks_port::DistributedLock;

use super::{PausedCutover, millis};
use crate::RoutingState;
use crate::coordinator::MigrationCoordinator;
use crate::error::{CutoverError, CutoverTimeout};
use crate::ports::{EventStore, MigrationRepository, RoutingRepository, WritePause};

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
    /// Routing state `cutover_paused` (already so for a cutover run again).
    pub(super) async fn enter_cutover_paused(
        &self,
        paused: &mut PausedCutover<'_, S>,
    ) -> Result<(), CutoverError> {
        if paused.route.state != RoutingState::CutoverPaused {
            paused.route.state = RoutingState::CutoverPaused;
            self.ports
                .routing()
                .put(paused.route.clone())
                .await
                .map_err(|source| CutoverError::RoutingUpdateFailed {
                    source,
                    compensated: false,
                })?;
        }
        Ok(())
    }
}
