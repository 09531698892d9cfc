//! Cutover, under pause: check the target store answers before routing to it.

use locks_port::DistributedLock;

use super::PausedCutover;
use crate::coordinator::MigrationCoordinator;
use crate::error::CutoverError;
use crate::ports::{EventStore, MigrationRepository, RoutingRepository, WritePause};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// [`CutoverError::TargetHealthCheckFailed`] unless the target answers a ping.
    pub(super) async fn check_target_health(
        &self,
        paused: &PausedCutover<'_, S>,
    ) -> Result<(), CutoverError> {
        let target = paused.target;
        target
            .store
            .ping()
            .await
            .map_err(|error| CutoverError::TargetHealthCheckFailed(target.fail(error)))
    }
}
