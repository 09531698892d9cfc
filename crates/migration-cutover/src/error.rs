//! The errors of migration steps, of the cutover, and of routed writes.

use locks_port::{LockAcquisitionError, LockLostError};
use uuid::Uuid;

use crate::ports::{RepositoryError, StoreError, StoreId, WritesPaused};
use crate::{ConfigError, Phase, RoutingState, TransitionError};

/// A store operation failed; names the store.
#[derive(Debug, thiserror::Error)]
#[error("store `{store_id}`: {error}")]
pub struct StoreFailure {
    /// The store that failed.
    pub store_id: StoreId,
    /// What it said.
    #[source]
    pub error: StoreError,
}

/// A step needs the migration in another phase.
///
/// ```
/// use migration_cutover::{Phase, StateError};
/// use uuid::Uuid;
///
/// let error = StateError { migration_id: Uuid::nil(), expected: Phase::DualWrite, actual: Phase::BulkCopy };
/// assert_eq!(
///     error.to_string(),
///     "migration 00000000-0000-0000-0000-000000000000 is in phase `bulk_copy`; this step needs `dual_write`"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("migration {migration_id} is in phase `{actual}`; this step needs `{expected}`")]
pub struct StateError {
    /// The migration.
    pub migration_id: Uuid,
    /// The phase the step needs.
    pub expected: Phase,
    /// The phase it is in.
    pub actual: Phase,
}

/// The paused window of a cutover outlasted its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cutover exceeded its pause budget: {elapsed_ms} ms elapsed, limit {limit_ms} ms")]
pub struct CutoverTimeout {
    /// How long writes had been paused when the cutover gave up.
    pub elapsed_ms: u64,
    /// The pause budget.
    pub limit_ms: u64,
}

/// The target was too far behind the source for a cutover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sync lag of {current} events is above the allowed maximum of {max}")]
pub struct LagTooHigh {
    /// The lag measured, in events.
    pub current: u64,
    /// The largest lag allowed.
    pub max: u64,
}

/// Why a cutover failed (and was rolled back), named for what the caller can do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CutoverError {
    /// The paused window outlasted its budget: retry at a quieter time, or give the
    /// cutover a larger budget.
    #[error(transparent)]
    Timeout(#[from] CutoverTimeout),
    /// The target is behind: catch up (`catch_up`) and retry.
    #[error(transparent)]
    LagTooHigh(#[from] LagTooHigh),
    /// A store did not give its position: retry once it answers.
    #[error("could not calculate the sync lag: {0}")]
    LagCalculationFailed(#[source] StoreFailure),
    /// The final catch-up failed: retry once both stores answer.
    #[error("final catch-up failed: {0}")]
    FinalSyncFailed(#[source] StoreFailure),
    /// The target did not answer its health check: fix it and retry.
    #[error("target store health check failed: {0}")]
    TargetHealthCheckFailed(#[source] StoreFailure),
    /// Writing the routing table failed, or found the route moved by someone else.
    /// Every routing transition is one compare-and-set, so a failed one changed nothing
    /// (if its answer was lost, the rollback reads the route again and says what it found).
    #[error("routing update failed: {source}")]
    RoutingUpdateFailed {
        /// The routing repository's error.
        #[source]
        source: RepositoryError,
    },
    /// Writes could not be paused: retry once the pause backend answers.
    #[error("could not pause writes: {0}")]
    WritePauseFailed(#[source] RepositoryError),
    /// The cutover lock was lost (its session ended) before the flip: another instance
    /// may hold it now, so this one rolled back instead of flipping: retry.
    #[error("the cutover lock was lost before the flip: {0}")]
    LockLost(#[source] LockLostError),
}

impl CutoverError {
    /// The kind of failure, as a value to match or log.
    #[must_use]
    pub fn reason(&self) -> CutoverFailureReason {
        match self {
            Self::Timeout(_) => CutoverFailureReason::Timeout,
            Self::LagTooHigh(_) => CutoverFailureReason::LagTooHigh,
            Self::LagCalculationFailed(_) => CutoverFailureReason::LagCalculationFailed,
            Self::FinalSyncFailed(_) => CutoverFailureReason::FinalSyncFailed,
            Self::TargetHealthCheckFailed(_) => CutoverFailureReason::TargetHealthCheckFailed,
            Self::RoutingUpdateFailed { .. } => CutoverFailureReason::RoutingUpdateFailed,
            Self::WritePauseFailed(_) => CutoverFailureReason::WritePauseFailed,
            Self::LockLost(_) => CutoverFailureReason::LockLost,
        }
    }
}

/// The kind of a [`CutoverError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CutoverFailureReason {
    /// [`CutoverError::Timeout`].
    Timeout,
    /// [`CutoverError::LagTooHigh`].
    LagTooHigh,
    /// [`CutoverError::LagCalculationFailed`].
    LagCalculationFailed,
    /// [`CutoverError::FinalSyncFailed`].
    FinalSyncFailed,
    /// [`CutoverError::TargetHealthCheckFailed`].
    TargetHealthCheckFailed,
    /// [`CutoverError::RoutingUpdateFailed`].
    RoutingUpdateFailed,
    /// [`CutoverError::WritePauseFailed`].
    WritePauseFailed,
    /// [`CutoverError::LockLost`].
    LockLost,
}

impl CutoverFailureReason {
    /// A stable snake-case name (`lag_too_high`) for logs and metrics.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::LagTooHigh => "lag_too_high",
            Self::LagCalculationFailed => "lag_calculation_failed",
            Self::FinalSyncFailed => "final_sync_failed",
            Self::TargetHealthCheckFailed => "target_health_check_failed",
            Self::RoutingUpdateFailed => "routing_update_failed",
            Self::WritePauseFailed => "write_pause_failed",
            Self::LockLost => "lock_lost",
        }
    }
}

/// A migration step could not run. Nothing was changed unless the variant says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationError {
    /// No migration has this id.
    #[error("migration {migration_id} not found")]
    NotFound {
        /// The id asked for.
        migration_id: Uuid,
    },
    /// The migration is in the wrong phase for this step.
    #[error(transparent)]
    State(#[from] StateError),
    /// The step would break a state machine (see [`Phase`] and
    /// [`RoutingState`](crate::RoutingState)).
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// `cutover` was called on a coordinator built without a lock manager: build it
    /// with [`MigrationCoordinator::new`](crate::MigrationCoordinator::new).
    #[error(
        "a lock manager is required for cutover: build the coordinator with `MigrationCoordinator::new` and a lock manager"
    )]
    LockManagerRequired,
    /// The lock serializing this step on the tenant could not be taken: retry later.
    #[error(transparent)]
    Lock(#[from] LockAcquisitionError),
    /// No store is registered under this id: register it in the [`Stores`](crate::Stores).
    #[error("no store is registered as `{store_id}`")]
    UnknownStore {
        /// The id asked for.
        store_id: StoreId,
    },
    /// The source and the target are the same store.
    #[error("source and target are the same store `{store_id}`")]
    SameStore {
        /// The store.
        store_id: StoreId,
    },
    /// The tenant is routed to another store than the migration's source.
    #[error("tenant {tenant_id} is routed to `{routed}`, not to the source `{expected}`")]
    NotRoutedToSource {
        /// The tenant.
        tenant_id: Uuid,
        /// Where it is routed.
        routed: StoreId,
        /// The migration's source.
        expected: StoreId,
    },
    /// The cutover (or abort) found the tenant's route in a state it cannot start from;
    /// the text names the state found and what resolves it.
    #[error(
        "migration {migration_id}: tenant {tenant_id}'s route is `{state}` on `{store_id}`; {resolves}"
    )]
    UnexpectedRoute {
        /// The migration.
        migration_id: Uuid,
        /// The tenant.
        tenant_id: Uuid,
        /// The route's state.
        state: RoutingState,
        /// The store the route points at.
        store_id: StoreId,
        /// What resolves it.
        resolves: &'static str,
    },
    /// `abort` found the flip done: the migration is in `cutover` and the tenant is
    /// routed to the target in `migrated`. Events may have been written to the target
    /// only, so the migration cannot be aborted; `cutover` completes the record.
    #[error(
        "migration {migration_id} is in phase `cutover` and tenant {tenant_id} is already routed to \
         the target `{target}` (`migrated`): the flip took effect and cannot be aborted; \
         call `cutover` again to complete the record"
    )]
    AlreadyFlipped {
        /// The migration.
        migration_id: Uuid,
        /// The tenant.
        tenant_id: Uuid,
        /// The target, where the tenant is routed.
        target: StoreId,
    },
    /// The tenant has a migration under way already: finish or abort it first.
    #[error(
        "tenant {tenant_id} has a migration under way already{}: finish or abort it first",
        migration_id.map_or(String::new(), |id| format!(" ({id})"))
    )]
    TenantBusy {
        /// The tenant.
        tenant_id: Uuid,
        /// The migration under way, if the route names it.
        migration_id: Option<Uuid>,
    },
    /// The tenant has no route (the step needs one).
    #[error("tenant {tenant_id} has no route")]
    NoRoute {
        /// The tenant.
        tenant_id: Uuid,
    },
    /// The target holds more of the tenant's events than the source: it is not a copy
    /// of the source and cannot become one.
    #[error(
        "target holds {target_position} events of tenant {tenant_id}, more than the source's {source_position}"
    )]
    TargetAhead {
        /// The tenant.
        tenant_id: Uuid,
        /// The source's head.
        source_position: u64,
        /// The target's head.
        target_position: u64,
    },
    /// A store failed: retry once it answers.
    #[error(transparent)]
    Store(#[from] StoreFailure),
    /// The routing repository failed: retry once it answers.
    #[error("routing repository: {0}")]
    Routing(#[source] RepositoryError),
    /// The migration repository failed: retry once it answers. After a cutover this
    /// means the routing flip took effect but the record still says `cutover`;
    /// calling `cutover` again completes the record.
    #[error("migration repository: {0}")]
    Record(#[source] RepositoryError),
    /// An invalid setting.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A write through the [`WriteRouter`](crate::WriteRouter) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The tenant's writes stayed paused for the write's whole timeout: retry.
    #[error(transparent)]
    Paused(#[from] WritesPaused),
    /// The tenant has no route: give it one.
    #[error("tenant {tenant_id} has no route")]
    NoRoute {
        /// The tenant.
        tenant_id: Uuid,
    },
    /// The tenant is routed to a store that is not registered.
    #[error("tenant is routed to `{store_id}`, which is not registered")]
    UnknownStore {
        /// The store.
        store_id: StoreId,
    },
    /// The store refused or failed the write: nothing was written.
    #[error(transparent)]
    Store(StoreFailure),
    /// The write was sent and its commit asked for, but the answer was lost (the
    /// connection broke): the events **may or may not** be stored. This is not "not
    /// written": retry the same events (the same ids), through the router, until the
    /// answer is a receipt; an append of events that are stored already lands nothing
    /// and answers with their position, so they end up stored exactly once. Do not make
    /// new events (new ids) for the retry.
    #[error("uncertain: {0}")]
    CommitUncertain(#[source] StoreFailure),
    /// The routing repository failed: nothing was written.
    #[error("routing repository: {0}")]
    Routing(#[source] RepositoryError),
}

impl From<StoreFailure> for WriteError {
    /// [`WriteError::CommitUncertain`] for [`StoreError::CommitUncertain`],
    /// [`WriteError::Store`] for the others.
    fn from(failure: StoreFailure) -> Self {
        if matches!(failure.error, StoreError::CommitUncertain { .. }) {
            Self::CommitUncertain(failure)
        } else {
            Self::Store(failure)
        }
    }
}

impl WriteError {
    /// Whether the write's outcome is unknown ([`WriteError::CommitUncertain`]): retry
    /// the same events, which is idempotent.
    #[must_use]
    pub fn is_uncertain(&self) -> bool {
        matches!(self, Self::CommitUncertain(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_numbers() {
        let timeout = CutoverTimeout {
            elapsed_ms: 612,
            limit_ms: 500,
        };
        assert_eq!(
            timeout.to_string(),
            "cutover exceeded its pause budget: 612 ms elapsed, limit 500 ms"
        );
        let lag = LagTooHigh { current: 3, max: 0 };
        assert_eq!(
            CutoverError::from(lag).to_string(),
            "sync lag of 3 events is above the allowed maximum of 0"
        );
        assert_eq!(CutoverError::from(lag).reason().as_str(), "lag_too_high");
        let routing = CutoverError::RoutingUpdateFailed {
            source: RepositoryError::new("routing update", "disk full"),
        };
        assert_eq!(
            routing.to_string(),
            "routing update failed: routing update failed: disk full"
        );
        assert!(
            MigrationError::LockManagerRequired
                .to_string()
                .contains("lock manager is required for cutover")
        );
        let (tenant_id, id) = (Uuid::nil(), Uuid::from_u128(7));
        let busy = MigrationError::TenantBusy {
            tenant_id,
            migration_id: Some(id),
        };
        assert_eq!(
            busy.to_string(),
            format!(
                "tenant {tenant_id} has a migration under way already ({id}): finish or abort \
                 it first"
            )
        );
        let unnamed = MigrationError::TenantBusy {
            tenant_id,
            migration_id: None,
        };
        assert!(
            unnamed
                .to_string()
                .ends_with("under way already: finish or abort it first")
        );
    }
}
