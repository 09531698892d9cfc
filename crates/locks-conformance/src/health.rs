//! Cases of the lost-lock signal and of deadlines the API accepts.

use std::future::IntoFuture;
use std::time::Duration;

use super::Harness;
use super::fixtures::{
    WAIT, bounded, eventually_acquirable, join, must_acquire, must_be_busy, must_release,
    unique_key,
};
use locks_port::{
    AcquireOptions, DistributedLock, LockError, LockGuard, LockRegistry, LostReason,
    ReleaseOutcome, WaitStrategy,
};

/// How long a signal that must fire may take, and how long one that must not is watched.
const SIGNAL_GRACE: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(200);

async fn must_fire<G: LockGuard>(guard: &G, expected: LostReason, why: &str) {
    match tokio::time::timeout(SIGNAL_GRACE, guard.lost().into_future()).await {
        Ok(reason) => assert_eq!(reason, expected, "{why}: lost() gave the wrong reason"),
        Err(_) => panic!("{why}: lost() did not fire within {SIGNAL_GRACE:?}"),
    }
    assert!(
        guard.is_lost(),
        "{why}: is_lost() must be true once lost() fired"
    );
}

async fn must_stay_quiet<G: LockGuard>(guard: &G, why: &str) {
    assert!(
        !guard.is_lost(),
        "{why}: is_lost() must be false while held"
    );
    let fired = tokio::time::timeout(QUIET, guard.lost().into_future()).await;
    assert!(
        fired.is_err(),
        "{why}: lost() fired while the lock was held: {fired:?}"
    );
}

/// A held guard's `lost()` stays pending; the manager's `release(key)` of that key (a
/// shutdown taking it away) fires it with [`LostReason::Released`], and the guard then
/// has nothing left to release.
pub async fn release_by_key_tells_the_guard<H: Harness>(harness: &H) {
    let a = harness.manager();
    let key = unique_key("release_by_key_tells_the_guard");
    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    must_stay_quiet(&guard, "a held guard").await;
    let watcher = guard.lost();
    a.release(&key).await.expect("release(key) of a held key");
    must_fire(&guard, LostReason::Released, "release(key)").await;
    assert_eq!(
        watcher.reason(),
        Some(LostReason::Released),
        "every clone of the signal fires"
    );
    assert_eq!(guard.release().await, ReleaseOutcome::AlreadyReleased);
}

/// `release_all()` during a shutdown fires the signal of every guard still in use.
pub async fn release_all_tells_every_guard<H: Harness>(harness: &H) {
    let a = harness.manager();
    let keys: Vec<String> = (0..3)
        .map(|n| unique_key(&format!("release_all_tells_every_guard:{n}")))
        .collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(must_acquire(&a, key, "acquire of a free key").await);
    }
    // A task inside its critical section, waiting on its signal.
    let watched = guards.pop().expect("three guards");
    let task = tokio::spawn(async move {
        let reason = watched.lost().await;
        (reason, watched)
    });
    assert_eq!(a.release_all().await, 3);
    for guard in &guards {
        must_fire(guard, LostReason::Released, "release_all").await;
    }
    let (reason, watched) = tokio::time::timeout(SIGNAL_GRACE, join(task))
        .await
        .expect("the task waiting on lost() must be woken by release_all");
    assert_eq!(reason, LostReason::Released);
    assert!(watched.is_lost());
}

/// `with_lock_until_lost` stops its body when the lock is taken away and says so; the
/// key is free afterwards.
pub async fn with_lock_until_lost_stops_the_body<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("with_lock_until_lost_stops_the_body");
    let runner = a.clone();
    let task_key = key.clone();
    let task = tokio::spawn(async move {
        runner
            .with_lock_until_lost(&task_key, bounded(WAIT), |_info| async {
                std::future::pending::<()>().await;
            })
            .await
    });
    super::fixtures::eventually(|| a.is_held(&key), "the body's lock must be held").await;
    a.release(&key)
        .await
        .expect("release(key) of the body's lock");
    let outcome = tokio::time::timeout(SIGNAL_GRACE, join(task))
        .await
        .expect("the body must be stopped once its lock is lost");
    match outcome {
        Err(LockError::Lost(error)) => {
            assert_eq!(error.reason(), LostReason::Released);
            assert_eq!(error.key(), key);
        }
        other => panic!("with_lock_until_lost must report the loss, got {other:?}"),
    }
    // A body that finishes gives its value.
    let value = a
        .with_lock_until_lost(&key, bounded(WAIT), |_info| async { 7 })
        .await
        .expect("a body that finishes");
    assert_eq!(value, 7);
    let guard = eventually_acquirable(&b, &key, "the key must be free after the body").await;
    must_release(guard, "with_lock_until_lost").await;
}

/// Timeouts too large for the clock (`Duration::MAX`, 1.8e19 s) are accepted and wait
/// as good as forever, with either strategy, instead of panicking.
pub async fn huge_timeouts_saturate<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("huge_timeouts_saturate");
    let huge = [
        AcquireOptions::new().with_timeout(Duration::MAX),
        AcquireOptions::new()
            .with_timeout_secs(1.8e19)
            .expect("1.8e19 s fits a Duration"),
    ];
    for options in huge {
        for strategy in [WaitStrategy::Queue, WaitStrategy::Poll] {
            let options = options.with_wait_strategy(strategy);
            let guard = a
                .acquire(&key, options)
                .await
                .unwrap_or_else(|error| panic!("{options:?} on a free key: {error}"));
            let waited = tokio::time::timeout(QUIET, b.acquire(&key, options)).await;
            assert!(
                waited.is_err(),
                "{options:?} on a held key must still be waiting"
            );
            must_release(guard, "huge timeout").await;
        }
    }
    let guard = eventually_acquirable(&b, &key, "the dropped waits must leave nothing").await;
    must_release(guard, "huge timeouts").await;
}

/// [`WaitStrategy::Poll`] without a timeout waits in the queue, as in the Python library and
/// in every manager: queued behind an earlier waiter, it is served after it, and a
/// later queued waiter is served after it.
pub async fn poll_without_timeout_waits_in_queue<H: Harness>(harness: &H) {
    let holder = harness.manager();
    let poller = harness.manager();
    let queued = harness.manager();
    let key = unique_key("poll_without_timeout_waits_in_queue");
    let guard = must_acquire(&holder, &key, "acquire of a free key").await;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let spawn_waiter = |manager: H::Manager, name: &'static str, options: AcquireOptions| {
        let key = key.clone();
        let order = std::sync::Arc::clone(&order);
        tokio::spawn(async move {
            let guard = manager
                .acquire(&key, options)
                .await
                .unwrap_or_else(|error| panic!("{name}: {error}"));
            order.lock().expect("order").push(name);
            tokio::time::sleep(Duration::from_millis(50)).await;
            must_release(guard, name).await;
        })
    };
    let first = spawn_waiter(
        poller,
        "poller",
        AcquireOptions::new().with_wait_strategy(WaitStrategy::Poll),
    );
    // Let the first waiter reach the queue before the second joins it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = spawn_waiter(queued, "queued", AcquireOptions::new());
    tokio::time::sleep(Duration::from_millis(300)).await;
    must_be_busy(&holder, &key, "both wait").await;
    must_release(guard, "holder").await;
    join(first).await;
    join(second).await;
    assert_eq!(
        *order.lock().expect("order"),
        ["poller", "queued"],
        "an unbounded Poll acquire must wait in the queue, first come first served"
    );
}
