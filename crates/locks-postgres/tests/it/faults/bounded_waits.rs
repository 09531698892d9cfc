//! Bounded waits: a `lock_timeout` (55P03) racing a release, an exhausted pool, and the
//! polling strategy. Multiplexed, the waiter holds neighbours: its try meets their
//! shared connection first, and the waits leave it alone.

use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, ReleaseOutcome,
    WaitStrategy,
};

use super::{Mode, Watched, assert_bounded, assert_pool_within_bounds, holder_and_waiter, timeout};
use crate::support::{pool, unique_key};

in_both_modes!(a_lock_timeout_racing_a_release_never_leaks_the_lock);
async fn a_lock_timeout_racing_a_release_never_leaks_the_lock(mode: Mode) {
    const ROUNDS: u32 = 200;
    const WAITER_TIMEOUT_MS: u64 = 20;
    let (holder, waiter) = holder_and_waiter(mode, 2);
    let lock = Watched::new("55P03-race").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&waiter, &lock.admin).await;
    let (mut acquired, mut timed_out) = (0, 0);

    for round in 0..ROUNDS {
        // The holder lets go from 4 ms before to 4 ms after the waiter's timeout.
        let hold = Duration::from_millis(WAITER_TIMEOUT_MS - 4 + u64::from(round % 9));
        let guard = holder
            .acquire(key, timeout(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|error| panic!("round {round}: holder: {error}"));
        let release = tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            guard.release().await
        });
        let attempt = waiter
            .acquire(key, timeout(Duration::from_millis(WAITER_TIMEOUT_MS)))
            .await;
        assert_eq!(
            release.await.unwrap(),
            ReleaseOutcome::Unlocked,
            "round {round}"
        );
        match attempt {
            Ok(guard) => {
                acquired += 1;
                assert_eq!(lock.holders().await, 1, "round {round}");
                assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
            }
            Err(error) => {
                timed_out += 1;
                assert_eq!(
                    error.kind(),
                    AcquisitionErrorKind::Timeout,
                    "round {round}: {error}"
                );
                assert_eq!(
                    error.timeout(),
                    Some(Duration::from_millis(WAITER_TIMEOUT_MS))
                );
                // The holder released and the waiter holds no guard: nobody holds it.
                assert_eq!(
                    lock.holder_pids().await,
                    Vec::<i32>::new(),
                    "round {round}: a timed-out waiter kept the lock"
                );
            }
        }
        assert_eq!(holder.held_lock_count(), 0, "round {round}");
        assert_eq!(
            waiter.held_lock_count(),
            neighbours.count(),
            "round {round}"
        );
    }
    println!("{mode:?}, {ROUNDS} rounds: waiter acquired {acquired}, timed out {timed_out}");
    assert_eq!(lock.holders().await, 0);
    neighbours.assert_untouched(&lock.admin).await;
    neighbours.release().await;
    assert_eq!(holder.release_all().await, 0);
    assert_eq!(waiter.release_all().await, 0);
    assert_pool_within_bounds(&holder);
    assert_pool_within_bounds(&waiter);
}

in_both_modes!(an_exhausted_pool_fails_with_pool_unavailable);
/// Multiplexed, A fills the one connection with its neighbours: B has no room there
/// and needs a connection of its own, as in plain mode.
async fn an_exhausted_pool_fails_with_pool_unavailable(mode: Mode) {
    let manager = mode.manager(pool(1));
    let (a, b) = (unique_key("pool-a"), unique_key("pool-b"));
    let admin = crate::support::admin().await;
    let neighbours = mode.neighbours(&manager, &admin).await;
    let guard = manager.acquire(&a, AcquireOptions::new()).await.unwrap();

    let started = Instant::now();
    let error = manager
        .acquire(&b, timeout(Duration::from_millis(300)))
        .await
        .expect_err("the only connection holds A (and is full)");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(295),
        "gave up after {elapsed:?}"
    );
    assert_bounded("a 300 ms acquire on an exhausted pool", started);
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::PoolUnavailable,
        "{error}"
    );
    assert_eq!(error.timeout(), Some(Duration::from_millis(300)));
    assert!(
        error.to_string().starts_with(&format!(
            "Failed to acquire lock '{b}': Timeout after 0.3s waiting for a pool connection"
        )),
        "{error}"
    );
    println!("300 ms acquire on an exhausted pool gave up after {elapsed:?}");

    let started = Instant::now();
    let error = manager
        .acquire(&b, timeout(Duration::ZERO))
        .await
        .expect_err("the only connection holds A");
    assert_bounded("a zero-timeout acquire on an exhausted pool", started);
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::PoolUnavailable,
        "{error}"
    );
    assert!(
        error.to_string().starts_with(&format!(
            "Failed to acquire lock '{b}': Timeout after 0.0s waiting for a pool connection"
        )),
        "{error}"
    );
    println!(
        "zero-timeout acquire on an exhausted pool gave up after {:?}",
        started.elapsed()
    );
    assert!(!manager.is_held(&b));
    assert_eq!(manager.held_lock_count(), 1 + neighbours.count());
    neighbours.assert_untouched(&admin).await;

    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    let guard = manager
        .acquire(&b, timeout(Duration::from_millis(300)))
        .await
        .expect("the connection is free again (multiplexed: has room again)");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    neighbours.release().await;
}

in_both_modes!(polling_gets_the_lock_after_a_release_and_times_out_like_queueing);
async fn polling_gets_the_lock_after_a_release_and_times_out_like_queueing(mode: Mode) {
    let (holder, waiter) = holder_and_waiter(mode, 1);
    let lock = Watched::new("poll").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&waiter, &lock.admin).await;
    let poll = |timeout: Duration| {
        AcquireOptions::new()
            .with_timeout(timeout)
            .with_wait_strategy(WaitStrategy::Poll)
            .with_retry_interval(Duration::from_millis(20))
    };

    let guard = holder.acquire(key, AcquireOptions::new()).await.unwrap();
    let error = waiter
        .acquire(key, poll(Duration::from_millis(200)))
        .await
        .expect_err("held");
    assert_eq!(error.kind(), AcquisitionErrorKind::Timeout);
    assert_eq!(error.timeout(), Some(Duration::from_millis(200)));
    assert_eq!(
        error.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.2s")
    );
    let error = waiter
        .acquire(key, poll(Duration::ZERO))
        .await
        .expect_err("held");
    assert_eq!(
        error.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.0s")
    );
    // A poller never queues on the server, and gave its connection back (multiplexed:
    // the other one is the neighbours').
    assert!(lock.waiting_pids().await.is_empty());
    assert_eq!(waiter.pool().status().available, 1);

    let polling = tokio::spawn({
        let waiter = waiter.clone();
        let key = key.clone();
        async move { waiter.acquire(&key, poll(Duration::from_secs(5))).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    let guard = polling
        .await
        .unwrap()
        .expect("the poller gets the lock within 5 s of its release");
    assert_eq!(lock.holders().await, 1);
    assert!(waiter.is_held(key));
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(lock.holders().await, 0);
    neighbours.assert_untouched(&lock.admin).await;
    neighbours.release().await;
}
