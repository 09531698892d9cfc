//! Cutover steps 1 and 2: refuse unless the migration is in `dual_write` (or left in
//! `cutover` by an instance that stopped), and without a lock manager. Nothing has
//! changed when these refuse.

use locks_port::DistributedLock;

use crate::Phase;
use crate::coordinator::MigrationCoordinator;
use crate::error::{MigrationError, StateError};
use crate::ports::{EventStore, Migration, MigrationRepository, RoutingRepository, WritePause};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// The lock manager to take the cutover lock with, or why the cutover is refused.
    pub(super) fn refuse_unless_dual_write(
        &self,
        migration: &Migration,
    ) -> Result<&L, MigrationError> {
        if !matches!(migration.phase, Phase::DualWrite | Phase::Cutover) {
            return Err(StateError {
                migration_id: migration.id,
                expected: Phase::DualWrite,
                actual: migration.phase,
            }
            .into());
        }
        self.lock_manager
            .as_ref()
            .ok_or(MigrationError::LockManagerRequired)
    }
}
