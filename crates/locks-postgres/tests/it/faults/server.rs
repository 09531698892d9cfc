//! The server goes away: it restarts while locks are held, or one of its backends stops
//! answering. Each test runs on a cluster of its own, so the shared server is untouched.

use std::str::FromStr;
use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, ReleaseOutcome,
};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres;

use super::{
    Watched, admin_at, assert_bounded, assert_pool_within_bounds, assert_still_locks, drop_cluster,
    own_cluster, pool_at, pool_from, timeout, wait_for,
};
use crate::support::{holders, unique_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_while_locks_are_held() {
    let cluster = own_cluster("the restart test");
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
    assert_pool_within_bounds(&manager);
    drop((admin, manager));
    drop_cluster(cluster);
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
    let cluster = own_cluster("the stopped-backend test");
    let mut config = tokio_postgres::Config::from_str(&cluster.url()).expect("URL");
    config.application_name("it-stopped-backend");
    let manager = PostgresLockManager::new(pool_from(config, 1));
    let lock = Watched::on(
        admin_at(&cluster.url()).await,
        unique_key("stopped-backend"),
    );
    let key = &lock.key;

    // Warm the pool, then stop its one idle backend.
    let warm = manager.try_acquire(key).await.unwrap().expect("free");
    assert_eq!(warm.release().await, ReleaseOutcome::Unlocked);
    let pid: i32 = lock
        .admin
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
        .acquire(key, timeout(Duration::from_millis(300)))
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
    assert_pool_within_bounds(&manager);

    // Once it runs again it finds its client gone and exits, holding nothing.
    drop(stopped);
    wait_for("the continued backend to exit", || async {
        lock.admin
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
    assert_eq!(lock.holders().await, 0);
    assert_still_locks(&manager, key, "the manager works on a new connection").await;
    drop((lock, manager));
    drop_cluster(cluster);
}
