//! Faults on a real server: terminated sessions, a restart, dropped futures, an
//! exhausted pool, the `lock_timeout` race, odd keys. Each test checks `pg_locks`
//! from a separate admin connection, because "no lock left behind" is what matters.

use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, ReleaseOutcome,
    WaitStrategy,
};
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::{self, NoTls};
use locks_postgres::{KeyVisibility, PostgresLockManager};
use throwaway_pg::ThrowawayPostgres;

use crate::support::{admin, holders, pool, unique_key};

/// The liveness bound of every "eventually" in these tests.
const EVENTUALLY: Duration = Duration::from_secs(5);

/// Polls `check` every 10 ms until it is true; fails after [`EVENTUALLY`].
pub(crate) async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < EVENTUALLY,
            "timed out after {EVENTUALLY:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `pg_locks` rows of the bigint advisory lock `lock_id` with this `granted`.
async fn lock_pids(admin: &tokio_postgres::Client, lock_id: i64, granted: bool) -> Vec<i32> {
    let bits = u64::from_be_bytes(lock_id.to_be_bytes());
    let high = i64::try_from(bits >> 32).expect("32 bits");
    let low = i64::try_from(bits & 0xFFFF_FFFF).expect("32 bits");
    admin
        .query(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted = $3 \
             AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2 ORDER BY pid",
            &[&high, &low, &granted],
        )
        .await
        .expect("pg_locks")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The backends holding the advisory lock `lock_id`.
pub(crate) async fn holder_pids(admin: &tokio_postgres::Client, lock_id: i64) -> Vec<i32> {
    lock_pids(admin, lock_id, true).await
}

/// The backends queued for the advisory lock `lock_id`.
pub(crate) async fn waiting_pids(admin: &tokio_postgres::Client, lock_id: i64) -> Vec<i32> {
    lock_pids(admin, lock_id, false).await
}

/// Waits until exactly one backend queues for `lock_id` and returns its pid.
async fn the_waiter(admin: &tokio_postgres::Client, lock_id: i64) -> i32 {
    let started = Instant::now();
    loop {
        if let [pid] = waiting_pids(admin, lock_id).await[..] {
            return pid;
        }
        assert!(
            started.elapsed() < EVENTUALLY,
            "timed out after {EVENTUALLY:?} waiting for one backend to queue for the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether backend `pid` is still waiting on a heavyweight lock.
async fn waits_on_a_lock(admin: &tokio_postgres::Client, pid: i32) -> bool {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
            &[&pid],
        )
        .await
        .expect("pg_stat_activity")
        .get::<_, i64>(0)
        > 0
}

async fn terminate(admin: &tokio_postgres::Client, pid: i32) {
    let done: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("pg_terminate_backend")
        .get(0);
    assert!(done, "backend {pid} was there to terminate");
}

fn timeout(duration: Duration) -> AcquireOptions {
    AcquireOptions::new().with_timeout(duration)
}

fn assert_bounded(what: &str, started: Instant) {
    assert!(
        started.elapsed() < EVENTUALLY,
        "{what} took {:?}, more than {EVENTUALLY:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------
// 1. A holder's session is terminated by an operator.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_holder_session_releases_cleanly_and_the_pool_recovers() {
    // One connection: if the dead session kept its pool slot, nothing below would work.
    let manager = PostgresLockManager::new(pool(1));
    let admin = admin().await;
    let key = unique_key("terminated-holder");
    let lock_id = locks_port::lock_id(&key);

    let guard = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
    let [pid] = holder_pids(&admin, lock_id).await[..] else {
        panic!("one holder expected");
    };
    terminate(&admin, pid).await;
    wait_for("the terminated holder to be gone from pg_locks", || async {
        holders(&admin, lock_id).await == 0
    })
    .await;
    // Our bookkeeping still says held: nobody told the manager.
    assert!(manager.is_held(&key));

    assert_eq!(guard.release().await, ReleaseOutcome::SessionClosed);
    assert!(!manager.is_held(&key));
    assert_eq!(manager.held_lock_count(), 0);

    let other = unique_key("terminated-holder-other");
    let guard = manager
        .acquire(&other, timeout(Duration::from_secs(5)))
        .await
        .expect("the pool serves a new lock");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    let guard = manager
        .acquire(&key, timeout(Duration::from_secs(5)))
        .await
        .expect("the same key is free again");
    assert_eq!(holders(&admin, lock_id).await, 1);

    // The same through the manager's own release(key), which must not report an error.
    let info = guard.into_held();
    let [pid] = holder_pids(&admin, lock_id).await[..] else {
        panic!("one holder expected");
    };
    terminate(&admin, pid).await;
    wait_for("the terminated holder to be gone from pg_locks", || async {
        holders(&admin, lock_id).await == 0
    })
    .await;
    manager
        .release(info.key())
        .await
        .expect("release of a terminated session's lock is not an error");
    assert_eq!(manager.held_lock_count(), 0);
    assert!(manager.try_acquire(&key).await.unwrap().is_some());
}

/// The server ends a holder's idle session (`idle_session_timeout`, PostgreSQL 14+):
/// the lock is silently gone, and the release says so instead of failing. Version-gated:
/// PostgreSQL 13 has no such setting, and refuses the session that asks for it, which
/// the acquisition reports in the server's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_timeout_frees_the_lock_and_release_says_session_closed() {
    let mut config = tokio_postgres::Config::from_str(&crate::support::database_url())
        .expect("a valid database URL");
    config.options("-c idle_session_timeout=300");
    let manager = PostgresLockManager::new(pool_from(config, 1));
    let other = PostgresLockManager::new(pool(1));
    let admin = admin().await;
    let key = unique_key("idle-session-timeout");
    let lock_id = locks_port::lock_id(&key);

    if crate::support::server_version_num(&admin).await < 140_000 {
        let error = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .expect_err("PostgreSQL 13 refuses a session with idle_session_timeout");
        let text = format!("{error}: {:?}", std::error::Error::source(&error));
        assert!(
            text.contains("unrecognized configuration parameter")
                && text.contains("idle_session_timeout"),
            "{text}"
        );
        assert_eq!(manager.held_lock_count(), 0);
        assert_eq!(holders(&admin, lock_id).await, 0);
        return;
    }
    let guard = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
    wait_for(
        "the idle holder session to be ended by the server",
        || async { holders(&admin, lock_id).await == 0 },
    )
    .await;
    let stolen = other
        .try_acquire(&key)
        .await
        .unwrap()
        .expect("the lock is free once the server ended the idle session");
    assert!(manager.is_held(&key), "nobody told the manager");
    assert_eq!(guard.release().await, ReleaseOutcome::SessionClosed);
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(
        holders(&admin, lock_id).await,
        1,
        "the other holder is untouched"
    );
    assert_eq!(stolen.release().await, ReleaseOutcome::Unlocked);
    let guard = manager
        .acquire(&key, timeout(Duration::from_secs(5)))
        .await
        .expect("the manager works after losing its session");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

// ---------------------------------------------------------------------------------
// 2. The server restarts while locks are held.

fn pool_at(url: &str, size: usize) -> Pool {
    locks_postgres::plain_pool(url, size).expect("pool")
}

fn pool_from(config: tokio_postgres::Config, size: usize) -> Pool {
    locks_postgres::plain_pool_with_config(config, size).expect("pool")
}

async fn admin_at(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_while_locks_are_held() {
    // A cluster of this test alone: the shared server must not be restarted. Dropping
    // it stops the server and removes its folder, also when the test fails.
    let cluster = tokio::task::block_in_place(ThrowawayPostgres::start)
        .expect("a throwaway PostgreSQL cluster for the restart test");
    let manager = PostgresLockManager::new(pool_at(&cluster.url(), 4));
    let (first, second, down) = (
        unique_key("restart-1"),
        unique_key("restart-2"),
        unique_key("restart-down"),
    );
    // An idle pooled connection too, to be found dead after the restart.
    let warm = manager.acquire("restart-warm", AcquireOptions::new()).await;
    assert_eq!(warm.unwrap().release().await, ReleaseOutcome::Unlocked);
    let first_guard = manager
        .acquire(&first, AcquireOptions::new())
        .await
        .unwrap();
    let second_guard = manager
        .acquire(&second, AcquireOptions::new())
        .await
        .unwrap();
    {
        let admin = admin_at(&cluster.url()).await;
        assert_eq!(holders(&admin, locks_port::lock_id(&first)).await, 1);
        assert_eq!(holders(&admin, locks_port::lock_id(&second)).await, 1);
    }

    tokio::task::block_in_place(|| cluster.stop()).expect("pg_ctl stop -m fast");

    // Down: a clear, prompt error naming the key, for bounded and unbounded waits.
    for options in [timeout(Duration::from_secs(2)), AcquireOptions::new()] {
        let started = Instant::now();
        let error = manager
            .acquire(&down, options)
            .await
            .expect_err("the server is down");
        assert_bounded("an acquire while the server is down", started);
        assert!(
            matches!(
                error.kind(),
                AcquisitionErrorKind::ConnectionLost | AcquisitionErrorKind::PoolUnavailable
            ),
            "kind {:?}: {error}",
            error.kind()
        );
        assert!(
            error.to_string().starts_with(&format!(
                "Failed to acquire lock '{down}': Database error: "
            )),
            "{error}"
        );
        assert!(std::error::Error::source(&error).is_some(), "{error:?}");
    }
    let error = manager
        .try_acquire(&down)
        .await
        .expect_err("the server is down");
    assert!(error.to_string().contains(&down), "{error}");
    assert_eq!(manager.held_lock_count(), 2);

    // A release while the server is down does not fail; it says the session is gone.
    assert_eq!(first_guard.release().await, ReleaseOutcome::SessionClosed);
    assert!(!manager.is_held(&first));

    tokio::task::block_in_place(|| cluster.start_again()).expect("pg_ctl start");

    // The second lock's session died in the restart too.
    assert_eq!(second_guard.release().await, ReleaseOutcome::SessionClosed);
    assert_eq!(manager.held_lock_count(), 0);

    // The same manager works again, for the same keys.
    let admin = admin_at(&cluster.url()).await;
    for key in [&first, &second, &down] {
        let guard = manager
            .acquire(key, timeout(Duration::from_secs(5)))
            .await
            .expect("acquire after the restart");
        assert_eq!(holders(&admin, locks_port::lock_id(key)).await, 1);
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
        assert_eq!(holders(&admin, locks_port::lock_id(key)).await, 0);
    }
    let status = manager.pool().status();
    assert!(status.size <= status.max_size, "{status:?}");
    drop((admin, manager));
    tokio::task::block_in_place(|| drop(cluster));
}

/// Sends a signal (`STOP`, `CONT`) to a server backend with `kill(1)`.
fn signal(pid: i32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}: {status}");
}

/// Continues a stopped backend however the test ends, so that the cluster can stop.
struct Continue(i32);

impl Drop for Continue {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// A backend that stops answering (SIGSTOP: a hung server or a silent network) cannot
/// hold a bounded acquire hostage: after its timeout plus a grace period the call
/// fails with `ConnectionLost`, and the connection is given up, not pooled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_acquire_on_a_server_that_stops_answering_fails_with_connection_lost() {
    // A cluster of this test alone: nobody else's backends get stopped.
    let cluster = tokio::task::block_in_place(ThrowawayPostgres::start)
        .expect("a throwaway PostgreSQL cluster for the stopped-backend test");
    let mut config = tokio_postgres::Config::from_str(&cluster.url()).expect("URL");
    config.application_name("it-stopped-backend");
    let manager = PostgresLockManager::new(pool_from(config, 1));
    let admin = admin_at(&cluster.url()).await;
    let key = unique_key("stopped-backend");
    let lock_id = locks_port::lock_id(&key);

    // Warm the pool, then stop its one idle backend.
    let warm = manager.try_acquire(&key).await.unwrap().expect("free");
    assert_eq!(warm.release().await, ReleaseOutcome::Unlocked);
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'it-stopped-backend'",
            &[],
        )
        .await
        .expect("the pool's backend")
        .get(0);
    let stopped = Continue(pid);
    signal(pid, "STOP");

    let started = Instant::now();
    let error = manager
        .acquire(&key, timeout(Duration::from_millis(300)))
        .await
        .expect_err("the backend does not answer");
    let elapsed = started.elapsed();
    println!("a bounded acquire on a stopped backend gave up after {elapsed:?}");
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::ConnectionLost,
        "{error}"
    );
    assert_eq!(error.timeout(), Some(Duration::from_millis(300)));
    assert_eq!(
        error.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.3s (the server did not answer)")
    );
    assert_eq!(manager.held_lock_count(), 0);
    let status = manager.pool().status();
    assert!(status.size <= status.max_size, "{status:?}");

    // Once it runs again it finds its client gone and exits, holding nothing.
    drop(stopped);
    wait_for("the continued backend to exit", || async {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
    })
    .await;
    assert_eq!(holders(&admin, lock_id).await, 0);
    let guard = manager
        .acquire(&key, timeout(Duration::from_secs(5)))
        .await
        .expect("the manager works on a new connection");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    drop((admin, manager));
    tokio::task::block_in_place(|| drop(cluster));
}

// ---------------------------------------------------------------------------------
// 3. An acquire dropped while it waits.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_while_queued_leaves_the_queue_and_never_gets_the_lock() {
    let holder = PostgresLockManager::new(pool(2));
    let waiter = PostgresLockManager::new(pool(2));
    let admin = admin().await;
    let key = unique_key("dropped-waiter");
    let lock_id = locks_port::lock_id(&key);
    let guard = holder.acquire(&key, AcquireOptions::new()).await.unwrap();

    // Drop the acquire exactly once its backend is queued on the server.
    let waiter_pid = {
        let acquire = waiter.acquire(&key, AcquireOptions::new());
        tokio::pin!(acquire);
        tokio::select! {
            result = &mut acquire => panic!("acquired a held lock: {result:?}"),
            pid = the_waiter(&admin, lock_id) => pid,
        }
    };
    // It leaves the queue while the lock is still held (its wait is cancelled).
    wait_for("the dropped waiter to leave the lock queue", || async {
        waiting_pids(&admin, lock_id).await.is_empty() && !waits_on_a_lock(&admin, waiter_pid).await
    })
    .await;

    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_nobody_takes_it(&admin, lock_id).await;
    assert_waiter_pool_recovered(&waiter, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_by_a_200ms_timeout_never_gets_the_lock() {
    let holder = PostgresLockManager::new(pool(2));
    let waiter = PostgresLockManager::new(pool(2));
    let admin = admin().await;
    let key = unique_key("timed-out-waiter");
    let lock_id = locks_port::lock_id(&key);
    let guard = holder.acquire(&key, AcquireOptions::new()).await.unwrap();

    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        waiter.acquire(&key, AcquireOptions::new()),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the lock is held: the acquire cannot finish"
    );
    wait_for("no backend left waiting for the lock", || async {
        waiting_pids(&admin, lock_id).await.is_empty()
    })
    .await;
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_nobody_takes_it(&admin, lock_id).await;
    assert_waiter_pool_recovered(&waiter, &key).await;
}

/// After the holder released: for a second, nobody (the dropped waiter's session
/// above all) is ever granted the lock.
async fn assert_nobody_takes_it(admin: &tokio_postgres::Client, lock_id: i64) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        assert_eq!(
            holder_pids(admin, lock_id).await,
            Vec::<i32>::new(),
            "a cancelled waiter was granted the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn assert_waiter_pool_recovered(waiter: &PostgresLockManager, key: &str) {
    let status = waiter.pool().status();
    assert!(status.size <= status.max_size, "{status:?}");
    assert_eq!(waiter.held_lock_count(), 0);
    let guard = waiter
        .acquire(key, timeout(Duration::from_secs(5)))
        .await
        .expect("the waiter's pool still serves locks");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

// ---------------------------------------------------------------------------------
// 4. The lock_timeout (55P03) race.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_timeout_racing_a_release_never_leaks_the_lock() {
    const ROUNDS: u32 = 200;
    const WAITER_TIMEOUT_MS: u64 = 20;
    let holder = PostgresLockManager::new(pool(2));
    let waiter = PostgresLockManager::new(pool(2));
    let admin = admin().await;
    let key = unique_key("55P03-race");
    let lock_id = locks_port::lock_id(&key);
    let (mut acquired, mut timed_out) = (0, 0);

    for round in 0..ROUNDS {
        // The holder lets go from 4 ms before to 4 ms after the waiter's timeout.
        let hold = Duration::from_millis(WAITER_TIMEOUT_MS - 4 + u64::from(round % 9));
        let guard = holder
            .acquire(&key, timeout(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|error| panic!("round {round}: holder: {error}"));
        let release = tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            guard.release().await
        });
        let attempt = waiter
            .acquire(&key, timeout(Duration::from_millis(WAITER_TIMEOUT_MS)))
            .await;
        assert_eq!(
            release.await.unwrap(),
            ReleaseOutcome::Unlocked,
            "round {round}"
        );
        match attempt {
            Ok(guard) => {
                acquired += 1;
                assert_eq!(holders(&admin, lock_id).await, 1, "round {round}");
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
                    holder_pids(&admin, lock_id).await,
                    Vec::<i32>::new(),
                    "round {round}: a timed-out waiter kept the lock"
                );
            }
        }
        assert_eq!(holder.held_lock_count(), 0, "round {round}");
        assert_eq!(waiter.held_lock_count(), 0, "round {round}");
    }
    println!("{ROUNDS} rounds: waiter acquired {acquired}, timed out {timed_out}");
    assert_eq!(holders(&admin, lock_id).await, 0);
    assert_eq!(holder.release_all().await, 0);
    assert_eq!(waiter.release_all().await, 0);
    for manager in [&holder, &waiter] {
        let status = manager.pool().status();
        assert!(status.size <= status.max_size, "{status:?}");
    }
}

// ---------------------------------------------------------------------------------
// 5. An exhausted pool.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_fails_with_pool_unavailable() {
    let manager = PostgresLockManager::new(pool(1));
    let (a, b) = (unique_key("pool-a"), unique_key("pool-b"));
    let guard = manager.acquire(&a, AcquireOptions::new()).await.unwrap();

    let started = Instant::now();
    let error = manager
        .acquire(&b, timeout(Duration::from_millis(300)))
        .await
        .expect_err("the only connection holds A");
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
    assert_eq!(manager.held_lock_count(), 1);

    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    let guard = manager
        .acquire(&b, timeout(Duration::from_millis(300)))
        .await
        .expect("the connection is free again");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

// ---------------------------------------------------------------------------------
// 6. Keys and holder ids no SQL should ever see.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusual_keys_and_holder_ids_lock_by_their_derived_id() {
    let admin = admin().await;
    // These keys are fixed, not unique to this run: two test processes on one server
    // (two checkouts, CI next to a developer) would fight over them. The admin session
    // holds a test-wide lock so that such runs take turns; it ends with the session.
    let turn = locks_port::lock_id("locks-postgres it: unusual keys (one test run at a time)");
    admin
        .batch_execute(&format!(
            "SET lock_timeout = '60s'; SELECT pg_advisory_lock({turn}); RESET lock_timeout"
        ))
        .await
        .expect("this test's turn on the server");
    let mebibyte: String = "ключ🔒é".chars().cycle().take(1 << 20).collect();
    assert!(mebibyte.len() >= 1 << 20);
    let keys = [
        String::new(),
        "é".to_owned(),
        "🔒".to_owned(),
        "ключ".to_owned(),
        "it's a \"key\"; SELECT pg_advisory_unlock_all(); --".to_owned(),
        "back\\slash\\".to_owned(),
        "nul\0inside".to_owned(),
        mebibyte,
    ];
    let holder_ids = [
        "o'brien",
        "\"quoted\"",
        "back\\slash",
        "'); DROP TABLE pg_locks; --",
        "держатель-🔒",
        "nul\0",
    ];
    // The golden vectors of the Python library.
    assert_eq!(locks_port::lock_id(""), 7_183_457_195_969_485_844);
    assert_eq!(locks_port::lock_id("é"), 5_375_421_630_974_772_051);

    let other = PostgresLockManager::new(pool(1));
    for (index, key) in keys.iter().enumerate() {
        let lock_id = locks_port::lock_id(key);
        let holder_id = holder_ids[index % holder_ids.len()];
        let visibility = if index % 2 == 0 {
            KeyVisibility::Shown
        } else {
            KeyVisibility::Hidden
        };
        let manager = PostgresLockManager::builder(pool(1))
            .holder_id(holder_id)
            .key_visibility(visibility)
            .build();
        assert_eq!(manager.lock_id(key), lock_id);

        let guard = manager
            .acquire(key, timeout(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|error| panic!("key #{index}: {error}"));
        assert_eq!(guard.info().key(), key.as_str());
        assert_eq!(guard.info().lock_id(), lock_id);
        assert_eq!(guard.info().holder_id(), Some(holder_id));
        assert_eq!(holders(&admin, lock_id).await, 1, "key #{index}");
        assert!(manager.is_held(key));
        assert!(other.try_acquire(key).await.unwrap().is_none());
        let error = other
            .acquire(key, timeout(Duration::ZERO))
            .await
            .expect_err("held");
        assert_eq!(error.key(), key.as_str());
        assert_eq!(
            error.to_string(),
            format!("Failed to acquire lock '{key}': Timeout after 0.0s")
        );
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
        assert_eq!(holders(&admin, lock_id).await, 0, "key #{index}");

        // try_acquire and the manager's release(key) take the same path.
        let info = manager
            .try_acquire(key)
            .await
            .unwrap()
            .expect("free")
            .into_held();
        assert_eq!(info.lock_id(), lock_id);
        assert_eq!(holders(&admin, lock_id).await, 1, "key #{index}");
        manager.release(key).await.expect("held by this manager");
        assert_eq!(holders(&admin, lock_id).await, 0, "key #{index}");
        let error = manager.release(key).await.expect_err("no longer held");
        assert_eq!(
            error.to_string(),
            format!("Lock '{key}' is not held by this session")
        );
    }
}

// ---------------------------------------------------------------------------------
// 7. Futures dropped mid-flight.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_acquire_dropped_mid_flight_leaves_no_lock_held() {
    let manager = PostgresLockManager::new(pool(2));
    let admin = admin().await;
    let key = unique_key("dropped-try");
    let lock_id = locks_port::lock_id(&key);
    let (mut dropped, mut finished) = (0, 0);
    for round in 0..3 {
        for point in DROP_POINTS_US {
            let attempt = manager.try_acquire(&key);
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
            assert_eq!(manager.held_lock_count(), 0);
            assert!(!manager.is_held(&key));
            wait_for("a dropped try_acquire's lock to be freed", || async {
                holders(&admin, lock_id).await == 0
            })
            .await;
        }
    }
    println!("try_acquire: dropped mid-flight {dropped}, finished {finished}");
    let status = manager.pool().status();
    assert!(status.size <= status.max_size, "{status:?}");
    let guard = manager
        .try_acquire(&key)
        .await
        .unwrap()
        .expect("the manager still works");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_dropped_mid_flight_still_frees_the_lock() {
    let manager = PostgresLockManager::new(pool(4));
    let admin = admin().await;
    let key = unique_key("dropped-release");
    let lock_id = locks_port::lock_id(&key);
    let (mut dropped, mut finished) = (0, 0);
    for round in 0..3 {
        for point in DROP_POINTS_US {
            let guard = manager
                .acquire(&key, timeout(Duration::from_secs(5)))
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
            assert!(!manager.is_held(&key));
            assert_eq!(manager.held_lock_count(), 0);
            wait_for("a dropped release's lock to be freed", || async {
                holders(&admin, lock_id).await == 0
            })
            .await;
        }
    }
    println!("release: dropped mid-flight {dropped}, finished {finished}");

    // release_all dropped at its first await: every lock leaves the bookkeeping and
    // is freed on the server all the same.
    let keys: Vec<String> = (0..3)
        .map(|n| unique_key(&format!("dropped-all-{n}")))
        .collect();
    for key in &keys {
        manager
            .acquire(key, timeout(Duration::from_secs(5)))
            .await
            .unwrap()
            .into_held();
    }
    assert_eq!(manager.held_lock_count(), 3);
    let _ = tokio::time::timeout(Duration::ZERO, manager.release_all()).await;
    assert_eq!(manager.held_lock_count(), 0);
    for key in &keys {
        let lock_id = locks_port::lock_id(key);
        wait_for("a dropped release_all's locks to be freed", || async {
            holders(&admin, lock_id).await == 0
        })
        .await;
    }
    let status = manager.pool().status();
    assert!(status.size <= status.max_size, "{status:?}");
    let guard = manager
        .acquire(&key, timeout(Duration::from_secs(5)))
        .await
        .expect("the manager still works");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_outside_a_runtime_frees_its_lock() {
    let manager = PostgresLockManager::new(pool(1));
    let admin = admin().await;
    let key = unique_key("dropped-no-runtime");
    let lock_id = locks_port::lock_id(&key);
    let guard = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
    std::thread::spawn(move || drop(guard))
        .join()
        .expect("drop on a thread without a runtime");
    assert!(!manager.is_held(&key));
    wait_for(
        "the lock of a guard dropped without a runtime to be freed",
        || async { holders(&admin, lock_id).await == 0 },
    )
    .await;
    let guard = manager
        .acquire(&key, timeout(Duration::from_secs(5)))
        .await
        .expect("the pool slot came back");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

// ---------------------------------------------------------------------------------
// 8. The polling strategy.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_gets_the_lock_after_a_release_and_times_out_like_queueing() {
    let holder = PostgresLockManager::new(pool(1));
    let waiter = PostgresLockManager::new(pool(1));
    let admin = admin().await;
    let key = unique_key("poll");
    let lock_id = locks_port::lock_id(&key);
    let poll = |timeout: Duration| {
        AcquireOptions::new()
            .with_timeout(timeout)
            .with_wait_strategy(WaitStrategy::Poll)
            .with_retry_interval(Duration::from_millis(20))
    };

    let guard = holder.acquire(&key, AcquireOptions::new()).await.unwrap();
    let error = waiter
        .acquire(&key, poll(Duration::from_millis(200)))
        .await
        .expect_err("held");
    assert_eq!(error.kind(), AcquisitionErrorKind::Timeout);
    assert_eq!(error.timeout(), Some(Duration::from_millis(200)));
    assert_eq!(
        error.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.2s")
    );
    let error = waiter
        .acquire(&key, poll(Duration::ZERO))
        .await
        .expect_err("held");
    assert_eq!(
        error.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.0s")
    );
    // A poller never queues on the server, and gave its connection back.
    assert!(waiting_pids(&admin, lock_id).await.is_empty());
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
    assert_eq!(holders(&admin, lock_id).await, 1);
    assert!(waiter.is_held(&key));
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(holders(&admin, lock_id).await, 0);
}

// ---------------------------------------------------------------------------------
// 9. The waiting session is lost or cancelled.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_backend_is_terminated_gets_connection_lost() {
    let holder = PostgresLockManager::new(pool(1));
    let waiter = PostgresLockManager::new(pool(1));
    let admin = admin().await;
    let key = unique_key("terminated-waiter");
    let lock_id = locks_port::lock_id(&key);
    let guard = holder.acquire(&key, AcquireOptions::new()).await.unwrap();

    for options in [AcquireOptions::new(), timeout(Duration::from_secs(30))] {
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            let key = key.clone();
            async move { waiter.acquire(&key, options).await }
        });
        let pid = the_waiter(&admin, lock_id).await;
        let started = Instant::now();
        terminate(&admin, pid).await;
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
    assert_eq!(holders(&admin, lock_id).await, 1);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    let guard = waiter
        .acquire(&key, timeout(Duration::from_secs(5)))
        .await
        .expect("the waiter's manager works after losing its connections");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_by_an_operator_gets_cancelled_and_keeps_nothing() {
    let holder = PostgresLockManager::new(pool(1));
    let waiter = PostgresLockManager::new(pool(1));
    let admin = admin().await;
    let key = unique_key("cancelled-waiter");
    let lock_id = locks_port::lock_id(&key);
    let guard = holder.acquire(&key, AcquireOptions::new()).await.unwrap();

    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        let key = key.clone();
        async move { waiter.acquire(&key, AcquireOptions::new()).await }
    });
    let pid = the_waiter(&admin, lock_id).await;
    let cancelled: bool = admin
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
    assert!(error.to_string().contains(&key), "{error}");
    assert!(waiting_pids(&admin, lock_id).await.is_empty());

    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_nobody_takes_it(&admin, lock_id).await;
    let guard = waiter
        .acquire(&key, timeout(Duration::from_secs(5)))
        .await
        .expect("the waiter's manager still works");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}
