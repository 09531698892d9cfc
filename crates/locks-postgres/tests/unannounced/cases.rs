//! The release finds the session ended: the lock (or permit) was lost while held, and the
//! loss is counted once, as a loss the monitor finds is.

use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, PermitGuard, ReleaseOutcome, Semaphore,
};
use locks_postgres::tokio_postgres::Client;
use locks_postgres::{PostgresLockManager, PostgresLockManagerBuilder};
use opentelemetry::metrics::MeterProvider as _;

use crate::recorded::{Recorded, total};
use crate::support::{admin, unannounced_pool, unique_key};

const LOST: &str = "eventsource.lock.lost";
const HELD: &str = "eventsource.lock.held";
const PERMITS_LOST: &str = "eventsource.semaphore.permits.lost";
const PERMITS: &str = "eventsource.semaphore.permits";

/// A manager on a pool of `size` whose connections do not announce their end, with
/// every check that would find the loss first turned off.
fn quiet(recorded: &Recorded, size: usize) -> PostgresLockManagerBuilder {
    PostgresLockManager::builder(unannounced_pool(size))
        .meter(recorded.provider.meter("unannounced"))
        .lease(None)
        .keepalive(None)
        .health_check_interval(Duration::from_secs(3600))
}

/// Terminates the one backend holding the advisory lock `(classid, objid, objsubid)`
/// (`pg_locks`' columns, as `int4`), and waits until the server has let the lock go.
async fn terminate_holder(admin: &Client, classid: i32, objid: i32, objsubid: i16) {
    const HOLDERS: &str = "FROM pg_locks WHERE locktype = 'advisory' AND granted \
        AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = $3";
    let terminated: Vec<bool> = admin
        .query(
            &format!("SELECT pg_terminate_backend(pid) {HOLDERS}"),
            &[&classid, &objid, &objsubid],
        )
        .await
        .expect("pg_terminate_backend")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(terminated, [true], "one holder, terminated");
    let started = Instant::now();
    loop {
        let left: i64 = admin
            .query_one(
                &format!("SELECT count(*) {HOLDERS}"),
                &[&classid, &objid, &objsubid],
            )
            .await
            .expect("pg_locks")
            .get(0);
        if left == 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the lock was not let go"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A lock id as `pg_locks` shows it: the high half in `classid`, the low in `objid`.
#[allow(clippy::cast_possible_truncation)] // the halves, by construction
fn halves(lock_id: i64) -> (i32, i32) {
    ((lock_id >> 32) as i32, lock_id as i32)
}

/// A session that ended before the monitor looked, found by the holder's own release:
/// the lock was lost while held, and the loss is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_finds_the_session_ended_counts_a_loss() {
    let recorded = Recorded::new();
    let manager = quiet(&recorded, 1).build();
    let admin = admin().await;
    let key = unique_key("metrics-lost-at-release");
    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    let (classid, objid) = halves(manager.lock_id(&key));
    terminate_holder(&admin, classid, objid, 1).await;
    assert_eq!(guard.release().await, ReleaseOutcome::SessionClosed);
    let points = recorded.points();
    let wanted = [("lock.lost_reason", "connection_closed")];
    assert_eq!(total(&points, LOST, &wanted), 1.0, "{points:#?}");
    assert_eq!(total(&points, HELD, &[]), 0.0, "{points:#?}");
    // The manager's own count agrees with the metric.
    assert_eq!(manager.lost_lock_counts().connection_closed, 1);
    assert_eq!(manager.lost_lock_counts().total(), 1);
}

/// A permit whose session ended before its watch looked, found by the holder's own
/// release: lost while held, and counted as such (as for a lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_that_finds_the_session_ended_counts_a_loss() {
    let recorded = Recorded::new();
    let manager = quiet(&recorded, 2).build();
    let admin = admin().await;
    let name = unique_key("metrics-permit-lost-at-release");
    let permit = manager
        .acquire_permit(&name, 1, AcquireOptions::new())
        .await
        .expect("a permit");
    let class = manager.semaphore_class(&name);
    let slot = i32::try_from(permit.info().slot()).expect("slots are below 65,536");
    terminate_holder(&admin, class, slot, 2).await;
    assert_eq!(permit.release().await, ReleaseOutcome::SessionClosed);
    let points = recorded.points();
    let wanted = [("lock.lost_reason", "connection_closed")];
    assert_eq!(total(&points, PERMITS_LOST, &wanted), 1.0, "{points:#?}");
    assert_eq!(total(&points, PERMITS, &[]), 0.0, "{points:#?}");
    assert_eq!(manager.lost_lock_counts().connection_closed, 1);
}
