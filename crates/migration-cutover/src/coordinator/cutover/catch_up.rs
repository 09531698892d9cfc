//! Cutover, under pause: the final catch-up, copying everything the target is still
//! missing (no writes reach the source now).

use locks_port::DistributedLock;

use super::PausedCutover;
use crate::coordinator::MigrationCoordinator;
use crate::copy::sync_to;
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
    /// Copies the rest; returns how many events it copied.
    pub(super) async fn final_catch_up(
        &self,
        paused: &PausedCutover<'_, S>,
    ) -> Result<u64, CutoverError> {
        sync_to(
            paused.migration.tenant_id,
            paused.source,
            paused.target,
            u64::MAX,
            self.config.batch_size(),
        )
        .await
        .map_err(CutoverError::FinalSyncFailed)
    }
}
