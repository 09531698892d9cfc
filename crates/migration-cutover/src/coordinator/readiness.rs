//! Before the cutover: whether it could go ahead now, changing nothing.

use locks_port::{DistributedLock, LockGuard};
use uuid::Uuid;

use super::{MigrationCoordinator, cutover_lock_key};
use crate::Phase;
use crate::copy::measure_lag;
use crate::error::{LagTooHigh, MigrationError};
use crate::ports::{EventStore, MigrationRepository, RoutingRepository, WritePause};
use crate::report::{CutoverReadiness, NotReady};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Whether a cutover could go ahead now: the phase, the lag, and whether the
    /// cutover lock is free. Changes nothing: the lock is tried and released at once.
    ///
    /// # Errors
    /// [`MigrationError::NotFound`], or the migration repository's failure (store
    /// and lock failures are reported as blockers).
    pub async fn cutover_readiness(
        &self,
        migration_id: Uuid,
    ) -> Result<CutoverReadiness, MigrationError> {
        let migration = self.migration(migration_id).await?;
        let mut blockers = Vec::new();
        if migration.phase != Phase::DualWrite {
            blockers.push(NotReady::Phase(migration.phase));
        }
        let source = self.store(&migration.source_store_id)?;
        let target = self.store(&migration.target_store_id)?;
        let lag = match measure_lag(migration.tenant_id, source, target).await {
            Ok(lag) => {
                if lag.events() > self.config.max_lag() {
                    blockers.push(NotReady::LagTooHigh(LagTooHigh {
                        current: lag.events(),
                        max: self.config.max_lag(),
                    }));
                }
                Some(lag)
            }
            Err(error) => {
                blockers.push(NotReady::LagUnknown(error));
                None
            }
        };
        let lock_free = match &self.lock_manager {
            None => {
                blockers.push(NotReady::NoLockManager);
                None
            }
            Some(locks) => match locks
                .try_acquire(&cutover_lock_key(migration.tenant_id))
                .await
            {
                Ok(Some(guard)) => {
                    guard.release().await;
                    Some(true)
                }
                Ok(None) => {
                    blockers.push(NotReady::LockBusy);
                    Some(false)
                }
                Err(error) => {
                    blockers.push(NotReady::LockProbeFailed(error));
                    None
                }
            },
        };
        Ok(CutoverReadiness {
            phase: migration.phase,
            lag,
            lock_free,
            blockers,
        })
    }
}
