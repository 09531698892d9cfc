//! The shared contract suite: async test cases every lock manager must pass, and
//! [`conformance_suite!`](crate::conformance_suite) to stamp them out as tests.
//!
//! Like `object_store`'s `integration` module: each case is a public
//! `async fn case<H: Harness>(harness: &H)` that panics with a message naming the
//! broken contract. An adapter implements [`Harness`] in its integration tests and
//! invokes the macro once; it can also call single cases from its own tests.
//!
//! ```text
//! // crates/my-adapter/tests/it/conformance.rs
//! // (the compiled example is crates/locks-memory/tests/it/conformance.rs)
//! use locks_port::conformance::Harness;
//!
//! struct MyHarness { pool: my_adapter::Pool }
//!
//! impl Harness for MyHarness {
//!     type Manager = my_adapter::LockManager;
//!
//!     // A NEW manager each call, with its own bookkeeping, contending with the
//!     // harness's other managers on the same locks (same database).
//!     fn manager(&self) -> Self::Manager {
//!         my_adapter::LockManager::new(self.pool.clone())
//!     }
//! }
//!
//! // One #[test] per case. The expression is evaluated once per test, inside that
//! // test's Tokio runtime, so it may `.await`.
//! locks_port::conformance_suite!(MyHarness { pool: my_adapter::test_pool().await });
//! ```
//!
//! # What the cases assume of a harness
//! - Managers of one harness contend on the same locks; each has its own
//!   bookkeeping (`is_held`, `held_lock_count`, `release_all` answer for it alone).
//! - Lock ids come from the default derivation, [`crate::lock_id`].
//! - Keys are unique per case run (`conformance:{case}:{uuid}`), so cases may run in
//!   parallel against one shared database.
//! - A case holds or waits for at most [`MAX_CONCURRENT_ACQUISITIONS`] locks at a time;
//!   a backend that needs a connection per held lock or per waiter must allow that
//!   many per harness.
//! - Release through [`LockGuard::release`], [`DistributedLock::release`] and
//!   [`LockRegistry::release_all`] is complete when the call returns. Release by drop,
//!   by a panicking body, by an aborted task, or cleanup after a cancelled or
//!   timed-out acquire may finish asynchronously: the cases poll for up to
//!   [`RELEASE_GRACE`] before calling it a leak.
//! - Each test built by the macro runs on its own multi-threaded Tokio runtime (two
//!   workers) and fails after [`CASE_TIME_LIMIT`] instead of hanging. Anything bound
//!   to a runtime (a connection pool whose connections are driven by spawned tasks)
//!   must therefore be built by the harness expression, not shared between tests.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockAcquisitionError, LockGuard,
    LockRegistry, ReleaseOutcome, WaitStrategy, lock_id,
};

mod health;
mod many;
mod modes;
mod random;

pub use health::{
    huge_timeouts_saturate, poll_without_timeout_waits_in_queue, release_all_tells_every_guard,
    release_by_key_tells_the_guard, with_lock_until_lost_stops_the_body,
};
pub use many::{
    acquire_many_is_all_or_nothing, acquire_many_of_nothing_holds_nothing,
    acquire_many_takes_all_in_lock_id_order, acquire_many_tells_of_a_member_taken_away,
    dropped_acquire_many_leaves_nothing_held,
};
pub use modes::{exclusive_excludes_shared, queued_writer_is_not_starved, shared_holders_coexist};
pub use random::Lcg;

/// How an adapter plugs into the suite.
///
/// [`manager`](Harness::manager) gives a NEW manager with its own bookkeeping that
/// contends with every other manager of the same harness on the same locks, as two
/// processes on one database do. For PostgreSQL: a new manager on the same pool or
/// database; for memory: a new manager on one shared lock table.
pub trait Harness: Send + Sync + 'static {
    /// The lock manager under test. Cloning it must share its bookkeeping (the cases
    /// move clones into spawned tasks).
    type Manager: DistributedLock<Guard: 'static> + LockRegistry + Clone + Send + Sync + 'static;

    /// A new manager that contends with this harness's other managers.
    fn manager(&self) -> Self::Manager;
}

/// How long one case built by [`conformance_suite!`](crate::conformance_suite) may run
/// before it fails as deadlocked.
pub const CASE_TIME_LIMIT: Duration = Duration::from_secs(60);

/// How long a case waits for a release that may happen asynchronously (drop, abort,
/// cancelled acquire) before it reports a leaked lock.
pub const RELEASE_GRACE: Duration = Duration::from_secs(5);

/// The most locks one case holds or waits for at the same time.
pub const MAX_CONCURRENT_ACQUISITIONS: usize = HAMMER_TASKS;

/// The timeout of acquisitions that are expected to succeed.
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// How far `acquired_at` may be from the local clock.
const CLOCK_SLACK: time::Duration = time::Duration::seconds(5);
/// Tasks and iterations of the mutual-exclusion case.
const HAMMER_TASKS: usize = 8;
const HAMMER_ITERATIONS: usize = 25;
/// Waiters of the every-waiter-gets-a-turn case.
const WAITERS: usize = 5;

/// A key no other test run uses.
pub(crate) fn unique_key(case: &str) -> String {
    format!("conformance:{case}:{}", Uuid::new_v4())
}

pub(crate) fn bounded(timeout: Duration) -> AcquireOptions {
    AcquireOptions::new().with_timeout(timeout)
}

/// Acquires a key that must become available within [`WAIT`].
pub(crate) async fn must_acquire<M: DistributedLock>(
    manager: &M,
    key: &str,
    why: &str,
) -> M::Guard {
    match manager.acquire(key, bounded(WAIT)).await {
        Ok(guard) => guard,
        Err(error) => panic!("{why}: acquire({key:?}) failed: {error}"),
    }
}

/// Takes a key that must be free right now.
pub(crate) async fn must_take<M: DistributedLock>(manager: &M, key: &str, why: &str) -> M::Guard {
    match manager.try_acquire(key).await {
        Ok(Some(guard)) => guard,
        Ok(None) => panic!("{why}: try_acquire({key:?}) found the key held"),
        Err(error) => panic!("{why}: try_acquire({key:?}) failed: {error}"),
    }
}

/// Checks that a key is held by someone right now.
pub(crate) async fn must_be_busy<M: DistributedLock>(manager: &M, key: &str, why: &str) {
    match manager.try_acquire(key).await {
        Ok(None) => {}
        Ok(Some(_guard)) => panic!("{why}: try_acquire({key:?}) got a lock that should be held"),
        Err(error) => panic!("{why}: try_acquire({key:?}) failed: {error}"),
    }
}

/// Polls `try_acquire` until the key is free, for up to [`RELEASE_GRACE`].
pub(crate) async fn eventually_acquirable<M: DistributedLock>(
    manager: &M,
    key: &str,
    why: &str,
) -> M::Guard {
    let deadline = Instant::now() + RELEASE_GRACE;
    loop {
        match manager.try_acquire(key).await {
            Ok(Some(guard)) => return guard,
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(None) => panic!("{why}: {key:?} was still held after {RELEASE_GRACE:?}"),
            Err(error) => panic!("{why}: try_acquire({key:?}) failed: {error}"),
        }
    }
}

/// Polls a local condition for up to [`RELEASE_GRACE`].
pub(crate) async fn eventually(mut condition: impl FnMut() -> bool, why: &str) {
    let deadline = Instant::now() + RELEASE_GRACE;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "{why} (still not true after {RELEASE_GRACE:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Joins a task, re-raising its panic so the case fails with the task's message.
pub(crate) async fn join<T>(task: JoinHandle<T>) -> T {
    match task.await {
        Ok(value) => value,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => panic!("a task of the case did not finish: {error}"),
    }
}

pub(crate) async fn must_release<G: LockGuard>(guard: G, why: &str) {
    let key = guard.info().key().to_owned();
    let outcome = guard.release().await;
    assert_eq!(
        outcome,
        ReleaseOutcome::Unlocked,
        "{why}: releasing the guard of {key:?} must unlock it"
    );
}

pub(crate) fn assert_timeout_error(
    error: &LockAcquisitionError,
    key: &str,
    timeout: Duration,
    why: &str,
) {
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::Timeout,
        "{why}: a wait that outlasts its timeout must fail with kind Timeout, got {error:?}"
    );
    assert!(error.is_timeout(), "{why}: is_timeout() must be true");
    assert_eq!(
        error.timeout(),
        Some(timeout),
        "{why}: the error must carry the timeout of the call"
    );
    assert_eq!(error.key(), key, "{why}: the error must name the key");
    assert!(
        error.reason().contains("Timeout"),
        "{why}: the reason must say Timeout, got {:?}",
        error.reason()
    );
    assert_eq!(
        error.to_string(),
        format!(
            "Failed to acquire lock '{key}': {}",
            crate::timeout_reason(timeout)
        ),
        "{why}: the message must be the original library's"
    );
}

/// (1) `acquire` yields a [`LockInfo`](crate::LockInfo) for the requested key: the key,
/// its derived lock id, and an `acquired_at` of now in UTC. `with_lock` hands the body
/// the same.
pub async fn acquire_yields_info_for_the_key<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let odd = format!("conformance:é 'quoted' \"; --:{}", Uuid::new_v4());
    for key in [unique_key("acquire_yields_info_for_the_key"), odd] {
        let before = OffsetDateTime::now_utc();
        let guard = must_acquire(&manager, &key, "acquire of a free key").await;
        let after = OffsetDateTime::now_utc();
        let info = guard.info().clone();
        assert_eq!(info.key(), key, "LockInfo::key must be the requested key");
        assert_eq!(
            info.lock_id(),
            lock_id(&key),
            "LockInfo::lock_id must be locks_port::lock_id(key) (sha256-v1)"
        );
        assert!(
            info.acquired_at() >= before - CLOCK_SLACK && info.acquired_at() <= after + CLOCK_SLACK,
            "LockInfo::acquired_at must be the time of acquisition: {} is not within {CLOCK_SLACK} of [{before}, {after}]",
            info.acquired_at()
        );
        assert_eq!(
            info.acquired_at().offset(),
            time::UtcOffset::UTC,
            "LockInfo::acquired_at must be in UTC"
        );
        must_release(guard, "acquire yields info").await;

        let from_body = manager
            .with_lock(&key, bounded(WAIT), |info| async move { info })
            .await
            .unwrap_or_else(|error| panic!("with_lock of a free key failed: {error}"));
        assert_eq!(
            from_body.key(),
            key,
            "with_lock must hand the body the info of the requested key"
        );
        assert_eq!(from_body.lock_id(), lock_id(&key));
    }
}

/// (2) `is_held` is true while the lock is held (through a guard or inside
/// `with_lock`) and false after it is released; `held_lock_count` follows.
pub async fn is_held_inside_and_not_after<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let key = unique_key("is_held_inside_and_not_after");
    assert!(
        !manager.is_held(&key),
        "is_held must be false before acquire"
    );
    assert_eq!(manager.held_lock_count(), 0, "a new manager holds nothing");

    let guard = must_acquire(&manager, &key, "acquire of a free key").await;
    assert!(
        manager.is_held(&key),
        "is_held must be true while a guard holds the key"
    );
    assert_eq!(
        manager.held_lock_count(),
        1,
        "held_lock_count must count a guard's lock"
    );
    must_release(guard, "is_held").await;
    assert!(
        !manager.is_held(&key),
        "is_held must be false after the guard is released"
    );
    assert_eq!(
        manager.held_lock_count(),
        0,
        "held_lock_count after release"
    );

    let inside = {
        let manager_in_body = manager.clone();
        let key_in_body = key.clone();
        manager
            .with_lock(&key, bounded(WAIT), move |_| async move {
                (
                    manager_in_body.is_held(&key_in_body),
                    manager_in_body.held_lock_count(),
                )
            })
            .await
            .unwrap_or_else(|error| panic!("with_lock of a free key failed: {error}"))
    };
    assert_eq!(
        inside,
        (true, 1),
        "inside with_lock, is_held must be true and held_lock_count 1"
    );
    assert!(
        !manager.is_held(&key),
        "is_held must be false after with_lock returns"
    );
    assert_eq!(
        manager.held_lock_count(),
        0,
        "held_lock_count after with_lock"
    );
}

/// The error the body of [`with_lock_releases_on_error_and_returns_it`] fails with.
#[derive(Debug, PartialEq, Eq)]
struct BodyFailed(Uuid);

/// (3) `with_lock` releases the lock when its body fails, and hands back that same
/// error unchanged; another manager can take the key at once.
pub async fn with_lock_releases_on_error_and_returns_it<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let key = unique_key("with_lock_releases_on_error_and_returns_it");
    let marker = Uuid::new_v4();
    let result = manager
        .with_lock(&key, bounded(WAIT), move |_| async move {
            Err::<(), _>(BodyFailed(marker))
        })
        .await;
    match result {
        Ok(Err(error)) => assert_eq!(
            error,
            BodyFailed(marker),
            "with_lock must hand back the body's own error unchanged"
        ),
        Ok(Ok(())) => panic!("with_lock turned the body's error into success"),
        Err(error) => panic!("with_lock of a free key failed to acquire: {error}"),
    }
    assert!(
        !manager.is_held(&key),
        "with_lock must release the lock when its body fails"
    );
    assert_eq!(manager.held_lock_count(), 0);
    let other = harness.manager();
    let guard = must_take(
        &other,
        &key,
        "with_lock must release the lock when its body fails (another manager tried the key)",
    )
    .await;
    must_release(guard, "with_lock error").await;
}

/// (4) `try_acquire` takes a free key and gives `None` for a held one, whether the
/// holder is the same manager or another one; it never waits.
pub async fn try_acquire_takes_free_and_refuses_held<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("try_acquire_takes_free_and_refuses_held");
    let guard = must_take(&a, &key, "try_acquire of a free key must succeed").await;
    must_be_busy(
        &a,
        &key,
        "try_acquire of a key the same manager holds must give None",
    )
    .await;
    must_be_busy(
        &b,
        &key,
        "try_acquire of a key another manager holds must give None",
    )
    .await;
    assert_eq!(
        a.held_lock_count(),
        1,
        "a refused try_acquire must not change the holder's bookkeeping"
    );
    assert!(a.is_held(&key));
    assert_eq!(
        b.held_lock_count(),
        0,
        "a refused try_acquire must not count as held"
    );
    assert!(!b.is_held(&key));
    must_release(guard, "try_acquire").await;

    let guard = must_take(&b, &key, "try_acquire of a released key must succeed").await;
    must_be_busy(
        &a,
        &key,
        "try_acquire of a key another manager holds must give None",
    )
    .await;
    must_release(guard, "try_acquire").await;
}

/// (5) `release(key)` makes the key acquirable again, after `try_acquire` and
/// [`LockGuard::into_held`] as in the original; so does a guard's release.
pub async fn release_makes_key_acquirable_again<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("release_makes_key_acquirable_again");

    let guard = must_take(&a, &key, "try_acquire of a free key").await;
    let info = guard.into_held();
    assert_eq!(info.key(), key, "into_held must hand back the lock's info");
    assert!(
        a.is_held(&key),
        "after into_held the manager must still hold the key"
    );
    assert_eq!(a.held_lock_count(), 1);
    must_be_busy(&b, &key, "after into_held the lock must stay held").await;
    if let Err(error) = a.release(&key).await {
        panic!("release of a key held through into_held failed: {error}");
    }
    assert!(!a.is_held(&key), "is_held must be false after release(key)");
    assert_eq!(a.held_lock_count(), 0);
    let guard = must_take(&b, &key, "release(key) must make the key acquirable again").await;
    must_be_busy(&a, &key, "the key is now held by another manager").await;
    must_release(guard, "release").await;

    let guard = must_acquire(&a, &key, "acquire after the other manager released").await;
    must_be_busy(&b, &key, "acquired again").await;
    must_release(guard, "release").await;
    let guard = must_take(
        &b,
        &key,
        "a guard's release must make the key acquirable again",
    )
    .await;
    must_release(guard, "release").await;
}

/// (6) `release` of a key this manager does not hold fails with
/// [`LockNotHeldError`](crate::LockNotHeldError) naming the key, with the original's
/// message; so does a second release of the same key.
pub async fn release_of_unheld_key_fails<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let key = unique_key("release_of_unheld_key_fails");
    let error = manager
        .release(&key)
        .await
        .expect_err("release of a never-held key must fail with LockNotHeldError");
    assert_eq!(error.key(), key, "LockNotHeldError must name the key");
    assert_eq!(
        error.to_string(),
        format!("Lock '{key}' is not held by this session"),
        "LockNotHeldError's message must be the original library's"
    );

    let guard = must_take(&manager, &key, "try_acquire of a free key").await;
    let _info = guard.into_held();
    if let Err(error) = manager.release(&key).await {
        panic!("release of a held key failed: {error}");
    }
    let error = manager
        .release(&key)
        .await
        .expect_err("a second release of the same key must fail with LockNotHeldError");
    assert_eq!(error.key(), key);
}

/// (7) `acquire` with a 50 ms timeout on a held key fails with a timeout
/// [`LockAcquisitionError`]: kind, timeout, key, reason and message as the original's.
pub async fn acquire_times_out_on_held_key<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("acquire_times_out_on_held_key");
    let timeout = Duration::from_millis(50);
    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    let error = match b.acquire(&key, bounded(timeout)).await {
        Ok(_guard) => panic!("acquire of a held key must not succeed while it is held"),
        Err(error) => error,
    };
    assert_timeout_error(&error, &key, timeout, "acquire with a 50 ms timeout");
    assert_eq!(
        error.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.05s")
    );
    assert!(
        !b.is_held(&key),
        "a timed-out acquire must not count as held"
    );
    assert_eq!(b.held_lock_count(), 0);
    assert!(a.is_held(&key), "the holder must keep its lock");
    must_release(guard, "timeout").await;
}

/// (8) Locks on different keys are independent.
pub async fn different_keys_are_independent<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let [k1, k2, k3] = ["1", "2", "3"].map(|n| unique_key(&format!("independent-{n}")));
    let g1 = must_acquire(&a, &k1, "acquire of a free key").await;
    let g2 = must_take(&b, &k2, "a lock on another key must not block this one").await;
    let g3 = must_acquire(&a, &k3, "a manager may hold several keys").await;
    assert_eq!(
        a.held_lock_count(),
        2,
        "held_lock_count must count each key"
    );
    assert_eq!(b.held_lock_count(), 1);
    assert!(a.is_held(&k1) && a.is_held(&k3) && !a.is_held(&k2));
    assert!(b.is_held(&k2) && !b.is_held(&k1));
    match b.acquire(&k1, bounded(Duration::from_millis(50))).await {
        Ok(_guard) => panic!("a key held by another manager must stay exclusive"),
        Err(error) => assert!(error.is_timeout(), "expected a timeout, got {error}"),
    }
    must_release(g1, "independent keys").await;
    assert!(
        a.is_held(&k3),
        "releasing one key must leave the others held"
    );
    must_be_busy(&b, &k3, "releasing one key must leave the others held").await;
    must_release(g2, "independent keys").await;
    must_release(g3, "independent keys").await;
    assert_eq!(a.held_lock_count(), 0);
    assert_eq!(b.held_lock_count(), 0);
}

/// (9) `release_all` releases everything this manager holds (guards included) and
/// returns how many; it leaves other managers' locks alone; with nothing held it
/// returns 0. A guard whose lock it took reports
/// [`ReleaseOutcome::AlreadyReleased`] and does not disturb the key's next holder.
pub async fn release_all_returns_count_and_empties<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let c = harness.manager();
    let keys = ["1", "2", "3"].map(|n| unique_key(&format!("release_all-{n}")));
    let other = unique_key("release_all-other");

    assert_eq!(
        a.release_all().await,
        0,
        "release_all with nothing held must return 0"
    );
    let _ = must_take(&a, &keys[0], "try_acquire").await.into_held();
    let _ = must_take(&a, &keys[1], "try_acquire").await.into_held();
    let guard = must_acquire(&a, &keys[2], "acquire").await;
    let _ = must_take(&b, &other, "try_acquire").await.into_held();
    assert_eq!(
        a.held_lock_count(),
        3,
        "held_lock_count must count this manager's locks only (another manager holds one more)"
    );

    assert_eq!(
        a.release_all().await,
        3,
        "release_all must return how many locks it released"
    );
    assert_eq!(
        a.held_lock_count(),
        0,
        "release_all must empty the registry"
    );
    for key in &keys {
        assert!(!a.is_held(key), "is_held must be false after release_all");
    }
    let mut taken = Vec::new();
    for key in &keys {
        taken.push(must_take(&c, key, "release_all must free every lock it counted").await);
    }
    assert_eq!(
        guard.release().await,
        ReleaseOutcome::AlreadyReleased,
        "a guard whose lock release_all took must report AlreadyReleased"
    );
    must_be_busy(
        &b,
        &keys[2],
        "a stale guard's release must not free the key's next holder",
    )
    .await;

    assert!(
        b.is_held(&other),
        "release_all of one manager must leave another manager's locks alone"
    );
    assert_eq!(b.held_lock_count(), 1);
    must_be_busy(
        &c,
        &other,
        "release_all of one manager must leave another manager's locks held",
    )
    .await;
    assert_eq!(
        a.release_all().await,
        0,
        "a second release_all must find nothing"
    );
    assert_eq!(b.release_all().await, 1);
    let guard = must_take(&c, &other, "release_all must free the lock").await;
    must_release(guard, "release_all").await;
    for guard in taken {
        must_release(guard, "release_all").await;
    }
}

/// Dropping a guard releases its lock (possibly asynchronously) and removes it from
/// the manager's bookkeeping.
pub async fn dropped_guard_releases<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("dropped_guard_releases");
    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    must_be_busy(&b, &key, "the key is held").await;
    drop(guard);
    eventually(
        || !a.is_held(&key) && a.held_lock_count() == 0,
        "a dropped guard's lock must leave the manager's bookkeeping",
    )
    .await;
    let guard = eventually_acquirable(&b, &key, "a dropped guard must release its lock").await;
    must_release(guard, "dropped guard").await;
}

/// A body that panics inside `with_lock` still releases the lock (the guard is
/// dropped while unwinding).
pub async fn with_lock_releases_when_body_panics<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("with_lock_releases_when_body_panics");
    let task = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move {
            a.with_lock(&key, bounded(WAIT), |_| async { panic_in_body() })
                .await
        })
    };
    match task.await {
        Err(error) if error.is_panic() => {}
        Err(error) => panic!("the task of the case did not finish: {error}"),
        Ok(Ok(())) => panic!("the body's panic was swallowed"),
        Ok(Err(error)) => panic!("with_lock of a free key failed to acquire: {error}"),
    }
    let guard = eventually_acquirable(&b, &key, "a panicking body must release its lock").await;
    eventually(
        || !a.is_held(&key) && a.held_lock_count() == 0,
        "a panicking body's lock must leave the manager's bookkeeping",
    )
    .await;
    must_release(guard, "panicking body").await;
}

/// The body of [`with_lock_releases_when_body_panics`].
fn panic_in_body() {
    panic!(
        "deliberate panic in a lock body (conformance case with_lock_releases_when_body_panics)"
    );
}

/// Aborting the task that holds a guard releases the lock (the original's "release on
/// cancellation of the holding task").
pub async fn aborted_holder_task_releases<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("aborted_holder_task_releases");
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel();
    let task = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let _guard = must_acquire(&a, &key, "acquire of a free key").await;
            let _ = acquired_tx.send(());
            std::future::pending::<()>().await;
        })
    };
    if acquired_rx.await.is_err() {
        join(task).await;
        panic!("the holder task ended without acquiring");
    }
    must_be_busy(&b, &key, "the holder task holds the key").await;
    task.abort();
    let _ = task.await;
    let guard =
        eventually_acquirable(&b, &key, "aborting the holding task must release its lock").await;
    eventually(
        || !a.is_held(&key) && a.held_lock_count() == 0,
        "an aborted holder's lock must leave the manager's bookkeeping",
    )
    .await;
    must_release(guard, "aborted holder").await;
}

/// A zero timeout makes exactly one attempt: it succeeds on a free key and fails at
/// once, as a timeout with `timeout() == Some(0)`, on a held one.
pub async fn zero_timeout_makes_one_attempt<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("zero_timeout_makes_one_attempt");
    let guard = match a.acquire(&key, bounded(Duration::ZERO)).await {
        Ok(guard) => guard,
        Err(error) => panic!("a zero timeout must still make one attempt on a free key: {error}"),
    };
    let started = Instant::now();
    let error = match b.acquire(&key, bounded(Duration::ZERO)).await {
        Ok(_guard) => panic!("acquire with a zero timeout got a held key"),
        Err(error) => error,
    };
    assert!(
        started.elapsed() < WAIT,
        "a zero timeout must fail promptly, took {:?}",
        started.elapsed()
    );
    assert_timeout_error(&error, &key, Duration::ZERO, "acquire with a zero timeout");
    assert_eq!(b.held_lock_count(), 0);
    must_release(guard, "zero timeout").await;
    let guard = match b.acquire(&key, bounded(Duration::ZERO)).await {
        Ok(guard) => guard,
        Err(error) => panic!("a zero timeout on a released key must succeed: {error}"),
    };
    must_release(guard, "zero timeout").await;
}

/// Many tasks, each with its own manager, hammering one key never overlap inside the
/// critical section, and every acquisition happens exactly once.
pub async fn contenders_never_overlap<H: Harness>(harness: &H) {
    let key = unique_key("contenders_never_overlap");
    let in_section = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let critical_section = {
        let in_section = Arc::clone(&in_section);
        let most_inside = Arc::clone(&most_inside);
        let entries = Arc::clone(&entries);
        move || {
            let in_section = Arc::clone(&in_section);
            let most_inside = Arc::clone(&most_inside);
            let entries = Arc::clone(&entries);
            async move {
                let inside = in_section.fetch_add(1, Ordering::SeqCst) + 1;
                most_inside.fetch_max(inside, Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                in_section.fetch_sub(1, Ordering::SeqCst);
                entries.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let tasks: Vec<_> = (0..HAMMER_TASKS)
        .map(|_| {
            let manager = harness.manager();
            let key = key.clone();
            let critical_section = critical_section.clone();
            tokio::spawn(async move {
                for iteration in 0..HAMMER_ITERATIONS {
                    if iteration % 2 == 0 {
                        let guard = must_acquire(&manager, &key, "a contended acquire").await;
                        critical_section().await;
                        must_release(guard, "contenders").await;
                    } else {
                        let body = critical_section.clone();
                        manager
                            .with_lock(&key, bounded(WAIT), move |_| body())
                            .await
                            .unwrap_or_else(|error| {
                                panic!("a contended with_lock failed to acquire: {error}")
                            });
                    }
                }
                assert_eq!(manager.held_lock_count(), 0);
            })
        })
        .collect();
    for task in tasks {
        join(task).await;
    }
    assert_eq!(
        most_inside.load(Ordering::SeqCst),
        1,
        "two holders were inside the critical section at once: the lock does not exclude"
    );
    assert_eq!(
        entries.load(Ordering::SeqCst),
        HAMMER_TASKS * HAMMER_ITERATIONS,
        "every acquisition must enter the critical section exactly once"
    );
}

/// Concurrent `try_acquire`s of one free key from several managers: exactly one wins.
pub async fn concurrent_try_acquire_has_one_winner<H: Harness>(harness: &H) {
    let key = unique_key("concurrent_try_acquire_has_one_winner");
    let start = Arc::new(tokio::sync::Barrier::new(HAMMER_TASKS));
    let tasks: Vec<_> = (0..HAMMER_TASKS)
        .map(|_| {
            let manager = harness.manager();
            let key = key.clone();
            let start = Arc::clone(&start);
            tokio::spawn(async move {
                start.wait().await;
                match manager.try_acquire(&key).await {
                    Ok(guard) => guard,
                    Err(error) => panic!("try_acquire({key:?}) failed: {error}"),
                }
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        winners.extend(join(task).await);
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {HAMMER_TASKS} concurrent try_acquires of a free key must win"
    );
    for guard in winners {
        must_release(guard, "concurrent try_acquire").await;
    }
}

/// Tasks waiting (without a timeout) on one key all get their turn once the holder
/// releases, each exactly once, and none gets it while it is held.
pub async fn every_waiter_gets_a_turn<H: Harness>(harness: &H) {
    let holder = harness.manager();
    let key = unique_key("every_waiter_gets_a_turn");
    let guard = must_acquire(&holder, &key, "acquire of a free key").await;
    let turns = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|waiter| {
            let manager = harness.manager();
            let key = key.clone();
            let turns = Arc::clone(&turns);
            tokio::spawn(async move {
                let guard = match manager.acquire(&key, AcquireOptions::new()).await {
                    Ok(guard) => guard,
                    Err(error) => panic!("a waiter without a timeout failed: {error}"),
                };
                turns
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(waiter);
                tokio::task::yield_now().await;
                must_release(guard, "waiter").await;
            })
        })
        .collect();
    // Give the waiters time to start waiting (not a timing assertion).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty(),
        "a waiter got the lock while another manager held it"
    );
    must_release(guard, "holder").await;
    for task in tasks {
        join(task).await;
    }
    let mut turns = std::mem::take(&mut *turns.lock().unwrap_or_else(PoisonError::into_inner));
    turns.sort_unstable();
    assert_eq!(
        turns,
        (0..WAITERS).collect::<Vec<_>>(),
        "every waiter must get the lock exactly once"
    );
}

/// [`LockGuard::release`] says what happened: `Unlocked` for a held lock,
/// `AlreadyReleased` after `release(key)`; a stale guard never releases a newer
/// acquisition of the same key by the same manager.
pub async fn guard_release_reports_outcome<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("guard_release_reports_outcome");

    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    assert_eq!(
        guard.release().await,
        ReleaseOutcome::Unlocked,
        "releasing a held guard must report Unlocked"
    );

    let stale = must_acquire(&a, &key, "acquire of a released key").await;
    if let Err(error) = a.release(&key).await {
        panic!("release(key) of a key held through a guard failed: {error}");
    }
    assert!(!a.is_held(&key), "release(key) must release a guard's lock");
    let guard = must_take(&b, &key, "release(key) must free a guard's lock").await;
    assert_eq!(
        stale.release().await,
        ReleaseOutcome::AlreadyReleased,
        "a guard's release after release(key) must report AlreadyReleased"
    );
    must_be_busy(
        &a,
        &key,
        "a stale guard's release must not free another manager's lock",
    )
    .await;
    must_release(guard, "guard outcome").await;

    let stale = must_acquire(&a, &key, "acquire of a released key").await;
    if let Err(error) = a.release(&key).await {
        panic!("release(key) failed: {error}");
    }
    let current = must_acquire(&a, &key, "a new acquisition by the same manager").await;
    drop(stale);
    assert_eq!(
        stale_free_check(&a, &b, &key).await,
        (true, 1),
        "dropping a stale guard must not release the same manager's newer acquisition"
    );
    must_release(current, "guard outcome").await;
    assert_eq!(a.held_lock_count(), 0);
}

/// Whether `a` still holds `key` (and its count) after giving a stale guard's drop
/// time to do damage, checking with `b` that the key stays busy.
async fn stale_free_check<M: DistributedLock + LockRegistry>(
    a: &M,
    b: &M,
    key: &str,
) -> (bool, usize) {
    // An asynchronous release by drop would happen within this time.
    tokio::time::sleep(Duration::from_millis(200)).await;
    must_be_busy(
        b,
        key,
        "dropping a stale guard must not release the same manager's newer acquisition",
    )
    .await;
    (a.is_held(key), a.held_lock_count())
}

/// A second acquisition of a key the same manager holds contends like any other:
/// a bounded one times out, an unbounded one waits and succeeds once the first is
/// released; the bookkeeping counts one lock throughout.
pub async fn second_acquire_by_same_manager_waits<H: Harness>(harness: &H) {
    let a = harness.manager();
    let key = unique_key("second_acquire_by_same_manager_waits");
    let first = must_acquire(&a, &key, "acquire of a free key").await;
    let timeout = Duration::from_millis(100);
    match a.acquire(&key, bounded(timeout)).await {
        Ok(_guard) => panic!("a manager must not acquire a key it already holds twice"),
        Err(error) => assert_timeout_error(
            &error,
            &key,
            timeout,
            "a second acquire by the same manager",
        ),
    }
    assert!(
        a.is_held(&key),
        "a failed second acquire must not disturb the first"
    );
    assert_eq!(a.held_lock_count(), 1);

    let second = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move { a.acquire(&key, bounded(WAIT)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        a.held_lock_count(),
        1,
        "a waiting acquisition must not count as held"
    );
    must_release(first, "first acquisition").await;
    let second = match join(second).await {
        Ok(guard) => guard,
        Err(error) => {
            panic!("the second acquisition must succeed after the first is released: {error}")
        }
    };
    assert!(a.is_held(&key));
    assert_eq!(a.held_lock_count(), 1, "held_lock_count after the handover");
    must_release(second, "second acquisition").await;
    assert!(!a.is_held(&key));
    assert_eq!(a.held_lock_count(), 0);
}

/// `is_held`, `held_lock_count`, `release` and `release_all` answer for one manager:
/// another manager neither sees nor can release its locks.
pub async fn bookkeeping_is_per_manager<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let c = harness.manager();
    let key = unique_key("bookkeeping_is_per_manager");
    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    assert!(
        !b.is_held(&key),
        "is_held must answer for this manager only"
    );
    assert_eq!(b.held_lock_count(), 0);
    let error = b
        .release(&key)
        .await
        .expect_err("release of a key another manager holds must fail with LockNotHeldError");
    assert_eq!(error.key(), key);
    assert_eq!(
        b.release_all().await,
        0,
        "release_all must not count other managers' locks"
    );
    assert!(a.is_held(&key));
    must_be_busy(
        &c,
        &key,
        "another manager's release must not free the holder's lock",
    )
    .await;
    must_release(guard, "per manager").await;
}

/// [`WaitStrategy::Poll`] times out like the queue and acquires once the holder
/// releases.
pub async fn poll_strategy_acquires_after_release<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("poll_strategy_acquires_after_release");
    let poll = AcquireOptions::new()
        .with_wait_strategy(WaitStrategy::Poll)
        .with_retry_interval(Duration::from_millis(20));

    let guard = match b.acquire(&key, poll.with_timeout(WAIT)).await {
        Ok(guard) => guard,
        Err(error) => panic!("polling acquire of a free key failed: {error}"),
    };
    must_release(guard, "poll").await;

    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    let timeout = Duration::from_millis(100);
    match b.acquire(&key, poll.with_timeout(timeout)).await {
        Ok(_guard) => panic!("a polling acquire got a held key"),
        Err(error) => assert_timeout_error(&error, &key, timeout, "a polling acquire"),
    }
    assert_eq!(b.held_lock_count(), 0);
    let waiter = {
        let b = b.clone();
        let key = key.clone();
        tokio::spawn(async move { b.acquire(&key, poll.with_timeout(WAIT)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    must_release(guard, "holder").await;
    let guard = match join(waiter).await {
        Ok(guard) => guard,
        Err(error) => panic!("a polling acquire must succeed after the holder releases: {error}"),
    };
    assert!(b.is_held(&key));
    must_release(guard, "poll").await;
}

/// A bounded wait in the queue on a held key returns a timeout after about its
/// timeout (generously bounded) and leaves nothing held behind.
pub async fn queue_timeout_returns_and_leaves_nothing<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("queue_timeout_returns_and_leaves_nothing");
    let timeout = Duration::from_millis(200);
    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    let started = Instant::now();
    let result = b
        .acquire(
            &key,
            bounded(timeout).with_wait_strategy(WaitStrategy::Queue),
        )
        .await;
    let elapsed = started.elapsed();
    match result {
        Ok(_guard) => panic!("a queued acquire got a held key"),
        Err(error) => assert_timeout_error(&error, &key, timeout, "a queued acquire"),
    }
    assert!(
        elapsed >= timeout / 2,
        "a bounded wait gave up after {elapsed:?}, well before its {timeout:?} timeout"
    );
    assert!(
        elapsed < WAIT,
        "a bounded wait of {timeout:?} took {elapsed:?} to return"
    );
    assert!(!b.is_held(&key));
    assert_eq!(b.held_lock_count(), 0);
    must_release(guard, "holder").await;
    let guard = eventually_acquirable(
        &b,
        &key,
        "a timed-out wait must not leave the lock held when the holder releases",
    )
    .await;
    must_release(guard, "queue timeout").await;
}

/// Dropping an `acquire` future while it waits leaves nothing held: once the holder
/// releases, the key is free for anyone.
pub async fn cancelled_acquire_leaves_nothing_held<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let c = harness.manager();
    let key = unique_key("cancelled_acquire_leaves_nothing_held");
    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    let waited = tokio::time::timeout(
        Duration::from_millis(100),
        b.acquire(&key, AcquireOptions::new()),
    )
    .await;
    assert!(
        waited.is_err(),
        "an acquire of a held key must still be waiting"
    );
    assert!(
        !b.is_held(&key),
        "a cancelled acquire must not count as held"
    );
    assert_eq!(b.held_lock_count(), 0);
    must_release(guard, "holder").await;
    let guard = eventually_acquirable(
        &c,
        &key,
        "a cancelled acquire must not leave the lock held (a dropped wait must not be granted later)",
    )
    .await;
    assert!(!b.is_held(&key));
    assert_eq!(b.held_lock_count(), 0);
    must_release(guard, "cancelled acquire").await;
}

/// Support for [`conformance_suite!`](crate::conformance_suite); not a public API.
#[doc(hidden)]
pub mod __private {
    use super::{CASE_TIME_LIMIT, Future};

    /// Runs one case on a fresh two-worker runtime, failing it after
    /// [`CASE_TIME_LIMIT`].
    pub fn run_case(name: &str, case: impl Future<Output = ()>) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|error| panic!("cannot build a Tokio runtime for {name}: {error}"));
        runtime.block_on(async {
            if tokio::time::timeout(CASE_TIME_LIMIT, case).await.is_err() {
                panic!(
                    "conformance case {name} did not finish within {CASE_TIME_LIMIT:?}: the adapter may be deadlocked"
                );
            }
        });
    }
}

/// Stamps out one `#[test]` per case of [`conformance`](crate::conformance).
///
/// Takes an expression that builds the [`Harness`](crate::conformance::Harness). Each
/// test evaluates it once, inside its own multi-threaded Tokio runtime (two workers,
/// time and I/O enabled), so the expression may `.await`. Each test fails after
/// [`CASE_TIME_LIMIT`](crate::conformance::CASE_TIME_LIMIT).
///
/// The tests are plain functions named after the cases; invoke the macro inside a
/// module of the adapter's integration tests:
///
/// ```text
/// mod conformance {
///     locks_port::conformance_suite!(crate::MemoryHarness::new());
/// }
/// ```
///
/// The adapter needs only `locks-port` with the `conformance` feature as a
/// dev-dependency; the macro brings its own runtime.
#[macro_export]
macro_rules! conformance_suite {
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::__private::run_case(stringify!($case), async {
                    let harness = $harness;
                    $crate::conformance::$case(&harness).await;
                });
            }
        )*
    };
    ($harness:expr $(,)?) => {
        $crate::conformance_suite!(@cases $harness;
            acquire_yields_info_for_the_key,
            is_held_inside_and_not_after,
            with_lock_releases_on_error_and_returns_it,
            try_acquire_takes_free_and_refuses_held,
            release_makes_key_acquirable_again,
            release_of_unheld_key_fails,
            acquire_times_out_on_held_key,
            different_keys_are_independent,
            release_all_returns_count_and_empties,
            dropped_guard_releases,
            with_lock_releases_when_body_panics,
            aborted_holder_task_releases,
            zero_timeout_makes_one_attempt,
            contenders_never_overlap,
            concurrent_try_acquire_has_one_winner,
            every_waiter_gets_a_turn,
            guard_release_reports_outcome,
            second_acquire_by_same_manager_waits,
            bookkeeping_is_per_manager,
            poll_strategy_acquires_after_release,
            queue_timeout_returns_and_leaves_nothing,
            cancelled_acquire_leaves_nothing_held,
            release_by_key_tells_the_guard,
            release_all_tells_every_guard,
            with_lock_until_lost_stops_the_body,
            huge_timeouts_saturate,
            poll_without_timeout_waits_in_queue,
            shared_holders_coexist,
            exclusive_excludes_shared,
            queued_writer_is_not_starved,
        );
    };
}

/// Stamps out one `#[test]` per case of [`AcquireMany`](crate::AcquireMany), for a
/// harness whose manager offers it; like [`conformance_suite!`](crate::conformance_suite)
/// (use both in one module: the test names differ).
#[macro_export]
macro_rules! acquire_many_suite {
    ($harness:expr $(,)?) => {
        $crate::conformance_suite!(@cases $harness;
            acquire_many_takes_all_in_lock_id_order,
            acquire_many_is_all_or_nothing,
            dropped_acquire_many_leaves_nothing_held,
            acquire_many_of_nothing_holds_nothing,
            acquire_many_tells_of_a_member_taken_away,
        );
    };
}
