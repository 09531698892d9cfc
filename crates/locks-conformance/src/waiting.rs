//! Cases of waiting for a held key: timeouts (zero included), the queue and polling
//! strategies, a second acquisition by the holder, and a cancelled wait.

use std::time::{Duration, Instant};

use super::Harness;
use super::fixtures::{
    WAIT, assert_held_here_error, assert_timeout_error, bounded, eventually_acquirable, join,
    must_acquire, must_release, unique_key,
};
#[cfg(doc)]
use locks_port::LockAcquisitionError;
use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, LockMode, LockRegistry, WaitStrategy,
};

/// (7) `acquire` with a 50 ms timeout on a held key fails with a timeout
/// [`LockAcquisitionError`]: kind, timeout, key, reason and message as the Python library's.
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
        Err(error) => assert_held_here_error(
            &error,
            first.info(),
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

/// A wait that times out on a key the asking manager holds itself says so: still a
/// timeout (kind, `is_timeout`, the call's timeout), with the reason naming this manager
/// as the holder (mode, holder id and grant time of its guard) and the fix: with the
/// queue, with polling, with a zero timeout, and for an exclusive request beside this
/// manager's own shared hold. Another manager's timeout on the same key says nothing of
/// the kind (the negative control); `try_acquire` stays `None`, with `is_held` telling
/// why.
pub async fn a_key_this_manager_holds_is_named_in_the_timeout<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("a_key_this_manager_holds_is_named_in_the_timeout");
    // Long enough for a pool to open a connection on a loaded machine: a timeout that
    // expires while opening one is `Unreachable`, not the lock's timeout.
    let timeout = Duration::from_millis(250);
    let held = must_acquire(&a, &key, "acquire of a free key").await;
    let polling = AcquireOptions::new()
        .with_wait_strategy(WaitStrategy::Poll)
        .with_retry_interval(Duration::from_millis(10));
    let cases = [
        ("in the queue", bounded(timeout), timeout),
        ("polling", polling.with_timeout(timeout), timeout),
        (
            "with a zero timeout",
            bounded(Duration::ZERO),
            Duration::ZERO,
        ),
    ];
    for (how, options, timeout) in cases {
        match a.acquire(&key, options).await {
            Ok(_guard) => panic!("{how}: a manager must not take a key it holds twice"),
            Err(error) => assert_held_here_error(&error, held.info(), timeout, how),
        }
        match b.acquire(&key, options).await {
            Ok(_guard) => panic!("{how}: another manager must not take a held key"),
            Err(error) => {
                assert_timeout_error(&error, &key, timeout, how);
                assert!(
                    !error.is_held_by_this_manager(),
                    "{how}: another manager's timeout must not say it holds the key: {error}"
                );
            }
        }
    }
    match a.try_acquire(&key).await {
        Ok(None) => assert!(a.is_held(&key), "is_held tells why try_acquire said no"),
        Ok(Some(_guard)) => panic!("try_acquire must not take a key this manager holds"),
        Err(error) => panic!("try_acquire of a key this manager holds is no error: {error}"),
    }
    must_release(held, "the exclusive hold").await;

    let shared = AcquireOptions::shared().with_timeout(timeout);
    let reader = match a.acquire(&key, shared).await {
        Ok(guard) => guard,
        Err(error) => panic!("a shared acquire of a free key: {error}"),
    };
    assert_eq!(reader.info().mode(), LockMode::Shared);
    match a.acquire(&key, bounded(timeout)).await {
        Ok(_guard) => panic!("an exclusive request must not be granted beside a shared hold"),
        Err(error) => assert_held_here_error(&error, reader.info(), timeout, "beside a reader"),
    }
    must_release(reader, "the shared hold").await;
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
