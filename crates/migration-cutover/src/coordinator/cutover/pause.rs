//! Cutover step 4: pause the tenant's writes. From here on a failure rolls back.

use locks_port::DistributedLock;

use crate::coordinator::MigrationCoordinator;
use crate::error::CutoverError;
use crate::ports::{EventStore, Migration, MigrationRepository, RoutingRepository, WritePause};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Pauses the tenant's writes; the writes under way are waited for as the first
    /// step under pause, within the budget.
    pub(super) async fn pause_writes(
        &self,
        migration: &Migration,
    ) -> Result<P::Guard, CutoverError> {
        self.ports
            .pause()
            .pause(migration.tenant_id)
            .await
            .map_err(CutoverError::WritePauseFailed)
    }
}
