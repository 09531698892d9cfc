//! The cutover race, generic over the lock: instances, each with its own lock manager on
//! one shared backend (as separate processes would be), race to cut over one tenant, and
//! the round checks that exactly one of them did.
//!
//! [`race_round`] reports what went wrong instead of panicking, so that the negative
//! control can run it with a lock that does not exclude ([`NonExcluding`]) and see the
//! double cutover detected.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_port::{
    AcquireOptions, DistributedLock, LockAcquisitionError, LockMode, LockNotHeldError,
    LockRegistry, migration_lock_key,
};
use migration_cutover::testing::{self, WorldCoordinator};
use migration_cutover::{
    CutoverOutcome, InMemoryEventStore, InMemoryRoutingRepository, MigrationConfig, Phase,
    RepositoryError, RoutingRepository, RoutingState, TenantRoute, WritePause,
};
use tokio::sync::Barrier;
use uuid::Uuid;

/// How long the paused step of a cutover takes here (well inside the 500 ms budget).
const CUTOVER_WORK: Duration = Duration::from_millis(100);

pub(crate) const SOURCE: &str = "shared";
pub(crate) const TARGET: &str = "dedicated";

/// Where the instances' locks live: the in-memory table, a PostgreSQL server, ...
pub(crate) trait Backend: Sync {
    /// The lock manager of one instance.
    type Lock: DistributedLock + LockRegistry + 'static;

    /// A lock manager for one more instance, named `name`, on this backend.
    fn instance(&self, name: &str) -> impl Future<Output = Self::Lock> + Send;

    /// How many holds of `key` the backend itself still has (0 after every race).
    fn leftover(&self, key: &str) -> impl Future<Output = usize> + Send;
}

/// The in-memory routing table, counting how often it is flipped to `migrated`.
#[derive(Debug, Clone, Default)]
pub(crate) struct CountingRouting {
    pub(crate) inner: InMemoryRoutingRepository,
    /// Attempts to write `migrated` (the flip), whether or not they replaced the route.
    pub(crate) migrated_puts: Arc<AtomicUsize>,
    pub(crate) history: Arc<Mutex<Vec<RoutingState>>>,
}

impl CountingRouting {
    /// Counts a write of `state` (an attempt to flip, for `migrated`) and says how long
    /// the routing store takes to answer it.
    fn record(&self, state: RoutingState) -> Duration {
        if state == RoutingState::Migrated {
            self.migrated_puts.fetch_add(1, Ordering::SeqCst);
        }
        self.history.lock().expect("history").push(state);
        // A routing store across the network: the cutover holds the lock long enough for
        // the other instance to arrive while it is held.
        if state == RoutingState::CutoverPaused {
            CUTOVER_WORK
        } else {
            Duration::ZERO
        }
    }
}

impl RoutingRepository for CountingRouting {
    fn get(
        &self,
        tenant_id: Uuid,
    ) -> impl Future<Output = Result<Option<TenantRoute>, RepositoryError>> + Send {
        self.inner.get(tenant_id)
    }

    fn put(&self, route: TenantRoute) -> impl Future<Output = Result<(), RepositoryError>> + Send {
        let delay = self.record(route.state);
        let inner = self.inner.clone();
        async move {
            tokio::time::sleep(delay).await;
            inner.put(route).await
        }
    }

    fn compare_and_set(
        &self,
        expected: &TenantRoute,
        next: TenantRoute,
    ) -> impl Future<Output = Result<bool, RepositoryError>> + Send {
        let delay = self.record(next.state);
        let (inner, expected) = (self.inner.clone(), expected.clone());
        async move {
            tokio::time::sleep(delay).await;
            inner.compare_and_set(&expected, next).await
        }
    }
}

/// An instance of the service: a coordinator with its own lock manager.
pub(crate) type Coordinator<L> = WorldCoordinator<L, InMemoryEventStore, CountingRouting>;

/// The shared in-memory world ([`migration_cutover::testing::World`]) with the counting
/// routing table: one tenant routed to the source, an empty target, one routing table and
/// migration record shared by every instance.
pub(crate) struct World(testing::World<InMemoryEventStore, CountingRouting>);

impl std::ops::Deref for World {
    type Target = testing::World<InMemoryEventStore, CountingRouting>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl World {
    pub(crate) async fn new() -> Self {
        let world = testing::World::new(
            (SOURCE, InMemoryEventStore::new()),
            (TARGET, InMemoryEventStore::new()),
            CountingRouting::default(),
        );
        world
            .routing
            .put(TenantRoute::normal(world.tenant, SOURCE))
            .await
            .expect("route");
        Self(world)
    }

    /// The cutover lock's key for the tenant.
    pub(crate) fn cutover_key(&self) -> String {
        migration_lock_key(self.tenant, Some("cutover"))
    }

    /// One instance, cutting over with `locks`.
    pub(crate) fn instance<L: DistributedLock>(
        &self,
        locks: L,
        lock_timeout: Duration,
    ) -> Coordinator<L> {
        let config = MigrationConfig::new().with_lock_timeout(lock_timeout);
        self.coordinator(locks, config)
    }

    fn ids(&self, store: &InMemoryEventStore) -> Vec<Uuid> {
        store
            .events(self.tenant)
            .into_iter()
            .map(|stored| stored.event.id)
            .collect()
    }
}

/// What a race round got wrong.
#[derive(Debug)]
pub(crate) struct RaceFailure {
    /// More than one instance cut over, or the routing was flipped more than once.
    pub(crate) double_cutover: bool,
    pub(crate) problems: Vec<String>,
}

impl fmt::Display for RaceFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.double_cutover {
            f.write_str("double cutover; ")?;
        }
        f.write_str(&self.problems.join("; "))
    }
}

/// One race: two instances (each with a lock manager from `backend`) cut over the same
/// tenant at once; `Ok` when exactly one did and everything is as it should be after.
///
/// The instance that loses is refused by the lock when `lock_timeout` is zero (one try),
/// and otherwise waits, takes the lock, and finds the cutover done.
pub(crate) async fn race_round<B: Backend>(
    backend: &B,
    lock_timeout: Duration,
) -> Result<(), RaceFailure> {
    let world = World::new().await;
    let first = Arc::new(world.instance(backend.instance("instance-a").await, lock_timeout));
    let second = Arc::new(world.instance(backend.instance("instance-b").await, lock_timeout));
    world.write(25).await;
    let migration = world.to_dual_write(&first).await;

    let barrier = Arc::new(Barrier::new(2));
    let racers: Vec<_> = [first.clone(), second.clone()]
        .into_iter()
        .map(|coordinator| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                coordinator.cutover(migration).await
            })
        })
        .collect();

    let mut problems = Vec::new();
    let (mut successes, mut lock_refusals, mut found_done) = (0, 0, 0);
    for racer in racers {
        match racer.await.expect("racer") {
            Ok(result) if result.success() => successes += 1,
            Ok(result) => match result.outcome() {
                CutoverOutcome::LockNotAcquired(error) => {
                    if !error.is_timeout() {
                        problems.push(format!("lock refusal not a timeout: {error}"));
                    }
                    if !result
                        .message()
                        .starts_with("Failed to acquire cutover lock: ")
                    {
                        problems.push(format!("lock refusal says {:?}", result.message()));
                    }
                    lock_refusals += 1;
                }
                // Waited for the lock, then re-checked: the winner had finished.
                CutoverOutcome::AlreadyCompleted => {
                    if !result.message().contains("already completed") {
                        problems.push(format!("already completed says {:?}", result.message()));
                    }
                    found_done += 1;
                }
                other => problems.push(format!("unexpected outcome {other:?}")),
            },
            Err(error) => problems.push(format!("unexpected error {error}")),
        }
    }
    if lock_timeout.is_zero() {
        if lock_refusals != 1 {
            problems.push(format!(
                "one try only: the loser must be refused by the lock, {lock_refusals} were"
            ));
        }
    } else if found_done != 1 {
        problems.push(format!(
            "the loser must wait, take the lock and find it done; {found_done} did"
        ));
    }
    let flips = world.routing.migrated_puts.load(Ordering::SeqCst);
    // Two instances in the paused window at once: each wrote (or tried to write)
    // `cutover_paused`. The routing compare-and-sets then make them fail rather than
    // flip twice, but only the lock keeps them from running together.
    let paused_writes = world
        .routing
        .history
        .lock()
        .expect("history")
        .iter()
        .filter(|state| **state == RoutingState::CutoverPaused)
        .count();
    let double_cutover = successes > 1 || flips > 1 || paused_writes > 1;
    if paused_writes != 1 {
        problems.push(format!(
            "routing was set to cutover_paused {paused_writes} times, not once"
        ));
    }
    if successes != 1 {
        problems.push(format!("{successes} instances cut over, not exactly one"));
    }
    if flips != 1 {
        problems.push(format!(
            "routing flipped to migrated {flips} times, not once"
        ));
    }

    let route = world.routing.inner.route(world.tenant).expect("route");
    if (route.store_id.as_str(), route.state) != (TARGET, RoutingState::Migrated) {
        problems.push(format!(
            "route ends at {} in {}",
            route.store_id, route.state
        ));
    }
    let phase = first.migration(migration).await.expect("migration").phase;
    if phase != Phase::Completed {
        problems.push(format!("migration ends in {phase}"));
    }
    if world.ids(&world.source) != world.ids(&world.target) {
        problems.push("the target's events are not the source's, once each, in order".into());
    }
    if world.ports.pause().is_paused(world.tenant) {
        problems.push("writes are still paused".into());
    }
    let leftover = backend.leftover(&world.cutover_key()).await;
    if leftover != 0 {
        problems.push(format!(
            "the backend still holds the cutover lock {leftover} times"
        ));
    }
    for (name, instance) in [("first", &first), ("second", &second)] {
        let held = instance.lock_manager().map(LockRegistry::held_lock_count);
        if held != Some(0) {
            problems.push(format!(
                "the {name} instance's manager holds {held:?} locks"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RaceFailure {
            double_cutover,
            problems,
        })
    }
}

/// Runs `rounds` races for each lock timeout (zero: one try; 500 ms: the loser waits),
/// panicking with the first failure.
pub(crate) async fn exactly_one_cuts_over<B: Backend>(name: &str, backend: &B, rounds: usize) {
    for lock_timeout in [Duration::ZERO, Duration::from_millis(500)] {
        for round in 0..rounds {
            if let Err(failure) = race_round(backend, lock_timeout).await {
                panic!("{name}, lock timeout {lock_timeout:?}, round {round}: {failure}");
            }
        }
    }
}

/// A backend whose locks do not exclude: the negative control of the race.
#[derive(Debug)]
pub(crate) struct NonExcluding<B>(pub(crate) B);

/// A lock manager that hands out real guards of `L`, each on a key of its own, so two
/// instances asking for one key both get it at once.
#[derive(Debug)]
pub(crate) struct NonExcludingLock<L>(L);

fn own_key(key: &str) -> String {
    format!("{key}:not-excluding:{}", Uuid::new_v4())
}

impl<L: DistributedLock> DistributedLock for NonExcludingLock<L> {
    type Guard = L::Guard;

    fn acquire(
        &self,
        key: &str,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<Self::Guard, LockAcquisitionError>> + Send {
        let key = own_key(key);
        let options = options.into();
        async move { self.0.acquire(&key, options).await }
    }

    fn try_acquire_with(
        &self,
        key: &str,
        mode: LockMode,
    ) -> impl Future<Output = Result<Option<Self::Guard>, LockAcquisitionError>> + Send {
        let key = own_key(key);
        async move { self.0.try_acquire_with(&key, mode).await }
    }

    fn release(&self, key: &str) -> impl Future<Output = Result<(), LockNotHeldError>> + Send {
        self.0.release(key)
    }

    fn is_held(&self, key: &str) -> bool {
        self.0.is_held(key)
    }
}

impl<L: LockRegistry> LockRegistry for NonExcludingLock<L> {
    fn release_all(&self) -> impl Future<Output = usize> + Send {
        self.0.release_all()
    }

    fn held_lock_count(&self) -> usize {
        self.0.held_lock_count()
    }
}

impl<B: Backend> Backend for NonExcluding<B> {
    type Lock = NonExcludingLock<B::Lock>;

    async fn instance(&self, name: &str) -> Self::Lock {
        NonExcludingLock(self.0.instance(name).await)
    }

    fn leftover(&self, key: &str) -> impl Future<Output = usize> + Send {
        self.0.leftover(key)
    }
}

/// The negative control: with a lock that does not exclude, every round must be seen
/// to fail as a double cutover.
pub(crate) async fn a_lock_that_does_not_exclude_is_caught<B: Backend>(
    name: &str,
    backend: B,
    rounds: usize,
) {
    let backend = NonExcluding(backend);
    for lock_timeout in [Duration::ZERO, Duration::from_millis(500)] {
        for round in 0..rounds {
            match race_round(&backend, lock_timeout).await {
                Ok(()) => panic!(
                    "{name}, lock timeout {lock_timeout:?}, round {round}: the race passed \
                     with a lock that does not exclude; it cannot catch a broken lock"
                ),
                Err(failure) => assert!(
                    failure.double_cutover,
                    "{name}, round {round}: failed, but not as a double cutover: {failure}"
                ),
            }
        }
    }
}
