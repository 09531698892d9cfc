//! Cutover, under pause: measure how far the target is behind, and refuse above the
//! allowed maximum (0 events by default).

use locks_port::DistributedLock;

use super::PausedCutover;
use crate::coordinator::MigrationCoordinator;
use crate::copy::measure_lag;
use crate::error::{CutoverError, LagTooHigh};
use crate::ports::{EventStore, MigrationRepository, RoutingRepository, WritePause};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// [`CutoverError::LagCalculationFailed`] or [`LagTooHigh`] unless the target is
    /// within the maximum lag.
    pub(super) async fn check_lag(
        &self,
        paused: &PausedCutover<'_, S>,
    ) -> Result<(), CutoverError> {
        let lag = measure_lag(paused.migration.tenant_id, paused.source, paused.target)
            .await
            .map_err(CutoverError::LagCalculationFailed)?;
        if lag.events() > self.config.max_lag() {
            return Err(LagTooHigh {
                current: lag.events(),
                max: self.config.max_lag(),
            }
            .into());
        }
        Ok(())
    }
}
