//! Sessions ended or cancelled under us: a holder's session terminated by an operator or
//! ended by the server (`idle_session_timeout`), a waiter's backend terminated, a
//! waiter's wait cancelled.

use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, LostReason,
    ReleaseOutcome,
};
use locks_postgres::PostgresLockManager;

use super::{
    EVENTUALLY, Mode, Watched, assert_bounded, assert_still_locks, holder_and_waiter, pool_from,
    test_server_config, wait_for,
};
use crate::support::{pool, unique_key};

in_both_modes!(a_terminated_holder_is_told_at_once_and_the_pool_recovers);
/// `pg_terminate_backend` of a holder: its guard is told within the health check
/// interval (200 ms by default; asserted with slack), the bookkeeping is clean at once,
/// another manager takes the key, and the first manager keeps working on its one
/// connection (so the dead session gave its pool slot back). Multiplexed, the session
/// held the neighbours too: exactly those locks are lost, each guard told.
async fn a_terminated_holder_is_told_at_once_and_the_pool_recovers(mode: Mode) {
    let manager = mode.manager(pool(1));
    let other = PostgresLockManager::new(pool(1));
    let lock = Watched::new("terminated-holder").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&manager, &lock.admin).await;

    let guard = manager.acquire(key, AcquireOptions::new()).await.unwrap();
    assert!(!guard.is_lost());
    neighbours.assert_joined_by(&lock).await;
    let started = Instant::now();
    lock.terminate(lock.the_holder().await).await;
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("a terminated holder's guard is told within 2 s");
    let detected = started.elapsed();
    assert_eq!(reason, LostReason::ConnectionClosed);
    assert!(guard.is_lost());
    assert!(!manager.is_held(key), "a lost lock leaves the bookkeeping");
    neighbours.assert_lost(LostReason::ConnectionClosed).await;
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(
        manager.lost_lock_counts().connection_closed,
        1 + neighbours.count() as u64
    );
    eprintln!("{mode:?}: terminated holder detected after {detected:?}");

    // The client is told when its socket closes; the server frees the session's locks as
    // the backend exits, which under load can come a few milliseconds later.
    let freed = Instant::now();
    let stolen = loop {
        if let Some(stolen) = other.try_acquire(key).await.unwrap() {
            break stolen;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(2),
            "the server freed the lock with the session"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        guard.release().await,
        ReleaseOutcome::Lost(LostReason::ConnectionClosed),
        "the release of a lost lock says so and touches nothing"
    );
    assert_eq!(lock.holders().await, 1, "the other holder is untouched");
    assert_eq!(stolen.release().await, ReleaseOutcome::Unlocked);

    let fresh = unique_key("terminated-holder-other");
    assert_still_locks(&manager, &fresh, "the pool serves a new lock").await;
    // A lock left to the manager (into_held) is lost the same way; release(key) then
    // finds nothing held.
    let info = manager
        .acquire(key, super::timeout(Duration::from_secs(5)))
        .await
        .expect("the same key is free again")
        .into_held();
    lock.terminate(lock.the_holder().await).await;
    wait_for("the manager to notice", || async { !manager.is_held(key) }).await;
    assert!(manager.release(info.key()).await.is_err());
    assert!(manager.try_acquire(key).await.unwrap().is_some());
}

/// A holder whose session carries `idle_session_timeout` (PostgreSQL 14+) keeps its
/// lock well past the timeout: the manager turns the setting off on its connections
/// (keepalives off here, so they cannot be what keeps it). Version-gated: PostgreSQL 13
/// has no such setting and refuses the session that asks for it, which the acquisition
/// reports in the server's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_timeout_does_not_end_a_held_lock() {
    let mut config = test_server_config();
    config.options("-c idle_session_timeout=300");
    let manager = PostgresLockManager::builder(pool_from(config, 1))
        .keepalive(None)
        .build();
    let other = PostgresLockManager::new(pool(1));
    let lock = Watched::new("idle-session-timeout").await;
    let key = &lock.key;

    if crate::support::server_version_num(&lock.admin).await < 140_000 {
        let error = manager
            .acquire(key, AcquireOptions::new())
            .await
            .expect_err("PostgreSQL 13 refuses a session with idle_session_timeout");
        let text = format!("{error}: {:?}", std::error::Error::source(&error));
        assert!(
            text.contains("unrecognized configuration parameter")
                && text.contains("idle_session_timeout"),
            "{text}"
        );
        assert_eq!(manager.held_lock_count(), 0);
        assert_eq!(lock.holders().await, 0);
        return;
    }
    let guard = manager.acquire(key, AcquireOptions::new()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        lock.holders().await,
        1,
        "the lock is still held after 2 s idle"
    );
    assert!(!guard.is_lost());
    assert!(other.try_acquire(key).await.unwrap().is_none());
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_still_locks(&manager, key, "the manager keeps working").await;
}

in_both_modes!(a_waiter_whose_backend_is_terminated_gets_connection_lost);
/// Multiplexed, the wait has a connection of its own: its end leaves the neighbours'
/// shared connection alone.
async fn a_waiter_whose_backend_is_terminated_gets_connection_lost(mode: Mode) {
    let (holder, waiter) = holder_and_waiter(mode, 1);
    let lock = Watched::new("terminated-waiter").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&waiter, &lock.admin).await;
    let guard = holder.acquire(key, AcquireOptions::new()).await.unwrap();

    for options in [
        AcquireOptions::new(),
        super::timeout(Duration::from_secs(30)),
    ] {
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            let key = key.clone();
            async move { waiter.acquire(&key, options).await }
        });
        let pid = lock.the_waiter().await;
        assert!(!neighbours.on(pid), "a wait has a connection of its own");
        let started = Instant::now();
        lock.terminate(pid).await;
        let error = tokio::time::timeout(EVENTUALLY, waiting)
            .await
            .expect("a terminated waiter does not hang")
            .unwrap()
            .expect_err("its session is gone");
        assert_bounded("the terminated waiter's answer", started);
        assert_eq!(
            error.kind(),
            AcquisitionErrorKind::ConnectionLost,
            "{error}"
        );
        assert_eq!(error.timeout(), options.timeout());
        assert!(
            error
                .to_string()
                .starts_with(&format!("Failed to acquire lock '{key}': Database error: ")),
            "{error}"
        );
        assert_eq!(waiter.held_lock_count(), neighbours.count());
    }
    assert_eq!(lock.holders().await, 1);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    neighbours.assert_untouched(&lock.admin).await;
    assert_still_locks(
        &waiter,
        key,
        "the waiter's manager works after losing its connections",
    )
    .await;
    neighbours.release().await;
}

in_both_modes!(a_waiter_cancelled_by_an_operator_gets_cancelled_and_keeps_nothing);
async fn a_waiter_cancelled_by_an_operator_gets_cancelled_and_keeps_nothing(mode: Mode) {
    let (holder, waiter) = holder_and_waiter(mode, 1);
    let lock = Watched::new("cancelled-waiter").await;
    let key = &lock.key;
    let neighbours = mode.neighbours(&waiter, &lock.admin).await;
    let guard = holder.acquire(key, AcquireOptions::new()).await.unwrap();

    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        let key = key.clone();
        async move { waiter.acquire(&key, AcquireOptions::new()).await }
    });
    let pid = lock.the_waiter().await;
    assert!(!neighbours.on(pid), "a wait has a connection of its own");
    let cancelled: bool = lock
        .admin
        .query_one("SELECT pg_cancel_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(cancelled);
    let error = tokio::time::timeout(EVENTUALLY, waiting)
        .await
        .expect("a cancelled waiter does not hang")
        .unwrap()
        .expect_err("its wait was cancelled");
    assert_eq!(error.kind(), AcquisitionErrorKind::Cancelled, "{error}");
    assert!(error.to_string().contains(key.as_str()), "{error}");
    assert!(lock.waiting_pids().await.is_empty());

    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    lock.assert_nobody_takes_it().await;
    assert_eq!(waiter.held_lock_count(), neighbours.count());
    neighbours.assert_untouched(&lock.admin).await;
    assert_still_locks(&waiter, key, "the waiter's manager still works").await;
    neighbours.release().await;
}
