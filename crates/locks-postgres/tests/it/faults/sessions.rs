//! Sessions ended or cancelled under us: a holder's session terminated by an operator or
//! ended by the server (`idle_session_timeout`), a waiter's backend terminated, a
//! waiter's wait cancelled.

use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, ReleaseOutcome,
};
use locks_postgres::PostgresLockManager;

use super::{
    EVENTUALLY, Watched, assert_bounded, assert_still_locks, holder_and_waiter, pool_from,
    test_server_config,
};
use crate::support::{pool, unique_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_holder_session_releases_cleanly_and_the_pool_recovers() {
    // One connection: if the dead session kept its pool slot, nothing below would work.
    let manager = PostgresLockManager::new(pool(1));
    let lock = Watched::new("terminated-holder").await;
    let key = &lock.key;

    let guard = manager.acquire(key, AcquireOptions::new()).await.unwrap();
    lock.terminate(lock.the_holder().await).await;
    lock.until_free("the terminated holder to be gone from pg_locks")
        .await;
    // Our bookkeeping still says held: nobody told the manager.
    assert!(manager.is_held(key));

    assert_eq!(guard.release().await, ReleaseOutcome::SessionClosed);
    assert!(!manager.is_held(key));
    assert_eq!(manager.held_lock_count(), 0);

    let other = unique_key("terminated-holder-other");
    assert_still_locks(&manager, &other, "the pool serves a new lock").await;
    let guard = manager
        .acquire(key, super::timeout(Duration::from_secs(5)))
        .await
        .expect("the same key is free again");
    assert_eq!(lock.holders().await, 1);

    // The same through the manager's own release(key), which must not report an error.
    let info = guard.into_held();
    lock.terminate(lock.the_holder().await).await;
    lock.until_free("the terminated holder to be gone from pg_locks")
        .await;
    manager
        .release(info.key())
        .await
        .expect("release of a terminated session's lock is not an error");
    assert_eq!(manager.held_lock_count(), 0);
    assert!(manager.try_acquire(key).await.unwrap().is_some());
}

/// The server ends a holder's idle session (`idle_session_timeout`, PostgreSQL 14+):
/// the lock is silently gone, and the release says so instead of failing. Version-gated:
/// PostgreSQL 13 has no such setting, and refuses the session that asks for it, which
/// the acquisition reports in the server's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_timeout_frees_the_lock_and_release_says_session_closed() {
    let mut config = test_server_config();
    config.options("-c idle_session_timeout=300");
    let manager = PostgresLockManager::new(pool_from(config, 1));
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
    lock.until_free("the idle holder session to be ended by the server")
        .await;
    let stolen = other
        .try_acquire(key)
        .await
        .unwrap()
        .expect("the lock is free once the server ended the idle session");
    assert!(manager.is_held(key), "nobody told the manager");
    assert_eq!(guard.release().await, ReleaseOutcome::SessionClosed);
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(lock.holders().await, 1, "the other holder is untouched");
    assert_eq!(stolen.release().await, ReleaseOutcome::Unlocked);
    assert_still_locks(&manager, key, "the manager works after losing its session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_backend_is_terminated_gets_connection_lost() {
    let (holder, waiter) = holder_and_waiter(1);
    let lock = Watched::new("terminated-waiter").await;
    let key = &lock.key;
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
        assert_eq!(waiter.held_lock_count(), 0);
    }
    assert_eq!(lock.holders().await, 1);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_still_locks(
        &waiter,
        key,
        "the waiter's manager works after losing its connections",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_by_an_operator_gets_cancelled_and_keeps_nothing() {
    let (holder, waiter) = holder_and_waiter(1);
    let lock = Watched::new("cancelled-waiter").await;
    let key = &lock.key;
    let guard = holder.acquire(key, AcquireOptions::new()).await.unwrap();

    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        let key = key.clone();
        async move { waiter.acquire(&key, AcquireOptions::new()).await }
    });
    let pid = lock.the_waiter().await;
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
    assert_still_locks(&waiter, key, "the waiter's manager still works").await;
}
