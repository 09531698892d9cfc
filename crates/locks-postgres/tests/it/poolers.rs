//! Session locks behind a real PgBouncer.

use std::time::Duration;

use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, LockRegistry, LostReason, ReleaseOutcome,
};
use locks_postgres::PostgresLockManager;
use throwaway_pg::{PgBouncer, PoolMode};

use crate::faults::{holder_pids, wait_for};
use crate::support::{admin, database_url, holders, unique_key};

/// Session pooling carries session locks: one client, one server session. Another
/// client through the same PgBouncer is excluded, and when an operator terminates the
/// server session under a held lock, PgBouncer drops the client and the guard is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_carries_session_locks_and_their_loss() {
    let bouncer =
        tokio::task::block_in_place(|| PgBouncer::start(&database_url(), PoolMode::Session))
            .unwrap_or_else(|error| panic!("PgBouncer for the session-pooling test: {error}"));
    let url = bouncer.url();
    let manager = PostgresLockManager::new(locks_postgres::plain_pool(&url, 2).expect("pool"));
    let other = PostgresLockManager::new(locks_postgres::plain_pool(&url, 2).expect("pool"));
    let key = unique_key("pgbouncer-session");
    let lock_id = locks_port::lock_id(&key);
    let admin = admin().await;

    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire through PgBouncer");
    assert_eq!(holders(&admin, lock_id).await, 1, "held on the real server");
    assert!(
        other.try_acquire(&key).await.unwrap().is_none(),
        "another client is excluded"
    );
    let error = other
        .acquire(&key, Duration::from_millis(200))
        .await
        .expect_err("a bounded wait through PgBouncer times out");
    assert!(error.is_timeout(), "{error}");

    let [pid] = holder_pids(&admin, lock_id).await[..] else {
        panic!("one server session holds the lock");
    };
    crate::faults::terminate_backend(&admin, pid).await;
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss of the server session reaches the guard through PgBouncer");
    assert!(
        matches!(
            reason,
            LostReason::ConnectionClosed | LostReason::KeepaliveFailed
        ),
        "{reason:?}"
    );
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(guard.release().await, ReleaseOutcome::Lost(reason));
    let taken = other
        .acquire(&key, Duration::from_secs(5))
        .await
        .expect("the key is free again");
    assert_eq!(taken.release().await, ReleaseOutcome::Unlocked);
    wait_for("the lock to be gone on the server", || async {
        holders(&admin, lock_id).await == 0
    })
    .await;
    drop(bouncer);
}
