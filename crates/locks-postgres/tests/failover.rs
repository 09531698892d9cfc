//! Failover: a throwaway primary with a streaming standby, a manager on the multi-host
//! URL (`target_session_attrs=read-write`). Advisory locks are not replicated, so a
//! failover loses every lock: each guard must say so, new acquisitions must land on the
//! promoted standby, and with synchronous replication fencing tokens must keep rising.
//! Its own test binary: every test starts its own pair of clusters.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, LostReason,
    ReleaseOutcome,
};
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres;
use locks_postgres::{PostgresLockGuard, PostgresLockManager};
use throwaway_pg::testing::granted_advisory_locks;
use throwaway_pg::{PrimaryWithStandby, ThrowawayPostgres};

// The `it` binary's helpers; only `holders` (granted sessions of one lock in pg_locks) is
// used here, the rest serves the shared test server this binary does not use.
#[allow(dead_code, unused_imports)]
#[path = "it/support.rs"]
mod support;
use support::holders;

/// The detection bound the README documents for a failover whose old primary closes its
/// connections (a stop, a crash of PostgreSQL): the loss is seen as soon as the socket
/// closes, well within one keepalive interval plus its timeout.
const DETECTION_BOUND: Duration = Duration::from_secs(5);
/// The keepalive the managers here run with.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// How long an acquisition may take once the standby is promoted.
const ACQUIRE: Duration = Duration::from_secs(10);

/// Starts the pair off the runtime's worker (starting clusters blocks for seconds).
async fn pair(synchronous: bool) -> PrimaryWithStandby {
    tokio::task::spawn_blocking(move || {
        PrimaryWithStandby::builder()
            .synchronous(synchronous)
            .start()
            .expect("start a primary with a streaming standby")
    })
    .await
    .expect("the start-up thread")
}

/// Runs a blocking cluster operation off the runtime's worker.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("a blocking task")
}

/// Stops the primary at once (`pg_ctl stop -m immediate`) and promotes the standby.
async fn fail_over(pair: &Arc<PrimaryWithStandby>) {
    let pair = pair.clone();
    blocking(move || {
        pair.stop_primary_immediately().expect("stop the primary");
        pair.promote_standby().expect("promote the standby");
    })
    .await;
}

fn pool(url: &str, size: usize) -> Pool {
    let config = tokio_postgres::Config::from_str(url).expect("a valid URL");
    locks_postgres::plain_pool_with_config(config, size).expect("pool")
}

async fn admin(server: &ThrowawayPostgres) -> tokio_postgres::Client {
    throwaway_pg::testing::connect(&server.url()).await
}

fn keys(name: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|n| format!("failover:{name}:{}:{n}", std::process::id()))
        .collect()
}

fn bounded(timeout: Duration) -> AcquireOptions {
    AcquireOptions::new().with_timeout(timeout)
}

/// Acquires `key` once the promoted standby takes sessions; retries while the pool still
/// hands out a connection to the old primary or the promotion is not finished.
async fn acquire_after_failover(
    manager: &PostgresLockManager,
    key: &str,
) -> (PostgresLockGuard, Vec<AcquisitionErrorKind>) {
    let started = Instant::now();
    let mut errors = Vec::new();
    loop {
        match manager.acquire(key, bounded(Duration::from_secs(2))).await {
            Ok(guard) => return (guard, errors),
            Err(error) => {
                assert!(
                    started.elapsed() < ACQUIRE,
                    "no acquisition on the promoted standby within {ACQUIRE:?}: {error}"
                );
                errors.push(error.kind());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loses_every_lock_and_new_ones_land_on_the_promoted_standby() {
    let pair = Arc::new(pair(false).await);
    let url = pair.multi_host_url();
    let manager = PostgresLockManager::builder(pool(&url, 8))
        .holder_id("failover-test")
        .keepalive(Some(KEEPALIVE))
        .build();
    let on_primary = admin(pair.primary()).await;
    let on_standby = admin(pair.standby()).await;
    let keys = keys("lost", 4);

    let mut guards = Vec::new();
    for key in &keys {
        guards.push(manager.acquire(key, bounded(ACQUIRE)).await.expect("lock"));
    }
    for key in &keys {
        assert_eq!(holders(&on_primary, manager.lock_id(key)).await, 1, "{key}");
    }
    assert_eq!(
        granted_advisory_locks(&on_standby).await,
        0,
        "advisory locks are not replicated to the standby"
    );
    let signals: Vec<_> = guards.iter().map(LockGuard::lost).collect();
    assert!(signals.iter().all(|signal| !signal.is_lost()));

    // Failover: the primary dies at once, the standby is promoted.
    let stopped_at = Instant::now();
    let failover = tokio::spawn({
        let pair = pair.clone();
        blocking(move || {
            pair.stop_primary_immediately().expect("stop the primary");
            let stopped = stopped_at.elapsed();
            pair.promote_standby().expect("promote the standby");
            (stopped, stopped_at.elapsed())
        })
    });
    let mut detected = Vec::new();
    for signal in signals {
        let reason = tokio::time::timeout(DETECTION_BOUND, signal)
            .await
            .unwrap_or_else(|_| {
                panic!("a guard did not report the loss within {DETECTION_BOUND:?}")
            });
        detected.push(stopped_at.elapsed());
        assert_eq!(reason, LostReason::ConnectionClosed);
    }
    assert!(guards.iter().all(LockGuard::is_lost));

    // New acquisitions, tried while the promotion may still run, go to the promoted
    // standby (the only server accepting writes) once it is done.
    let mut first_lock_after = None;
    let mut retried = Vec::new();
    let mut new_guards = Vec::new();
    for key in &keys {
        let (guard, errors) = acquire_after_failover(&manager, key).await;
        first_lock_after.get_or_insert(stopped_at.elapsed());
        retried.extend(errors);
        new_guards.push(guard);
    }
    let (stop_took, promoted_after) = failover.await.expect("the failover thread");
    for key in &keys {
        assert_eq!(holders(&on_standby, manager.lock_id(key)).await, 1, "{key}");
    }
    eprintln!(
        "failover figures: primary stopped in {stop_took:?}; every guard lost after {:?} \
         (first {:?}, last {:?}); standby promoted after {promoted_after:?}; first lock on \
         the new primary after {:?}; failed attempts before it: {retried:?}",
        detected.iter().max().expect("four guards"),
        detected.iter().min().expect("four guards"),
        detected.iter().max().expect("four guards"),
        first_lock_after.expect("four keys"),
    );

    for guard in guards {
        assert_eq!(
            guard.release().await,
            ReleaseOutcome::Lost(LostReason::ConnectionClosed)
        );
    }
    for guard in new_guards {
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    }
    assert_eq!(granted_advisory_locks(&on_standby).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_synchronous_replication_fencing_tokens_rise_across_a_failover() {
    let pair = Arc::new(pair(true).await);
    let pool = pool(&pair.multi_host_url(), 8);
    locks_postgres::install_fencing(&pool.get().await.expect("a connection"))
        .await
        .expect("install the fencing table");
    let manager = PostgresLockManager::builder(pool)
        .fencing(true)
        .keepalive(Some(KEEPALIVE))
        .build();
    let keys = keys("fencing", 3);

    // Tokens count per lock id: the highest each key got before the failover.
    let mut highest_before = HashMap::new();
    for _ in 0..5 {
        for key in &keys {
            let guard = manager.acquire(key, bounded(ACQUIRE)).await.expect("lock");
            let token = guard.info().fencing_token().expect("fencing is on");
            let highest = highest_before.entry(key.clone()).or_insert(token);
            assert!(token >= *highest, "tokens rise while the primary lives");
            *highest = token;
            assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
        }
    }
    // One lock is held through the failover.
    let held = manager
        .acquire(&keys[0], bounded(ACQUIRE))
        .await
        .expect("lock");
    highest_before.insert(
        keys[0].clone(),
        held.info().fencing_token().expect("fencing is on"),
    );

    fail_over(&pair).await;
    let reason = tokio::time::timeout(DETECTION_BOUND, held.lost())
        .await
        .expect("the held lock is reported lost");
    assert_eq!(reason, LostReason::ConnectionClosed);

    let mut after = Vec::new();
    for key in keys.iter().chain(keys.iter()) {
        let (guard, _) = acquire_after_failover(&manager, key).await;
        let token = guard.info().fencing_token().expect("fencing is on");
        after.push((key.clone(), token, highest_before[key]));
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    }
    eprintln!("fencing tokens (key, after the failover, highest before): {after:?}");
    for (key, token, highest) in &after {
        assert!(
            token > highest,
            "{key}: token {token} after the failover must exceed every token before it \
             (highest {highest})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_on_a_read_only_standby_refuses_to_lock() {
    let pair = pair(false).await;
    let standby = pair.standby();
    let manager = PostgresLockManager::new(pool(&standby.url(), 2));
    let on_standby = admin(standby).await;
    let key = keys("standby", 1).remove(0);

    let error = manager
        .try_acquire(&key)
        .await
        .expect_err("a read-only standby must not hand out locks");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
    let text = error.to_string();
    assert!(
        text.contains("read-only") || text.contains("standby") || text.contains("recovery"),
        "the error must say why: {text}"
    );
    let error = manager
        .acquire(&key, bounded(Duration::from_secs(2)))
        .await
        .expect_err("nor through a waiting acquire");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
    assert_eq!(manager.held_lock_count(), 0);
    // The refused session is closed, not pooled: whatever its pipelined try took on the
    // standby is gone once the backend sees the connection end.
    let started = Instant::now();
    while granted_advisory_locks(&on_standby).await != 0 {
        assert!(
            started.elapsed() < DETECTION_BOUND,
            "a refused session left an advisory lock on the standby"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Why the README asks for synchronous replication: with asynchronous streaming, tokens the
/// old primary issued but had not yet shipped are lost in the failover, and the promoted
/// standby hands out the same tokens again. The standby is cut off from the primary (as a
/// lagging standby would be) before the last tokens; after the failover they repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_asynchronous_replication_fencing_tokens_can_repeat_after_a_failover() {
    let pair = Arc::new(pair(false).await);
    let pool = pool(&pair.multi_host_url(), 4);
    locks_postgres::install_fencing(&pool.get().await.expect("a connection"))
        .await
        .expect("install the fencing table");
    let manager = PostgresLockManager::builder(pool).fencing(true).build();
    let key = keys("async-fencing", 1).remove(0);
    let guard = manager.acquire(&key, bounded(ACQUIRE)).await.expect("lock");
    guard.release().await;
    blocking({
        let pair = pair.clone();
        move || pair.cut_standby_off().expect("cut the standby off")
    })
    .await;

    // More tokens than a sequence caches (32), so none can survive as a cached jump.
    let mut before = Vec::new();
    for _ in 0..50 {
        let guard = manager.acquire(&key, bounded(ACQUIRE)).await.expect("lock");
        before.push(guard.info().fencing_token().expect("fencing is on"));
        guard.release().await;
    }
    let highest_before = *before.iter().max().expect("tokens");
    fail_over(&pair).await;
    let (guard, _) = acquire_after_failover(&manager, &key).await;
    let after = guard.info().fencing_token().expect("fencing is on");
    eprintln!(
        "asynchronous replication, standby cut off: token {after} after the failover, \
         highest before {highest_before}"
    );
    assert!(
        after <= highest_before,
        "with the standby cut off, the promoted standby re-issues old tokens: {after} after, \
         {highest_before} before"
    );
    guard.release().await;
}
