//! The migration coordinator: start, bulk copy, dual write, cutover, abort.

use std::fmt;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, migration_lock_key};
use time::OffsetDateTime;
use tracing::{Instrument, Span, error, field, info, info_span, warn};
use uuid::Uuid;

use crate::context::MigrationPorts;
use crate::copy::{Endpoint, measure_lag, sync_to};
use crate::error::{CutoverError, CutoverTimeout, LagTooHigh, MigrationError, StateError};
use crate::memory::{
    InMemoryEventStore, InMemoryMigrationRepository, InMemoryRoutingRepository, InMemoryWritePause,
};
use crate::nolock::NoLockManager;
use crate::ports::{
    EventStore, Migration, MigrationRepository, PauseGuard, RepositoryError, RoutingRepository,
    StoreId, TenantRoute, WritePause,
};
use crate::report::{
    CopyReport, CutoverOutcome, CutoverReadiness, CutoverResult, NotReady, SyncLag,
};
use crate::router::WriteRouter;
use crate::timer::{Elapsed, timeout};
use crate::{MigrationConfig, Phase, RoutingState, TransitionError};

/// The span of one migration step, with the ids as fields.
macro_rules! step_span {
    ($name:literal, $migration:expr) => {
        info_span!(
            $name,
            migration_id = %$migration.id,
            tenant_id = %$migration.tenant_id
        )
    };
}

/// The operation name of the cutover lock: the key is `cutover:{tenant uuid}`.
pub const CUTOVER_LOCK_OPERATION: &str = "cutover";

/// Moves tenants from one event store to another while they keep writing.
///
/// `L` is the lock manager that serializes cutovers across instances (any
/// [`DistributedLock`]: `PostgresLockManager` in production, an in-memory one in
/// tests). It is optional: a coordinator built with
/// [`without_lock_manager`](Self::without_lock_manager) does every step but
/// [`cutover`](Self::cutover). The other parameters are the ports, in-memory by
/// default (see [`MigrationPorts`]).
///
/// The steps, each its own call so an operator (or a job) can drive and watch them:
/// [`start_migration`](Self::start_migration) → [`bulk_copy`](Self::bulk_copy) →
/// [`enable_dual_write`](Self::enable_dual_write) → ([`catch_up`](Self::catch_up),
/// [`cutover_readiness`](Self::cutover_readiness)) → [`cutover`](Self::cutover);
/// [`abort`](Self::abort) at any point before the cutover.
pub struct MigrationCoordinator<
    L,
    S = InMemoryEventStore,
    R = InMemoryRoutingRepository,
    P = InMemoryWritePause,
    M = InMemoryMigrationRepository,
> {
    ports: MigrationPorts<S, R, P, M>,
    lock_manager: Option<L>,
    config: MigrationConfig,
}

impl<L, S, R, P, M> fmt::Debug for MigrationCoordinator<L, S, R, P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrationCoordinator")
            .field("ports", &self.ports)
            .field("has_lock_manager", &self.lock_manager.is_some())
            .field("config", &self.config)
            .finish()
    }
}

impl<S, R, P, M> MigrationCoordinator<NoLockManager, S, R, P, M>
where
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// A coordinator for copy and dual-write work only: [`cutover`](Self::cutover)
    /// fails with [`MigrationError::LockManagerRequired`].
    #[must_use]
    pub fn without_lock_manager(ports: MigrationPorts<S, R, P, M>) -> Self {
        Self::with_optional_lock_manager(ports, None)
    }
}

/// Holds the two things a cutover holds, so that on every path (return, error, panic,
/// the future being dropped) writes resume before the lock is released: fields drop in
/// declaration order, and the success path resumes and releases explicitly in the
/// same order.
struct Held<G, W> {
    pause: Option<W>,
    lock: G,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn check_budget(paused_at: Instant, budget: Duration) -> Result<(), CutoverError> {
    let elapsed = paused_at.elapsed();
    if elapsed > budget {
        return Err(CutoverTimeout {
            elapsed_ms: millis(elapsed),
            limit_ms: millis(budget),
        }
        .into());
    }
    Ok(())
}

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// A coordinator that serializes cutovers with `lock_manager`.
    #[must_use]
    pub fn new(ports: MigrationPorts<S, R, P, M>, lock_manager: L) -> Self {
        Self::with_optional_lock_manager(ports, Some(lock_manager))
    }

    /// A coordinator with or without a lock manager (the original's
    /// `lock_manager=None`).
    #[must_use]
    pub fn with_optional_lock_manager(
        ports: MigrationPorts<S, R, P, M>,
        lock_manager: Option<L>,
    ) -> Self {
        Self {
            ports,
            lock_manager,
            config: MigrationConfig::new(),
        }
    }

    /// The same coordinator with other settings.
    #[must_use]
    pub fn with_config(mut self, config: MigrationConfig) -> Self {
        self.config = config;
        self
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &MigrationConfig {
        &self.config
    }

    /// The ports.
    #[must_use]
    pub fn ports(&self) -> &MigrationPorts<S, R, P, M> {
        &self.ports
    }

    /// The lock manager, if the coordinator has one.
    #[must_use]
    pub fn lock_manager(&self) -> Option<&L> {
        self.lock_manager.as_ref()
    }

    /// A write router over the same ports, with this coordinator's write timeout.
    #[must_use]
    pub fn router(&self) -> WriteRouter<S, R, P> {
        WriteRouter::new(&self.ports, &self.config)
    }

    /// The migration record `migration_id`.
    ///
    /// # Errors
    /// [`MigrationError::NotFound`], or the repository's failure.
    pub async fn migration(&self, migration_id: Uuid) -> Result<Migration, MigrationError> {
        self.ports
            .migrations()
            .get(migration_id)
            .await
            .map_err(MigrationError::Record)?
            .ok_or(MigrationError::NotFound { migration_id })
    }

    async fn save(&self, migration: &mut Migration) -> Result<(), MigrationError> {
        migration.updated_at = OffsetDateTime::now_utc();
        self.ports
            .migrations()
            .save(migration)
            .await
            .map_err(MigrationError::Record)
    }

    fn store<'a>(&'a self, id: &'a StoreId) -> Result<Endpoint<'a, S>, MigrationError> {
        let store =
            self.ports
                .stores()
                .get(id.as_str())
                .ok_or_else(|| MigrationError::UnknownStore {
                    store_id: id.clone(),
                })?;
        Ok(Endpoint { id, store })
    }

    async fn route(&self, tenant_id: Uuid) -> Result<TenantRoute, MigrationError> {
        self.ports
            .routing()
            .get(tenant_id)
            .await
            .map_err(MigrationError::Routing)?
            .ok_or(MigrationError::NoRoute { tenant_id })
    }

    /// The tenant's route, checked to belong to `migration`.
    async fn route_of(&self, migration: &Migration) -> Result<TenantRoute, MigrationError> {
        let route = self.route(migration.tenant_id).await?;
        if route.migration_id != Some(migration.id) {
            return Err(MigrationError::TenantBusy {
                tenant_id: migration.tenant_id,
                migration_id: route.migration_id,
            });
        }
        Ok(route)
    }

    /// Moves the route to `state` (a no-op when it is there already, so a step can
    /// be retried after a partial failure).
    async fn move_route(
        &self,
        route: &mut TenantRoute,
        state: RoutingState,
    ) -> Result<(), MigrationError> {
        if route.state == state {
            return Ok(());
        }
        let next = TenantRoute {
            state: route.state.transition_to(state)?,
            ..route.clone()
        };
        self.ports
            .routing()
            .put(next.clone())
            .await
            .map_err(MigrationError::Routing)?;
        *route = next;
        Ok(())
    }

    /// Starts moving `tenant_id` from `source` to `target`: records a `pending`
    /// migration and marks the tenant's route with it. The tenant must be routed to
    /// `source` (a tenant without a route gets one to `source`) and have no migration
    /// under way.
    ///
    /// # Errors
    /// [`MigrationError::SameStore`], [`UnknownStore`](MigrationError::UnknownStore),
    /// [`NotRoutedToSource`](MigrationError::NotRoutedToSource),
    /// [`TenantBusy`](MigrationError::TenantBusy),
    /// [`TargetAhead`](MigrationError::TargetAhead), or a port failure.
    pub async fn start_migration(
        &self,
        tenant_id: Uuid,
        source: impl Into<StoreId>,
        target: impl Into<StoreId>,
    ) -> Result<Migration, MigrationError> {
        let (source_id, target_id) = (source.into(), target.into());
        let migration_id = Uuid::new_v4();
        let span =
            info_span!("migration.start", migration_id = %migration_id, tenant_id = %tenant_id);
        async move {
            if source_id == target_id {
                return Err(MigrationError::SameStore {
                    store_id: source_id,
                });
            }
            let (source, target) = (self.store(&source_id)?, self.store(&target_id)?);
            let mut route = match self.ports.routing().get(tenant_id).await {
                Err(error) => return Err(MigrationError::Routing(error)),
                Ok(None) => TenantRoute::normal(tenant_id, source_id.clone()),
                Ok(Some(route)) => {
                    if !matches!(route.state, RoutingState::Normal | RoutingState::Migrated) {
                        return Err(MigrationError::TenantBusy {
                            tenant_id,
                            migration_id: route.migration_id,
                        });
                    }
                    if route.store_id != source_id {
                        return Err(MigrationError::NotRoutedToSource {
                            tenant_id,
                            routed: route.store_id,
                            expected: source_id,
                        });
                    }
                    route
                }
            };
            let lag = measure_lag(tenant_id, source, target).await?;
            if lag.target_position > lag.source_position {
                return Err(MigrationError::TargetAhead {
                    tenant_id,
                    source_position: lag.source_position,
                    target_position: lag.target_position,
                });
            }
            let now = OffsetDateTime::now_utc();
            let mut migration = Migration {
                id: migration_id,
                tenant_id,
                source_store_id: source_id,
                target_store_id: target_id.clone(),
                phase: Phase::Pending,
                events_copied: 0,
                created_at: now,
                updated_at: now,
                last_error: None,
            };
            self.save(&mut migration).await?;
            route.state = route.state.transition_to(RoutingState::Normal)?;
            route.migration_id = Some(migration_id);
            route.target_store_id = Some(target_id);
            self.ports
                .routing()
                .put(route)
                .await
                .map_err(MigrationError::Routing)?;
            info!(source = %migration.source_store_id, target = %migration.target_store_id, "migration started");
            Ok(migration)
        }
        .instrument(span)
        .await
    }

    /// [`copy_rounds`](Self::copy_rounds), then the copied count added to the
    /// migration's record and saved.
    async fn copy_and_record(
        &self,
        migration: &mut Migration,
        catch_up_rounds: u32,
    ) -> Result<CopyReport, MigrationError> {
        let report = self.copy_rounds(migration, catch_up_rounds).await?;
        migration.events_copied += report.events_copied;
        self.save(migration).await?;
        Ok(report)
    }

    /// Copy passes until the target has caught up or `catch_up_rounds` extra passes
    /// have run.
    async fn copy_rounds(
        &self,
        migration: &Migration,
        catch_up_rounds: u32,
    ) -> Result<CopyReport, MigrationError> {
        let tenant_id = migration.tenant_id;
        let source = self.store(&migration.source_store_id)?;
        let target = self.store(&migration.target_store_id)?;
        let mut report = CopyReport {
            events_copied: 0,
            rounds: 0,
            lag: measure_lag(tenant_id, source, target).await?,
        };
        while !report.lag.is_synced() && report.rounds <= catch_up_rounds {
            let copied = sync_to(
                tenant_id,
                source,
                target,
                report.lag.source_position,
                self.config.batch_size(),
            )
            .await?;
            report.events_copied += copied;
            report.rounds += 1;
            report.lag = measure_lag(tenant_id, source, target).await?;
            info!(
                round = report.rounds,
                copied,
                lag = report.lag.events(),
                "copy pass done"
            );
        }
        Ok(report)
    }

    /// Copies the tenant's history to the target in batches, then runs catch-up
    /// rounds for what was written meanwhile. Moves `pending → bulk_copy` (routing
    /// `normal → bulk_copy`); may be called again in `bulk_copy` to resume, and goes
    /// on from the target's head.
    ///
    /// # Errors
    /// [`MigrationError::State`] unless `pending` or `bulk_copy`; a store failure
    /// (call again to resume).
    pub async fn bulk_copy(&self, migration_id: Uuid) -> Result<CopyReport, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        let span = step_span!("migration.bulk_copy", migration);
        async move {
            match migration.phase {
                Phase::Pending => {
                    let mut route = self.route_of(&migration).await?;
                    self.move_route(&mut route, RoutingState::BulkCopy).await?;
                    migration.phase = migration.phase.transition_to(Phase::BulkCopy)?;
                    self.save(&mut migration).await?;
                }
                Phase::BulkCopy => {}
                actual => {
                    return Err(StateError {
                        migration_id,
                        expected: Phase::Pending,
                        actual,
                    }
                    .into());
                }
            }
            self.copy_and_record(&mut migration, self.config.catch_up_rounds())
                .await
        }
        .instrument(span)
        .await
    }

    /// Switches to dual writes (`bulk_copy → dual_write`, routing too), then copies
    /// what reached the source before the switch.
    ///
    /// # Errors
    /// [`MigrationError::State`] unless `bulk_copy`; a port failure (call again).
    pub async fn enable_dual_write(
        &self,
        migration_id: Uuid,
    ) -> Result<CopyReport, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        let span = step_span!("migration.dual_write", migration);
        async move {
            if migration.phase != Phase::BulkCopy {
                return Err(StateError {
                    migration_id,
                    expected: Phase::BulkCopy,
                    actual: migration.phase,
                }
                .into());
            }
            let mut route = self.route_of(&migration).await?;
            self.move_route(&mut route, RoutingState::DualWrite).await?;
            migration.phase = migration.phase.transition_to(Phase::DualWrite)?;
            self.save(&mut migration).await?;
            let report = self.copy_and_record(&mut migration, 0).await?;
            info!(lag = report.lag.events(), "dual write enabled");
            Ok(report)
        }
        .instrument(span)
        .await
    }

    /// Copies to the target whatever it is missing (after a target outage, say), in
    /// `bulk_copy` or `dual_write`.
    ///
    /// # Errors
    /// [`MigrationError::State`] in any other phase; a store failure.
    pub async fn catch_up(&self, migration_id: Uuid) -> Result<CopyReport, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        let span = step_span!("migration.catch_up", migration);
        async move {
            if !matches!(migration.phase, Phase::BulkCopy | Phase::DualWrite) {
                return Err(StateError {
                    migration_id,
                    expected: Phase::DualWrite,
                    actual: migration.phase,
                }
                .into());
            }
            self.copy_and_record(&mut migration, self.config.catch_up_rounds())
                .await
        }
        .instrument(span)
        .await
    }

    /// How far the target is behind the source now.
    ///
    /// # Errors
    /// [`MigrationError::NotFound`], or a store failure.
    pub async fn sync_lag(&self, migration_id: Uuid) -> Result<SyncLag, MigrationError> {
        let migration = self.migration(migration_id).await?;
        let source = self.store(&migration.source_store_id)?;
        let target = self.store(&migration.target_store_id)?;
        Ok(measure_lag(migration.tenant_id, source, target).await?)
    }

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
            Some(locks) => {
                let key = migration_lock_key(migration.tenant_id, Some(CUTOVER_LOCK_OPERATION));
                match locks.try_acquire(&key).await {
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
                }
            }
        };
        Ok(CutoverReadiness {
            phase: migration.phase,
            lag,
            lock_free,
            blockers,
        })
    }

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
    /// copies the rest, checks the target answers, points routing at the target and
    /// sets it `migrated` (pointing it back at the source if that fails). All of that
    /// must fit in the pause budget. On success the migration is `completed`; on any
    /// failure routing goes back to the source in `dual_write`, the migration back to
    /// `dual_write`, and the result says why. Writes resume before the lock is
    /// released, on every path.
    ///
    /// A migration left in `cutover` by an instance that died (or could not write the
    /// final record) is accepted too: under the lock the cutover is run again, or the
    /// record completed when routing already points at the target.
    ///
    /// # Errors
    /// [`MigrationError::State`] outside `dual_write`;
    /// [`MigrationError::LockManagerRequired`]; port failures before anything changed.
    /// [`MigrationError::Record`] when the flip took effect but the record could not
    /// say so (calling `cutover` again completes it).
    ///
    /// # Cancel safety
    /// Dropping the future resumes writes and then releases the lock (guards drop in
    /// that order). Routing may then be left in `cutover_paused` with the migration in
    /// `cutover`, which refuses writes until the next `cutover` call resolves it.
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
            let result = self.cutover_unlocked(migration, started).await;
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

    async fn cutover_unlocked(
        &self,
        migration: Migration,
        started: Instant,
    ) -> Result<CutoverResult, MigrationError> {
        if !matches!(migration.phase, Phase::DualWrite | Phase::Cutover) {
            return Err(StateError {
                migration_id: migration.id,
                expected: Phase::DualWrite,
                actual: migration.phase,
            }
            .into());
        }
        let Some(locks) = &self.lock_manager else {
            return Err(MigrationError::LockManagerRequired);
        };
        let key = migration_lock_key(migration.tenant_id, Some(CUTOVER_LOCK_OPERATION));
        let options = AcquireOptions::new().with_timeout(self.config.lock_timeout());
        let lock = match locks.acquire(&key, options).await {
            Ok(guard) => guard,
            Err(error) => {
                let outcome = CutoverOutcome::LockNotAcquired(error);
                return Ok(Self::result(&migration, outcome, started, 0));
            }
        };
        let mut held = Held { pause: None, lock };
        let result = self
            .cutover_locked(migration.id, &mut held.pause, started)
            .await;
        if let Some(pause) = held.pause.take() {
            pause.resume().await;
        }
        held.lock.release().await;
        result
    }

    /// Steps 4 to 6 of the cutover, under the lock. A pause it takes is left in
    /// `pause_slot` for the caller to resume before releasing the lock.
    async fn cutover_locked(
        &self,
        migration_id: Uuid,
        pause_slot: &mut Option<P::Guard>,
        started: Instant,
    ) -> Result<CutoverResult, MigrationError> {
        // Re-check what the lock protects: another instance may have got there first.
        let mut migration = self.migration(migration_id).await?;
        let route = self.route(migration.tenant_id).await?;
        let flipped =
            route.state == RoutingState::Migrated && route.store_id == migration.target_store_id;
        match migration.phase {
            Phase::Completed => {
                return Ok(Self::result(
                    &migration,
                    CutoverOutcome::AlreadyCompleted,
                    started,
                    0,
                ));
            }
            Phase::Cutover if flipped => {
                migration.phase = migration.phase.transition_to(Phase::Completed)?;
                self.save(&mut migration).await?;
                return Ok(Self::result(
                    &migration,
                    CutoverOutcome::AlreadyCompleted,
                    started,
                    0,
                ));
            }
            Phase::DualWrite | Phase::Cutover => {}
            actual => {
                return Err(StateError {
                    migration_id,
                    expected: Phase::DualWrite,
                    actual,
                }
                .into());
            }
        }
        if route.store_id != migration.source_store_id {
            return Err(MigrationError::NotRoutedToSource {
                tenant_id: migration.tenant_id,
                routed: route.store_id,
                expected: migration.source_store_id,
            });
        }
        if !matches!(
            route.state,
            RoutingState::DualWrite | RoutingState::CutoverPaused
        ) {
            return Err(TransitionError::Routing {
                from: route.state,
                to: RoutingState::CutoverPaused,
            }
            .into());
        }
        let (source_id, target_id) = (
            migration.source_store_id.clone(),
            migration.target_store_id.clone(),
        );
        let source = self.store(&source_id)?;
        let target = self.store(&target_id)?;
        if migration.phase == Phase::DualWrite {
            migration.phase = migration.phase.transition_to(Phase::Cutover)?;
            self.save(&mut migration).await?;
        }

        let pause = match self.ports.pause().pause(migration.tenant_id).await {
            Ok(pause) => pause_slot.insert(pause),
            Err(error) => {
                let error = CutoverError::WritePauseFailed(error);
                let outcome = self.roll_back(&mut migration, error).await;
                return Ok(Self::result(&migration, outcome, started, 0));
            }
        };
        let paused_at = Instant::now();
        let budget = self.config.pause_budget();
        let mut synced = 0;
        let steps = timeout(
            budget,
            self.paused_steps(
                &migration,
                route,
                &*pause,
                source,
                target,
                paused_at,
                &mut synced,
            ),
        )
        .await;
        let failure = match steps {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error),
            Err(Elapsed) => Some(CutoverError::Timeout(CutoverTimeout {
                elapsed_ms: millis(paused_at.elapsed()),
                limit_ms: millis(budget),
            })),
        };
        migration.events_copied += synced;
        if let Some(error) = failure {
            let outcome = self.roll_back(&mut migration, error).await;
            return Ok(Self::result(&migration, outcome, started, synced));
        }
        migration.phase = migration.phase.transition_to(Phase::Completed)?;
        migration.last_error = None;
        if let Err(error) = self.save(&mut migration).await {
            error!(error = %error, "cutover took effect but the migration record could not be completed");
            return Err(error);
        }
        Ok(Self::result(
            &migration,
            CutoverOutcome::Completed,
            started,
            synced,
        ))
    }

    /// The steps taken while writes are paused; the caller bounds them by the budget.
    #[allow(clippy::too_many_arguments)]
    async fn paused_steps(
        &self,
        migration: &Migration,
        mut route: TenantRoute,
        pause: &P::Guard,
        source: Endpoint<'_, S>,
        target: Endpoint<'_, S>,
        paused_at: Instant,
        synced: &mut u64,
    ) -> Result<(), CutoverError> {
        let tenant_id = migration.tenant_id;
        let budget = self.config.pause_budget();
        let routing = self.ports.routing();
        let routing_failed = |source| CutoverError::RoutingUpdateFailed {
            source,
            compensated: false,
        };

        pause.drained().await;
        let lag = measure_lag(tenant_id, source, target)
            .await
            .map_err(CutoverError::LagCalculationFailed)?;
        if lag.events() > self.config.max_lag() {
            return Err(LagTooHigh {
                current: lag.events(),
                max: self.config.max_lag(),
            }
            .into());
        }

        if route.state != RoutingState::CutoverPaused {
            route.state = RoutingState::CutoverPaused;
            routing.put(route.clone()).await.map_err(routing_failed)?;
        }
        check_budget(paused_at, budget)?;

        *synced = sync_to(
            tenant_id,
            source,
            target,
            u64::MAX,
            self.config.batch_size(),
        )
        .await
        .map_err(CutoverError::FinalSyncFailed)?;
        check_budget(paused_at, budget)?;

        target
            .store
            .ping()
            .await
            .map_err(|error| CutoverError::TargetHealthCheckFailed(target.fail(error)))?;

        route.store_id = migration.target_store_id.clone();
        routing.put(route.clone()).await.map_err(routing_failed)?;
        let migrated = TenantRoute {
            state: RoutingState::Migrated,
            target_store_id: None,
            ..route.clone()
        };
        if let Err(error) = routing.put(migrated).await {
            // Compensate: point routing back at the source before reporting.
            route.store_id = migration.source_store_id.clone();
            let compensated = match routing.put(route).await {
                Ok(()) => true,
                Err(compensation) => {
                    error!(error = %compensation, "could not point routing back at the source");
                    false
                }
            };
            return Err(CutoverError::RoutingUpdateFailed {
                source: error,
                compensated,
            });
        }
        Ok(())
    }

    /// Routing back to the source in `dual_write`, the migration back to
    /// `dual_write`; bounded by the pause budget (writes are still paused).
    async fn roll_back(&self, migration: &mut Migration, error: CutoverError) -> CutoverOutcome {
        warn!(reason = error.reason().as_str(), error = %error, "cutover failed; rolling back");
        let budget = self.config.pause_budget();
        let rolled_back = match timeout(budget, self.roll_back_steps(migration, &error)).await {
            Ok(result) => result,
            Err(Elapsed) => Err(MigrationError::Routing(RepositoryError::new(
                "cutover rollback",
                format!("did not finish within {} ms", millis(budget)),
            ))),
        };
        match rolled_back {
            Ok(()) => CutoverOutcome::RolledBack(error),
            Err(rollback) => {
                error!(error = %rollback, "cutover rollback failed");
                CutoverOutcome::RollbackFailed { error, rollback }
            }
        }
    }

    async fn roll_back_steps(
        &self,
        migration: &mut Migration,
        error: &CutoverError,
    ) -> Result<(), MigrationError> {
        let route = self.route(migration.tenant_id).await?;
        let back = TenantRoute {
            tenant_id: migration.tenant_id,
            store_id: migration.source_store_id.clone(),
            state: RoutingState::DualWrite,
            migration_id: Some(migration.id),
            target_store_id: Some(migration.target_store_id.clone()),
        };
        if route.state != RoutingState::DualWrite {
            route.state.transition_to(RoutingState::DualWrite)?;
        }
        if route != back {
            self.ports
                .routing()
                .put(back)
                .await
                .map_err(MigrationError::Routing)?;
        }
        migration.phase = migration.phase.transition_to(Phase::DualWrite)?;
        migration.last_error = Some(error.to_string());
        self.save(migration).await
    }

    /// Stops the migration: routing back to the source in `normal`, the migration
    /// `aborted`. The target keeps what was copied. Takes the cutover lock when the
    /// coordinator has a lock manager, so it cannot interleave with a cutover.
    ///
    /// # Errors
    /// [`MigrationError::Transition`] for a finished migration;
    /// [`MigrationError::State`] in `cutover` (call `cutover` to resolve it first);
    /// [`MigrationError::Lock`] when the lock could not be taken; port failures.
    ///
    /// # Cancel safety
    /// Dropping the future releases the lock (its guard is dropped); the routing may
    /// then be back on the source with the record not yet `aborted`: call `abort` again.
    pub async fn abort(&self, migration_id: Uuid) -> Result<Migration, MigrationError> {
        let migration = self.migration(migration_id).await?;
        let span = step_span!("migration.abort", migration);
        async move {
            let lock = match &self.lock_manager {
                None => None,
                Some(locks) => {
                    let key = migration_lock_key(migration.tenant_id, Some(CUTOVER_LOCK_OPERATION));
                    let options = AcquireOptions::new().with_timeout(self.config.lock_timeout());
                    Some(locks.acquire(&key, options).await?)
                }
            };
            let result = self.abort_steps(migration_id).await;
            if let Some(lock) = lock {
                lock.release().await;
            }
            result
        }
        .instrument(span)
        .await
    }

    async fn abort_steps(&self, migration_id: Uuid) -> Result<Migration, MigrationError> {
        let mut migration = self.migration(migration_id).await?;
        if migration.phase == Phase::Cutover {
            return Err(StateError {
                migration_id,
                expected: Phase::DualWrite,
                actual: migration.phase,
            }
            .into());
        }
        let next = migration.phase.transition_to(Phase::Aborted)?;
        let route = self.route(migration.tenant_id).await?;
        if route.migration_id == Some(migration.id) {
            let normal =
                TenantRoute::normal(migration.tenant_id, migration.source_store_id.clone());
            self.ports
                .routing()
                .put(normal)
                .await
                .map_err(MigrationError::Routing)?;
        }
        migration.phase = next;
        self.save(&mut migration).await?;
        info!("migration aborted");
        Ok(migration)
    }
}
