//! The server's lock table: a cluster with a small one (`max_locks_per_transaction = 10`,
//! `max_connections = 20`: 200 entries documented) is filled by a foreign session; the
//! manager's acquisition is refused with the server's words and hint, classified by its
//! SQLSTATE, and works again once the foreign locks are released. Its own test binary: it
//! starts its own cluster, which the shared test server's settings must not be.

use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, PermitGuard, Semaphore,
};
use locks_postgres::tokio_postgres::error::SqlState;
use locks_postgres::{PostgresLockManager, is_lock_table_full};

const MAX_LOCKS_PER_TRANSACTION: u64 = 10;
const MAX_CONNECTIONS: u64 = 20;
/// Locks the filler takes per statement.
const BATCH: u64 = 50;
/// More than the table can hold in practice (its documented capacity plus the slack of
/// spare shared memory and the background processes' slots).
const MOST: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_lock_table_refuses_with_the_servers_words_and_recovers() {
    let server = throwaway_pg::testing::cluster_with_lock_table(
        MAX_LOCKS_PER_TRANSACTION,
        MAX_CONNECTIONS,
        "a cluster with a small lock table",
    )
    .await;
    let pool = locks_postgres::plain_pool(&server.url(), 4).expect("pool");
    let manager = PostgresLockManager::new(pool);

    let empty = manager.lock_table_usage().await.expect("usage");
    assert_eq!(empty.capacity, MAX_LOCKS_PER_TRANSACTION * MAX_CONNECTIONS);
    assert_eq!(empty.advisory, 0, "{empty:?}");

    // A foreign session takes locks until the server refuses one.
    let filler = throwaway_pg::testing::connect(&server.url()).await;
    let mut refused = None;
    for first in (0..MOST).step_by(usize::try_from(BATCH).expect("small")) {
        let sql = format!(
            "SELECT pg_advisory_lock(g) FROM generate_series({first}, {}) g",
            first + BATCH - 1
        );
        if let Err(error) = filler.batch_execute(&sql).await {
            refused = Some(error);
            break;
        }
    }
    let refused = refused.expect("the server refused a lock before MOST");
    assert_eq!(
        refused.code(),
        Some(&SqlState::OUT_OF_MEMORY),
        "{refused:?}"
    );

    let full = manager
        .lock_table_usage()
        .await
        .expect("usage of a full table");
    assert!(full.advisory >= full.capacity, "{full:?}");
    assert!(full.fraction() >= 1.0, "{full:?}");
    eprintln!("full table: {full:?}");

    let key = "lock-table:refused";
    let error = manager
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(5)),
        )
        .await
        .expect_err("no room in the lock table");
    eprintln!("refusal: {error}");
    assert_eq!(error.kind(), AcquisitionErrorKind::Backend, "{error}");
    assert!(is_lock_table_full(&error), "{error:?}");
    assert!(error.reason().contains("out of shared memory"), "{error}");
    assert!(error.reason().contains("53200"), "{error}");
    assert!(
        error.reason().contains("max_locks_per_transaction"),
        "the hint: {error}"
    );

    // Nothing is wedged: once the foreign locks go, the same manager takes the lock.
    filler
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .expect("the filler's release");
    let guard = manager
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("the lock once the table has room");
    assert!(!is_lock_table_full(
        &locks_port::LockAcquisitionError::timed_out(key, Duration::ZERO)
    ));
    let held = manager.lock_table_usage().await.expect("usage");
    assert_eq!(held.advisory, 1, "{held:?}");
    guard.release().await;

    // The arithmetic the README gives: a group of k keys takes k entries; a semaphore's
    // holder takes its slot, a share of the marker of N and its grant time's lock.
    let keys = [
        "lock-table:g0",
        "lock-table:g1",
        "lock-table:g2",
        "lock-table:g3",
    ];
    let group = manager
        .acquire_many(&keys, AcquireOptions::new())
        .await
        .expect("a group");
    let with_group = manager.lock_table_usage().await.expect("usage");
    assert_eq!(with_group.advisory, 4, "a group of 4: {with_group:?}");
    group.release().await;
    let mut permits = Vec::new();
    for _ in 0..3 {
        let permit = manager
            .acquire_permit("lock-table:semaphore", 3, AcquireOptions::new())
            .await
            .expect("a permit");
        permits.push(permit);
    }
    let with_permits = manager.lock_table_usage().await.expect("usage");
    assert_eq!(with_permits.advisory, 9, "3 permits of 3: {with_permits:?}");
    for permit in permits {
        permit.release().await;
    }
    let released = manager.lock_table_usage().await.expect("usage");
    assert_eq!(released.advisory, 0, "{released:?}");
    drop(filler);
    tokio::task::spawn_blocking(move || server.destroy().expect("stop the cluster"))
        .await
        .expect("the stopping thread");
}
