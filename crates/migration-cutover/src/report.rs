//! What migration steps report: lag, copy reports, cutover results, readiness.

use std::fmt;
use std::time::Duration;

use locks_port::LockAcquisitionError;
use uuid::Uuid;

use crate::Phase;
use crate::error::{CutoverError, LagTooHigh, MigrationError, StoreFailure};
use crate::ports::StoreId;

/// How far the target is behind the source, from the two stores' head positions.
///
/// ```
/// use migration_cutover::SyncLag;
///
/// let lag = SyncLag { source_position: 120, target_position: 117 };
/// assert_eq!(lag.events(), 3);
/// assert!(!lag.is_synced());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SyncLag {
    /// The head of the tenant's stream in the source.
    pub source_position: u64,
    /// The head of the tenant's stream in the target.
    pub target_position: u64,
}

impl SyncLag {
    /// Events in the source that the target does not have yet.
    #[must_use]
    pub const fn events(&self) -> u64 {
        self.source_position.saturating_sub(self.target_position)
    }

    /// Whether the target has every event of the source.
    #[must_use]
    pub const fn is_synced(&self) -> bool {
        self.events() == 0
    }
}

impl fmt::Display for SyncLag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} events (source at {}, target at {})",
            self.events(),
            self.source_position,
            self.target_position
        )
    }
}

/// What a copy step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyReport {
    /// Events appended to the target by this step.
    pub events_copied: u64,
    /// Copy passes run (the first pass and the catch-up rounds).
    pub rounds: u32,
    /// The lag when the step ended.
    pub lag: SyncLag,
}

/// How a cutover call ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum CutoverOutcome {
    /// This call flipped the tenant to the target.
    Completed,
    /// Another instance had completed the cutover by the time this one held the lock;
    /// nothing was changed.
    AlreadyCompleted,
    /// The cutover lock could not be taken (another instance holds it, or the lock
    /// backend failed); nothing was changed.
    LockNotAcquired(LockAcquisitionError),
    /// A step failed; routing is back on the source in `dual_write`, the migration back
    /// in `dual_write`, and writes resumed.
    RolledBack(CutoverError),
    /// A step failed and so did the rollback. Writes resumed; the migration may be left
    /// in `cutover` and routing in `cutover_paused`; calling `cutover` again resolves it.
    RollbackFailed {
        /// Why the cutover failed.
        error: CutoverError,
        /// Why the rollback failed.
        rollback: MigrationError,
    },
}

/// The result of [`MigrationCoordinator::cutover`](crate::MigrationCoordinator::cutover).
///
/// `success` only when this call flipped the routing; every other outcome says why
/// not in [`message`](CutoverResult::message).
#[derive(Debug)]
pub struct CutoverResult {
    migration_id: Uuid,
    tenant_id: Uuid,
    target_store_id: StoreId,
    outcome: CutoverOutcome,
    duration: Duration,
    events_synced: u64,
}

impl CutoverResult {
    pub(crate) fn new(
        migration_id: Uuid,
        tenant_id: Uuid,
        target_store_id: StoreId,
        outcome: CutoverOutcome,
        duration: Duration,
        events_synced: u64,
    ) -> Self {
        Self {
            migration_id,
            tenant_id,
            target_store_id,
            outcome,
            duration,
            events_synced,
        }
    }

    /// Whether this call completed the cutover.
    #[must_use]
    pub fn success(&self) -> bool {
        matches!(self.outcome, CutoverOutcome::Completed)
    }

    /// Whether a failed step was rolled back (successfully or not).
    #[must_use]
    pub fn rolled_back(&self) -> bool {
        matches!(
            self.outcome,
            CutoverOutcome::RolledBack(_) | CutoverOutcome::RollbackFailed { .. }
        )
    }

    /// How the call ended.
    #[must_use]
    pub fn outcome(&self) -> &CutoverOutcome {
        &self.outcome
    }

    /// Consumes the result for its outcome.
    #[must_use]
    pub fn into_outcome(self) -> CutoverOutcome {
        self.outcome
    }

    /// The failed step's error, when a step failed.
    #[must_use]
    pub fn error(&self) -> Option<&CutoverError> {
        match &self.outcome {
            CutoverOutcome::RolledBack(error) | CutoverOutcome::RollbackFailed { error, .. } => {
                Some(error)
            }
            _ => None,
        }
    }

    /// How long the call took, waiting for the lock included.
    #[must_use]
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Events the final catch-up copied while writes were paused.
    #[must_use]
    pub fn events_synced(&self) -> u64 {
        self.events_synced
    }

    /// The migration.
    #[must_use]
    pub fn migration_id(&self) -> Uuid {
        self.migration_id
    }

    /// The tenant.
    #[must_use]
    pub fn tenant_id(&self) -> Uuid {
        self.tenant_id
    }

    /// What happened, in a sentence. A lock failure reads
    /// `Failed to acquire cutover lock: Failed to acquire lock 'cutover:…': Timeout after 0.5s`.
    #[must_use]
    pub fn message(&self) -> String {
        let tenant = self.tenant_id;
        let target = &self.target_store_id;
        match &self.outcome {
            CutoverOutcome::Completed => {
                format!("Cutover completed: tenant {tenant} is now served by `{target}`")
            }
            CutoverOutcome::AlreadyCompleted => format!(
                "Cutover already completed by another instance: tenant {tenant} is served by `{target}`"
            ),
            CutoverOutcome::LockNotAcquired(error) => {
                format!("Failed to acquire cutover lock: {error}")
            }
            CutoverOutcome::RolledBack(error) => {
                format!("Cutover failed and was rolled back: {error}")
            }
            CutoverOutcome::RollbackFailed { error, rollback } => {
                format!("Cutover failed: {error}; the rollback failed too: {rollback}")
            }
        }
    }
}

impl fmt::Display for CutoverResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

/// Something that would stop a cutover now.
#[derive(Debug)]
#[non_exhaustive]
pub enum NotReady {
    /// The migration is not in `dual_write`.
    Phase(Phase),
    /// The target is too far behind.
    LagTooHigh(LagTooHigh),
    /// The lag could not be measured.
    LagUnknown(StoreFailure),
    /// Someone holds the cutover lock.
    LockBusy,
    /// The lock could not be probed.
    LockProbeFailed(LockAcquisitionError),
    /// The coordinator has no lock manager.
    NoLockManager,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Phase(phase) => write!(f, "migration is in phase `{phase}`, not `dual_write`"),
            Self::LagTooHigh(error) => error.fmt(f),
            Self::LagUnknown(error) => write!(f, "sync lag unknown: {error}"),
            Self::LockBusy => f.write_str("the cutover lock is held by someone else"),
            Self::LockProbeFailed(error) => {
                write!(f, "the cutover lock could not be probed: {error}")
            }
            Self::NoLockManager => f.write_str("the coordinator has no lock manager"),
        }
    }
}

/// Whether a cutover could go ahead now, from a probe that changes nothing (the lock
/// is tried and released at once).
#[derive(Debug)]
pub struct CutoverReadiness {
    /// The migration's phase.
    pub phase: Phase,
    /// The lag, when it could be measured.
    pub lag: Option<SyncLag>,
    /// Whether the cutover lock was free (`None` without a lock manager or when the
    /// probe failed).
    pub lock_free: Option<bool>,
    /// What stands in the way; empty when ready.
    pub blockers: Vec<NotReady>,
}

impl CutoverReadiness {
    /// Whether nothing stands in the way.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.blockers.is_empty()
    }
}
