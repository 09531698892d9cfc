//! `expire_stopped_holders`: the lease held on a holder whose process stopped sending
//! anything while its kernel still answers TCP (`SIGSTOP`, a blocked runtime). The holder
//! here is a manager on a runtime of its own thread, blocked as a whole (nothing of it runs:
//! no keepalive, no monitor), which is what a stopped process looks like to the server.
//! Each safety test runs its control without the option, which must keep the lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, LostReason, WaitStrategy};
use locks_postgres::{Lease, PostgresLockManager};

use crate::support::{admin, pool, server_version_num, unique_key};

/// A short lease: keepalive 1 s, answer timeout 0.5 s, margin 1 s, so the server bound
/// (`server_frees_after`, and `idle_session_timeout` with the option) is 2.9 s.
const LEASE: Duration = Duration::from_secs(6);
const MARGIN: Duration = Duration::from_secs(1);

fn manager(size: usize, stopped: bool) -> PostgresLockManager {
    PostgresLockManager::builder(pool(size))
        .lease(Some(LEASE))
        .lease_margin(MARGIN)
        .expire_stopped_holders(stopped)
        .try_build()
        .expect("a lease that holds")
}

/// What the stopped holder saw.
struct Stopped {
    /// Its lease.
    lease: Lease,
    /// Why its guard was lost, and how long after it ran again (`None`: not within 5 s).
    told: Option<(LostReason, Duration)>,
}

/// Takes `key` on a manager of its own runtime, on a thread of its own; says so on
/// `held`, then blocks that thread (the runtime with it) until `resume` is set, then
/// waits up to 5 s for its guard's lost signal.
fn stopped_holder(
    key: String,
    stopped: bool,
    held: std::sync::mpsc::Sender<Lease>,
    resume: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Stopped> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let locks = manager(2, stopped);
            let lease = locks.lease().expect("a lease");
            let guard = locks.acquire(&key, Duration::from_secs(5)).await;
            let guard = guard.expect("the holder takes the key");
            held.send(lease).expect("the test waits");
            // Stopped: nothing of this runtime runs until the test lets it.
            while !resume.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let woke = Instant::now();
            let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
            let told = lost.ok().map(|reason| (reason, woke.elapsed()));
            drop(guard);
            Stopped { lease, told }
        })
    })
}

/// How long after the holder stopped another manager got `key` (`None`: not within
/// `within`), the holder resumed either way.
async fn taken_while_stopped(stopped: bool, within: Duration) -> (Option<Duration>, Stopped) {
    let key = unique_key("stopped-holder");
    let (held, told_held) = std::sync::mpsc::channel();
    let resume = Arc::new(AtomicBool::new(false));
    let holder = stopped_holder(key.clone(), stopped, held, Arc::clone(&resume));
    let wait = tokio::task::spawn_blocking(move || told_held.recv().expect("the holder holds"));
    wait.await.expect("the holder");
    let since = Instant::now();
    let other = manager(1, false);
    let taken = other.acquire(&key, within).await;
    let taken = taken.map(|guard| (guard, since.elapsed()));
    resume.store(true, Ordering::Release);
    let seen = tokio::task::spawn_blocking(move || holder.join().expect("the holder's thread"));
    let seen = seen.await.expect("joined");
    let after = taken.ok().map(|(guard, after)| {
        drop(guard);
        after
    });
    (after, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_s_lock_is_freed_within_the_lease_and_it_is_told_when_it_runs_again() {
    if server_version_num(&admin().await).await < 140_000 {
        return assert_refused_before_14().await;
    }
    let (after, seen) = taken_while_stopped(true, LEASE).await;
    let bound = seen
        .lease
        .server
        .idle_session_timeout
        .expect("the option sets it");
    assert_eq!(bound, seen.lease.server_frees_after);
    let after = after.expect("another manager takes the key while the holder is stopped");
    eprintln!(
        "a stopped holder's lock was taken {after:?} after it stopped (idle bound {bound:?}, \
         lease {LEASE:?}); told {:?} after it ran again",
        seen.told
    );
    // Its last keepalive came before it stopped: the server ended the session within the
    // bound of it, hence within the bound of the stop, and never sooner than the bound
    // less one keepalive cadence and a health check.
    assert!(after <= bound + Duration::from_millis(500), "{after:?}");
    assert!(after + Duration::from_millis(1_300) >= bound, "{after:?}");
    let (reason, told) = seen.told.expect("the holder is told once it runs again");
    assert_eq!(reason, LostReason::ConnectionClosed);
    assert!(told < Duration::from_secs(1), "{told:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_a_stopped_holder_keeps_its_lock() {
    // The control of the test above: the lease's TCP timers alone never end the session of
    // a process whose kernel answers.
    let within = Duration::from_secs(5);
    let (after, seen) = taken_while_stopped(false, within).await;
    assert_eq!(seen.lease.server.idle_session_timeout, None);
    assert_eq!(
        after, None,
        "nobody takes a stopped holder's lock without the option"
    );
    assert!(
        seen.told.is_none(),
        "the holder kept its lock: {:?}",
        seen.told.map(|t| t.0)
    );
}

/// A live holder with the option keeps its lock for three idle bounds (its keepalives
/// keep the session from being idle that long), and its session carries the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_holder_keeps_its_lock_and_its_session_carries_the_bound() {
    let admin = admin().await;
    if server_version_num(&admin).await < 140_000 {
        return assert_refused_before_14().await;
    }
    let pool = pool(1);
    let locks = PostgresLockManager::builder(pool.clone())
        .lease(Some(LEASE))
        .lease_margin(MARGIN)
        .expire_stopped_holders(true)
        .build();
    let bound = locks.lease().expect("a lease").server.idle_session_timeout;
    let bound = bound.expect("the option sets it");
    let key = unique_key("live-holder");
    let guard = locks.acquire(&key, Duration::from_secs(5)).await;
    let guard = guard.expect("acquire");
    let other = manager(1, false);
    tokio::time::sleep(bound * 3).await;
    assert!(!guard.is_lost(), "{:?}", guard.lost().reason());
    let busy = other.try_acquire(&key).await.expect("the other's try");
    assert!(busy.is_none(), "the live holder's lock was freed");
    guard.release().await;
    // The pool's one connection, the session the lock was held on, before the manager
    // closes it as idle.
    let client = pool.get().await.expect("the manager's connection");
    let shown = client.query_one("SHOW idle_session_timeout", &[]).await;
    let shown: String = shown.expect("SHOW").get(0);
    let expected = format!("{}ms", bound.as_millis());
    let seconds = format!("{}s", bound.as_secs());
    assert!(
        shown == expected || (bound.subsec_millis() == 0 && shown == seconds),
        "{shown}"
    );
}

/// The pool's idle connections are closed by the manager before the server's idle bound
/// would end them, so that a checkout never takes one the server is ending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pooled_connections_are_closed_before_the_server_ends_them() {
    let admin = admin().await;
    if server_version_num(&admin).await < 140_000 {
        return assert_refused_before_14().await;
    }
    let name = throwaway_pg::testing::unique("idle-closed");
    let url = crate::support::database_url();
    let mut config: locks_postgres::tokio_postgres::Config = url.parse().expect("URL");
    config.application_name(&name);
    let pool = locks_postgres::plain_pool_with_config(config, 2).expect("pool");
    // A longer lease, for room between the manager's close (at most three quarters of the
    // bound and a health check) and the server's (the whole bound).
    let locks = PostgresLockManager::builder(pool)
        .lease(Some(Duration::from_secs(20)))
        .expire_stopped_holders(true)
        .build();
    let bound = locks.lease().expect("a lease").server.idle_session_timeout;
    let bound = bound.expect("the option sets it");
    let guard = locks
        .acquire(&unique_key("idle-closed"), Duration::from_secs(5))
        .await;
    guard.expect("acquire").release().await;
    let released = Instant::now();
    let count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
    let sessions = async || -> i64 { admin.query_one(count, &[&name]).await.unwrap().get(0) };
    assert_eq!(
        sessions().await,
        1,
        "the released lock's session idles in the pool"
    );
    while sessions().await > 0 {
        assert!(
            released.elapsed() < bound * 2,
            "the idle session was never closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let closed = released.elapsed();
    eprintln!(
        "an idle pooled connection was closed {closed:?} after it came back (bound {bound:?})"
    );
    assert!(
        closed < bound,
        "the server ended it ({closed:?}), not the manager"
    );
    assert!(
        closed >= bound / 2,
        "closed at {closed:?}, before half the bound"
    );
    // And the next acquisition opens a new connection.
    let guard = locks
        .acquire(&unique_key("idle-closed"), Duration::from_secs(5))
        .await;
    guard.expect("acquire on a new connection").release().await;
}

/// A polling acquisition's session is idle between tries: with the option, it tries at
/// least every half bound, whatever its retry interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_acquisition_tries_within_half_the_bound() {
    if server_version_num(&admin().await).await < 140_000 {
        return assert_refused_before_14().await;
    }
    let key = unique_key("polling");
    let holder = manager(1, false);
    let held = holder
        .acquire(&key, Duration::from_secs(5))
        .await
        .expect("hold");
    let waiter = manager(1, true);
    let bound = waiter.lease().expect("a lease").server.idle_session_timeout;
    let bound = bound.expect("the option sets it");
    let options = AcquireOptions::new()
        .with_timeout(bound * 3)
        .with_wait_strategy(WaitStrategy::Poll)
        .with_retry_interval(Duration::from_secs(3_600));
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        let taken = waiter.acquire(&key, options).await;
        taken.map(|guard| (guard, started.elapsed()))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await;
    let (guard, after) = waiting
        .await
        .expect("joined")
        .expect("the poller takes the key");
    eprintln!("a poller with a 1 h retry interval took the key after {after:?} (bound {bound:?})");
    assert!(after < bound, "{after:?}");
    guard.release().await;
}

#[tokio::test]
async fn the_option_needs_a_lease() {
    for built in [
        PostgresLockManager::builder(pool(1)).lease(None),
        PostgresLockManager::builder(pool(1)).keepalive(None),
    ] {
        let refused = built.expire_stopped_holders(true).try_build();
        let error = refused.expect_err("no lease, no bound on a stopped holder");
        assert!(error.to_string().contains("needs a lease"), "{error}");
    }
}

/// Before PostgreSQL 14 the server has no `idle_session_timeout`: every acquisition with
/// the option fails with the server's own message, and nothing is left held.
async fn assert_refused_before_14() {
    let admin = admin().await;
    let key = unique_key("stopped-13");
    let locks = manager(1, true);
    let refused = locks.acquire(&key, Duration::from_secs(5)).await;
    let error = refused.expect_err("PostgreSQL 13 has no idle_session_timeout");
    let text = format!("{error:?}");
    assert!(text.contains("idle_session_timeout"), "{text}");
    let held = crate::support::holders(&admin, locks_port::lock_id(&key)).await;
    assert_eq!(held, 0, "a refused acquisition holds nothing");
}
