//! Futures dropped mid-flight: an acquire dropped while it waits (at once, or by a
//! timeout), a `try_acquire`, a `release` or `release_all` dropped at every point, a
//! guard dropped on a thread without a runtime. None may leave a lock behind; in
//! multiplexed mode none may touch the other locks on a shared connection either, but
//! for the guard dropped without a runtime (its shared connection is closed, ADR 0013).

use std::time::Duration;

use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, LockRegistry, LostReason, ReleaseOutcome,
};
use locks_postgres::{PostgresLockManager, tokio_postgres};

use super::{
    Mode, Neighbours, Watched, assert_pool_within_bounds, assert_still_locks, holder_and_waiter,
    timeout, wait_for,
};
use crate::support::{holders, pool, unique_key};

in_both_modes!(an_acquire_dropped_while_queued_leaves_the_queue_and_never_gets_the_lock);
async fn an_acquire_dropped_while_queued_leaves_the_queue_and_never_gets_the_lock(mode: Mode) {
    let (holder, waiter) = holder_and_waiter(mode, 2);
    let lock = Watched::new("dropped-waiter").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&waiter, &lock.admin).await;
    let guard = holder.acquire(key, AcquireOptions::new()).await.unwrap();

    // Drop the acquire exactly once its backend is queued on the server.
    let waiter_pid = {
        let acquire = waiter.acquire(key, AcquireOptions::new());
        tokio::pin!(acquire);
        tokio::select! {
            result = &mut acquire => panic!("acquired a held lock: {result:?}"),
            pid = lock.the_waiter() => pid,
        }
    };
    // It leaves the queue while the lock is still held (its wait is cancelled).
    wait_for("the dropped waiter to leave the lock queue", || async {
        lock.waiting_pids().await.is_empty() && !lock.waits_on_a_lock(waiter_pid).await
    })
    .await;

    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    lock.assert_nobody_takes_it().await;
    assert_waiter_pool_recovered(&waiter, key, &lock, neighbours).await;
}

in_both_modes!(an_acquire_dropped_by_a_200ms_timeout_never_gets_the_lock);
async fn an_acquire_dropped_by_a_200ms_timeout_never_gets_the_lock(mode: Mode) {
    let (holder, waiter) = holder_and_waiter(mode, 2);
    let lock = Watched::new("timed-out-waiter").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&waiter, &lock.admin).await;
    let guard = holder.acquire(key, AcquireOptions::new()).await.unwrap();

    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        waiter.acquire(key, AcquireOptions::new()),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the lock is held: the acquire cannot finish"
    );
    wait_for("no backend left waiting for the lock", || async {
        lock.waiting_pids().await.is_empty()
    })
    .await;
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    lock.assert_nobody_takes_it().await;
    assert_waiter_pool_recovered(&waiter, key, &lock, neighbours).await;
}

/// The dropped waiter kept nothing and left its neighbours alone, and its manager
/// still serves locks.
async fn assert_waiter_pool_recovered(
    waiter: &PostgresLockManager,
    key: &str,
    lock: &Watched,
    neighbours: Neighbours,
) {
    assert_pool_within_bounds(waiter);
    assert_eq!(waiter.held_lock_count(), neighbours.count());
    neighbours.assert_untouched(&lock.admin).await;
    assert_still_locks(waiter, key, "the waiter's pool still serves locks").await;
    neighbours.release().await;
}

/// Points at which to drop a future: not polled at all, then after a growing delay
/// (the last ones let most calls finish, even on a loaded machine where a dropped
/// session's replacement connection takes a while to open).
const DROP_POINTS_US: [Option<u64>; 15] = [
    None,
    Some(0),
    Some(50),
    Some(100),
    Some(200),
    Some(400),
    Some(700),
    Some(1_000),
    Some(1_500),
    Some(2_000),
    Some(3_000),
    Some(5_000),
    Some(10_000),
    Some(20_000),
    Some(50_000),
];

in_both_modes!(a_try_acquire_dropped_mid_flight_leaves_no_lock_held);
async fn a_try_acquire_dropped_mid_flight_leaves_no_lock_held(mode: Mode) {
    // Named, so that the sessions of dropped tries can be told until their backends end.
    let holder = format!("dropped-try-{mode:?}-{}", std::process::id());
    let manager = mode.builder(pool(2)).holder_id(&holder).build();
    let lock = Watched::new("dropped-try").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&manager, &lock.admin).await;
    let (mut dropped, mut finished) = (0, 0);
    for round in 0..3 {
        for point in DROP_POINTS_US {
            let attempt = manager.try_acquire(key);
            let outcome = match point {
                None => {
                    drop(attempt);
                    None
                }
                Some(us) => tokio::time::timeout(Duration::from_micros(us), attempt)
                    .await
                    .ok(),
            };
            match outcome {
                None => dropped += 1,
                Some(result) => {
                    finished += 1;
                    let guard = result
                        .unwrap_or_else(|error| panic!("round {round}: {error}"))
                        .expect("the key was free");
                    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
                }
            }
            assert_eq!(manager.held_lock_count(), neighbours.count());
            assert!(!manager.is_held(key));
            lock.until_free("a dropped try_acquire's lock to be freed")
                .await;
            // A dropped try's statement may not have reached the server yet: the key
            // free above, it may still be taken (and then let go) by that statement, on
            // a closed session whose backend has not ended or, multiplexed, on the shared
            // one. Wait until no backend of this manager is left outside its pool and
            // none is running a statement, the key still free 50 ms later.
            let settled = || async {
                let (named, busy) = named_backends(&lock.admin, &holder).await;
                named <= manager.pool().status().size && busy == 0 && lock.holders().await == 0
            };
            wait_for("a dropped try_acquire's statement to be over", || async {
                settled().await && {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    settled().await
                }
            })
            .await;
        }
    }
    assert!(
        named_backends(&lock.admin, &holder).await.0 >= 1,
        "the pool's sessions carry the holder id (else the wait above saw nothing)"
    );
    println!("{mode:?} try_acquire: dropped mid-flight {dropped}, finished {finished}");
    assert_pool_within_bounds(&manager);
    neighbours.assert_untouched(&lock.admin).await;
    let guard = manager
        .try_acquire(key)
        .await
        .unwrap()
        .expect("the manager still works");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    neighbours.release().await;
}

/// How many server sessions carry holder id `holder` in their `application_name`, and
/// how many of them are not idle (running a statement).
async fn named_backends(admin: &tokio_postgres::Client, holder: &str) -> (usize, usize) {
    let row = admin
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE state <> 'idle') \
             FROM pg_stat_activity WHERE application_name = $1",
            &[&format!("locks:{holder}")],
        )
        .await
        .expect("pg_stat_activity");
    let count = |i: usize| usize::try_from(row.get::<_, i64>(i)).unwrap_or(0);
    (count(0), count(1))
}

in_both_modes!(a_release_dropped_mid_flight_still_frees_the_lock);
async fn a_release_dropped_mid_flight_still_frees_the_lock(mode: Mode) {
    let manager = mode.manager(pool(4));
    let lock = Watched::new("dropped-release").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&manager, &lock.admin).await;
    let (mut dropped, mut finished) = (0, 0);
    for round in 0..3 {
        for point in DROP_POINTS_US {
            let guard = manager
                .acquire(key, timeout(Duration::from_secs(5)))
                .await
                .unwrap_or_else(|error| panic!("round {round}: {error}"));
            let release = guard.release();
            match point {
                None => {
                    drop(release);
                    dropped += 1;
                }
                Some(us) => match tokio::time::timeout(Duration::from_micros(us), release).await {
                    Ok(outcome) => {
                        finished += 1;
                        assert_eq!(outcome, ReleaseOutcome::Unlocked);
                    }
                    Err(_elapsed) => dropped += 1,
                },
            }
            // The bookkeeping is clean at once; the server follows shortly.
            assert!(!manager.is_held(key));
            assert_eq!(manager.held_lock_count(), neighbours.count());
            lock.until_free("a dropped release's lock to be freed")
                .await;
        }
    }
    println!("{mode:?} release: dropped mid-flight {dropped}, finished {finished}");
    neighbours.assert_untouched(&lock.admin).await;
    neighbours.release().await;

    // release_all dropped at its first await: every lock leaves the bookkeeping and
    // is freed on the server all the same (multiplexed: with one connection's worth of
    // locks, so that a whole shared connection is among them).
    let keys: Vec<String> = (0..super::LOCKS_PER_CONNECTION)
        .map(|n| unique_key(&format!("dropped-all-{n}")))
        .collect();
    for key in &keys {
        manager
            .acquire(key, timeout(Duration::from_secs(5)))
            .await
            .unwrap()
            .into_held();
    }
    assert_eq!(manager.held_lock_count(), keys.len());
    let _ = tokio::time::timeout(Duration::ZERO, manager.release_all()).await;
    assert_eq!(manager.held_lock_count(), 0);
    for key in &keys {
        let lock_id = locks_port::lock_id(key);
        wait_for("a dropped release_all's locks to be freed", || async {
            holders(&lock.admin, lock_id).await == 0
        })
        .await;
    }
    assert_pool_within_bounds(&manager);
    assert_still_locks(&manager, key, "the manager still works").await;
}

in_both_modes!(a_guard_dropped_outside_a_runtime_frees_its_lock);
/// Without a runtime there is no I/O: the guard's session is closed, which frees the
/// lock; multiplexed, the neighbours on that shared connection go with it, each told.
async fn a_guard_dropped_outside_a_runtime_frees_its_lock(mode: Mode) {
    let manager = mode.manager(pool(1));
    let lock = Watched::new("dropped-no-runtime").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&manager, &lock.admin).await;
    let guard = manager.acquire(key, AcquireOptions::new()).await.unwrap();
    neighbours.assert_joined_by(&lock).await;
    std::thread::spawn(move || drop(guard))
        .join()
        .expect("drop on a thread without a runtime");
    assert!(!manager.is_held(key));
    lock.until_free("the lock of a guard dropped without a runtime to be freed")
        .await;
    neighbours.assert_lost(LostReason::ConnectionClosed).await;
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(
        manager.lost_lock_counts().connection_closed,
        neighbours.count() as u64
    );
    assert_still_locks(&manager, key, "the pool slot came back").await;
}
