//! The server goes away: it restarts while locks are held, or one of its backends stops
//! answering. Each test runs on a cluster of its own, so the shared server is untouched.
//! Multiplexed, the held locks share connections, and the backend that stops answering
//! is the shared connection of a neighbour.

use std::str::FromStr;
use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, LostReason,
    ReleaseOutcome,
};
use locks_postgres::tokio_postgres;

use super::{
    Mode, Watched, admin_at, assert_bounded, assert_pool_within_bounds, assert_still_locks,
    drop_cluster, own_cluster, pool_at, pool_from, timeout, wait_for,
};
use crate::support::{Counting, holders, unique_key};

in_both_modes!(a_server_restart_while_locks_are_held);
/// A server restart with 10 locks held: every guard is told (`ConnectionClosed`) within
/// the health check interval, the bookkeeping empties, calls while the server is down
/// fail promptly with a clear kind, and the same manager works once it is back.
/// (Multiplexed, the 10 locks are on 3 connections.)
async fn a_server_restart_while_locks_are_held(mode: Mode) {
    let cluster = own_cluster("the restart test");
    let manager = mode.manager(pool_at(&cluster.url(), 12));
    let keys: Vec<String> = (0..10)
        .map(|n| unique_key(&format!("restart-{n}")))
        .collect();
    let down = unique_key("restart-down");
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(manager.acquire(key, AcquireOptions::new()).await.unwrap());
    }
    {
        let admin = admin_at(&cluster.url()).await;
        for key in &keys {
            assert_eq!(holders(&admin, locks_port::lock_id(key)).await, 1);
        }
    }

    let stopped = Instant::now();
    tokio::task::block_in_place(|| cluster.stop()).expect("pg_ctl stop -m fast");
    for guard in &guards {
        let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .expect("every guard is told its lock is gone");
        assert_eq!(reason, LostReason::ConnectionClosed);
    }
    eprintln!(
        "{mode:?}: 10 locks lost in a restart, all told {:?} after pg_ctl stop returned",
        stopped.elapsed()
    );
    assert_eq!(manager.held_lock_count(), 0);
    for key in &keys {
        assert!(!manager.is_held(key));
    }
    assert_eq!(manager.lost_lock_counts().connection_closed, 10);

    // Down: a clear, prompt error naming the key, for bounded and unbounded waits.
    for options in [timeout(Duration::from_secs(2)), AcquireOptions::new()] {
        let started = Instant::now();
        let error = manager
            .acquire(&down, options)
            .await
            .expect_err("the server is down");
        assert_bounded("an acquire while the server is down", started);
        assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable, "{error}");
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

    for guard in guards {
        assert_eq!(
            guard.release().await,
            ReleaseOutcome::Lost(LostReason::ConnectionClosed)
        );
    }
    tokio::task::block_in_place(|| cluster.start_again()).expect("pg_ctl start");

    // The same manager works again, for the same keys.
    let admin = admin_at(&cluster.url()).await;
    for key in keys.iter().chain([&down]) {
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
pub(crate) fn signal(pid: i32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}: {status}");
}

/// Continues a stopped backend however the test ends, so that the cluster can stop.
pub(crate) struct Continue(pub(crate) i32);

impl Drop for Continue {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

in_both_modes!(a_bounded_acquire_on_a_server_that_stops_answering_fails_with_connection_lost);
/// A backend that stops answering (SIGSTOP: a hung server or a silent network) cannot
/// hold a bounded acquire hostage: after its timeout plus a grace period the call
/// fails with `ConnectionLost`, and the connection is given up, not pooled.
/// Multiplexed, the stopped backend is the neighbours' shared connection, where the
/// acquisition tries first: the try gives up the same way, and closing the connection
/// loses the neighbours, each told.
async fn a_bounded_acquire_on_a_server_that_stops_answering_fails_with_connection_lost(mode: Mode) {
    // A cluster of this test alone: nobody else's backends get stopped.
    let cluster = own_cluster("the stopped-backend test");
    let mut config = tokio_postgres::Config::from_str(&cluster.url()).expect("URL");
    config.application_name("it-stopped-backend");
    let manager = mode.manager(pool_from(config, 1));
    let lock = Watched::on(
        admin_at(&cluster.url()).await,
        unique_key("stopped-backend"),
    );
    let key = &lock.key;
    let neighbours = mode.neighbours(&manager, &lock.admin).await;

    // Warm the pool (multiplexed: on the neighbours' connection), then stop its one
    // backend (idle, or holding the neighbours).
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
    println!("{mode:?}: a bounded acquire on a stopped backend gave up after {elapsed:?}");
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
    neighbours.assert_lost(LostReason::ConnectionClosed).await;
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

/// With `release_in_background`, an acquisition of a key whose unlock this manager still
/// has in flight does not race it with a try (which reaches the server first whenever the
/// unlock's connection is slower, and then costs a second round trip to queue): it waits
/// in the server's queue at once and is granted the moment the unlock lands. Here the
/// unlock's backend is SIGSTOPped, so the unlock cannot land first; meanwhile no one
/// else gets the key, and once the backend continues the acquisition is granted.
#[test]
fn an_acquisition_waits_for_its_own_unlock_in_flight_instead_of_racing_it() {
    use tracing_subscriber::layer::SubscriberExt as _;

    // Started before the test's runtime (which is current-thread, so that the subscriber
    // sees every event): `own_cluster` needs a multi-thread one.
    let cluster = throwaway_pg::ThrowawayPostgres::start()
        .unwrap_or_else(|error| panic!("a cluster for the unlock-in-flight test: {error}"));
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(Counting {
        prefix: "this manager's unlock of the key is in flight",
        seen: std::sync::Arc::clone(&seen),
    });
    let _default = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let config = tokio_postgres::Config::from_str(&cluster.url()).expect("URL");
        let manager = locks_postgres::PostgresLockManager::builder(pool_from(config.clone(), 2))
            .release_in_background(true)
            .span_level(tracing::Level::TRACE)
            .build();
        let other = locks_postgres::PostgresLockManager::new(pool_from(config, 1));
        let lock = Watched::on(
            admin_at(&cluster.url()).await,
            unique_key("unlock-in-flight"),
        );

        // Nothing in flight: the first acquisition tries, as always.
        let guard = manager
            .acquire(&lock.key, AcquireOptions::new())
            .await
            .unwrap();
        let pid = lock.the_holder().await;
        let stopped = Continue(pid);
        signal(pid, "STOP");
        assert_eq!(guard.release().await, ReleaseOutcome::InBackground);
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);

        let mut again = Box::pin(manager.acquire(&lock.key, AcquireOptions::new()));
        let waiting = async {
            wait_for(
                "the acquisition to queue behind the stopped unlock",
                || async { !lock.waiting_pids().await.is_empty() },
            )
            .await;
        };
        tokio::select! {
            granted = &mut again => panic!("granted before the unlock landed: {granted:?}"),
            () = waiting => {}
        }
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the acquisition waited in the queue without trying first"
        );
        assert_eq!(
            lock.holder_pids().await,
            [pid],
            "the stopped unlock still holds it"
        );
        assert!(other.try_acquire(&lock.key).await.unwrap().is_none());

        drop(stopped); // SIGCONT: the unlock lands, the queued acquisition is granted.
        let guard = tokio::time::timeout(Duration::from_secs(10), again)
            .await
            .expect("granted once the unlock landed")
            .unwrap();
        assert!(manager.is_held(&lock.key));
        assert_ne!(
            lock.the_holder().await,
            pid,
            "granted to the waiting session"
        );
        assert!(other.try_acquire(&lock.key).await.unwrap().is_none());
        guard.release().await;
        wait_for("the key to be free", || async {
            lock.holder_pids().await.is_empty()
        })
        .await;
        assert!(!manager.is_held(&lock.key));
    });
    drop(runtime);
    drop(cluster);
}
