//! The cutover of one tenant, the only step that takes the lock. One file per step of
//! the sequence, in its order:
//!
//! 1. [`refuse`]: refuse unless the migration is in `dual_write`, and without a lock
//!    manager;
//! 2. [`lock`]: take the cutover lock (a failure changes nothing), and hold it so
//!    that writes always resume before it is released;
//! 3. [`recheck`]: under the lock, read the migration and route again (another
//!    instance may have finished) and move the phase to `cutover`;
//! 4. [`pause`]: pause the tenant's writes;
//! 5. then, while writes are paused and within the pause budget
//!    ([`run_paused_steps`](MigrationCoordinator::run_paused_steps) below): wait for the
//!    writes in flight, [`lag`] check, [`paused_state`] (routing `cutover_paused`, the
//!    budget), final [`catch_up`], target [`health`] check, [`flip`] the routing;
//! 6. [`flip`] again: the migration `completed`; or on any failure [`rollback`].
//!
//! This file runs the sequence; each step's file says what the step does.

use std::future::{Future, IntoFuture, poll_fn};
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use locks_port::{DistributedLock, LockLostError, LostSignal};
use tracing::{Instrument, Span, field, info, info_span, warn};
use uuid::Uuid;

use super::{MigrationCoordinator, cutover_lock_key};
use crate::copy::Endpoint;
use crate::error::{CutoverError, MigrationError};
use crate::ports::{
    EventStore, Migration, MigrationRepository, PauseGuard, RoutingRepository, TenantRoute,
    WritePause,
};
use crate::report::{CutoverOutcome, CutoverResult};
use crate::timer::{Elapsed, timeout};

mod catch_up;
mod flip;
mod health;
mod lag;
mod lock;
mod pause;
mod paused_state;
mod recheck;
mod refuse;
mod rollback;

use lock::Held;
use paused_state::PauseBudget;
use recheck::Recheck;

/// What the steps taken while writes are paused work on.
struct PausedCutover<'a, S> {
    migration: &'a Migration,
    /// The tenant's route as the paused steps have left it so far.
    route: TenantRoute,
    source: Endpoint<'a, S>,
    target: Endpoint<'a, S>,
}

/// The tracing target of the cutover's step events: a DEBUG event with this target and a
/// field `step` marks each step boundary, named `phase_cutover` (the record says
/// `cutover`), `pause_granted`, `routing_paused`, `caught_up` (final catch-up done),
/// `flipped`, `recorded` (the record says `completed`), `resumed` (before the lock is
/// released) or `rolled_back`. For logs, and for tests that stop a process at a step.
pub const CUTOVER_STEP_TARGET: &str = "migration_cutover::cutover_step";

/// Marks a step boundary (see [`CUTOVER_STEP_TARGET`]).
fn step(name: &'static str) {
    tracing::debug!(target: CUTOVER_STEP_TARGET, step = name, "cutover step done");
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The result of a cutover of `migration` that began at `started`.
fn result(
    migration: &Migration,
    outcome: CutoverOutcome,
    started: Instant,
    events_synced: u64,
) -> CutoverResult {
    CutoverResult::new(
        migration.id,
        migration.tenant_id,
        migration.target_store_id.clone(),
        outcome,
        started.elapsed(),
        events_synced,
    )
}

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Flips the tenant to the target store, under the lock
    /// `cutover:{tenant}` so that one instance at a time does it.
    ///
    /// Refuses (an `Err`, nothing changed) unless the migration is in `dual_write`,
    /// and without a lock manager. Then takes the lock, waiting up to the lock
    /// timeout; if that fails the result says `Failed to acquire cutover lock: …` and
    /// nothing changed. Under the lock it reads the migration again (another instance
    /// may have finished meanwhile: [`CutoverOutcome::AlreadyCompleted`]), moves the
    /// phase to `cutover`, pauses the tenant's writes and waits for those under way,
    /// measures the lag (refusing above the maximum), sets routing `cutover_paused`,
    /// copies the rest, checks the target answers, and flips routing to `migrated` on the
    /// target in one write. All of that must fit in the pause budget, and run while the
    /// lock is held: a lock lost before the flip (its session ended, so another instance
    /// may hold it now) stops the steps and rolls back ([`CutoverError::LockLost`]).
    /// On success the migration is `completed`; on any
    /// failure routing goes back to the source in `dual_write`, the migration back to
    /// `dual_write`, and the result says why. Writes resume before the lock is
    /// released, on every path.
    ///
    /// Every routing transition is one compare-and-set
    /// ([`RoutingRepository::compare_and_set`]), the flip included (`cutover_paused` on
    /// the source to `migrated` on the target in one write), so a cutover that dies at
    /// any instant leaves one of these, each resolved without a person:
    ///
    /// | record | route | who resolves it, and how |
    /// | --- | --- | --- |
    /// | `cutover` | `dual_write` on the source | writers are not held back; `cutover` runs again, or `abort` aborts |
    /// | `cutover` | `cutover_paused` on the source | the next write, once no cutover holds the write pause, rolls the route back to `dual_write` (one compare-and-set, see [`TenantRoute::abandoned_pause_rollback`]); or `cutover` / `abort` |
    /// | `cutover` | `migrated` on the target | writers go to the target; `cutover` completes the record (`abort` refuses: [`MigrationError::AlreadyFlipped`]) |
    /// | `completed` | `migrated` on the target | nothing to resolve |
    ///
    /// A migration left in `cutover` is therefore accepted: under the lock the cutover is
    /// run again, or the record completed when routing already points at the target (or,
    /// from a two-write flip of an older version, `cutover_paused` on the target: the flip
    /// is completed). Each step boundary is a DEBUG event (see [`CUTOVER_STEP_TARGET`]).
    ///
    /// # Errors
    /// [`MigrationError::State`] outside `dual_write` and `cutover`;
    /// [`MigrationError::LockManagerRequired`];
    /// [`MigrationError::UnexpectedRoute`] (naming the state found and what resolves it)
    /// for a route the cutover cannot start from; port failures before anything changed.
    /// [`MigrationError::Record`] when the flip took effect but the record could not
    /// say so (calling `cutover` again completes it).
    ///
    /// # Cancel safety
    /// Dropping the future resumes writes and then releases the lock (guards drop in
    /// that order). Routing may then be left in `cutover_paused` with the migration in
    /// `cutover`: the next write rolls the route back (see the table above), and the next
    /// `cutover` or `abort` resolves the record.
    pub async fn cutover(&self, migration_id: Uuid) -> Result<CutoverResult, MigrationError> {
        let started = Instant::now();
        let migration = self.migration(migration_id).await?;
        let span = info_span!(
            "migration.cutover",
            migration_id = %migration.id,
            tenant_id = %migration.tenant_id,
            success = field::Empty,
        );
        async move {
            let result = self.lock_and_cut_over(migration, started).await;
            if let Ok(result) = &result {
                Span::current().record("success", result.success());
                if result.success() {
                    info!(
                        duration_ms = millis(result.duration()),
                        events_synced = result.events_synced(),
                        "cutover completed"
                    );
                } else {
                    warn!(message = %result.message(), "cutover did not complete");
                }
            }
            result
        }
        .instrument(span)
        .await
    }

    /// The whole sequence: the refusals, the lock, and everything under it; writes
    /// resume before the lock is released, on every path.
    async fn lock_and_cut_over(
        &self,
        migration: Migration,
        started: Instant,
    ) -> Result<CutoverResult, MigrationError> {
        let locks = self.refuse_unless_dual_write(&migration)?;
        let lock = match self.take_cutover_lock(locks, &migration).await {
            Ok(lock) => lock,
            Err(error) => {
                let outcome = CutoverOutcome::LockNotAcquired(error);
                return Ok(result(&migration, outcome, started, 0));
            }
        };
        let mut held = Held::new(lock);
        let held_lost = held.lost();
        let result = async {
            let (mut migration, route) = match self.recheck_under_lock(migration.id).await? {
                Recheck::AlreadyCompleted(migration) => {
                    let outcome = CutoverOutcome::AlreadyCompleted;
                    return Ok(result(&migration, outcome, started, 0));
                }
                Recheck::Proceed { migration, route } => (migration, route),
            };
            let (source_id, target_id) = (
                migration.source_store_id.clone(),
                migration.target_store_id.clone(),
            );
            let source = self.store(&source_id)?;
            let target = self.store(&target_id)?;
            self.enter_cutover_phase(&mut migration).await?;
            step("phase_cutover");

            let pause = match self.pause_writes(&migration).await {
                Ok(pause) => {
                    step("pause_granted");
                    held.hold_pause(pause)
                }
                Err(error) => {
                    let outcome = self.roll_back(&mut migration, error).await;
                    return Ok(result(&migration, outcome, started, 0));
                }
            };
            let paused = PausedCutover {
                migration: &migration,
                route,
                source,
                target,
            };
            let (synced, failure) = self.run_paused_steps(pause, paused, held_lost).await;
            migration.events_copied += synced;
            if let Some(error) = failure {
                let outcome = self.roll_back(&mut migration, error).await;
                return Ok(result(&migration, outcome, started, synced));
            }
            self.record_completed(&mut migration).await?;
            Ok(result(
                &migration,
                CutoverOutcome::Completed,
                started,
                synced,
            ))
        }
        .await;
        held.resume_then_release().await;
        result
    }

    /// The steps taken while writes are paused, bounded by the pause budget and stopped
    /// as soon as the cutover lock is `lost` (so no flip is made without it). Returns
    /// the events the final catch-up copied (also when a later step failed) and the
    /// failure, if any.
    async fn run_paused_steps(
        &self,
        pause: &P::Guard,
        mut paused: PausedCutover<'_, S>,
        lost: LostSignal,
    ) -> (u64, Option<CutoverError>) {
        let key = cutover_lock_key(paused.migration.tenant_id);
        let budget = PauseBudget::start(self.config.pause_budget());
        let mut synced = 0;
        let steps = async {
            pause.drained().await;
            self.check_lag(&paused).await?;
            self.enter_cutover_paused(&mut paused).await?;
            budget.check()?;
            synced = self.final_catch_up(&paused).await?;
            step("caught_up");
            budget.check()?;
            self.check_target_health(&paused).await?;
            self.flip_routing_to_target(&mut paused).await
        };
        let steps = until_lost(lost, &key, steps);
        let failure = match timeout(budget.limit(), steps).await {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error),
            Err(Elapsed) => Some(budget.exceeded()),
        };
        (synced, failure)
    }
}

/// Runs `steps` unless the lock whose `lost` signal this is stops being held first: then
/// `steps` is dropped unfinished and the result is [`CutoverError::LockLost`]. The signal
/// is looked at before each poll of `steps`, so a step that would start after the loss
/// (the flip) never runs.
async fn until_lost<F>(lost: LostSignal, key: &str, steps: F) -> Result<(), CutoverError>
where
    F: Future<Output = Result<(), CutoverError>>,
{
    let mut steps = pin!(steps);
    let mut lost = pin!(lost.into_future());
    poll_fn(|cx| {
        if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
            return Poll::Ready(Err(CutoverError::LockLost(LockLostError::new(key, reason))));
        }
        steps.as_mut().poll(cx)
    })
    .await
}
