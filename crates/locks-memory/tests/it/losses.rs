//! The double can lose: `lose`, `end_session` and `fail_next_acquire` drive a caller's
//! code through every loss and error branch, for a lock, a group and a permit.

use std::time::Duration;

use locks_memory::InMemoryLockTable;
use locks_port::{
    AcquisitionErrorKind, DistributedLock, LockError, LockGuard, LockRegistry, LostReason,
    PermitGuard, ReleaseOutcome, Semaphore,
};

const REASONS: [LostReason; 3] = [
    LostReason::ConnectionClosed,
    LostReason::KeepaliveFailed,
    LostReason::Released,
];

#[tokio::test]
async fn a_lost_lock_tells_its_guard_and_is_free_for_others() {
    for reason in REASONS {
        let table = InMemoryLockTable::new();
        let (locks, other) = (table.manager(), table.manager());
        let guard = locks.acquire("job", Duration::ZERO).await.expect("free");
        assert!(
            !locks.lose("other-key", reason),
            "an unheld key is not lost"
        );
        assert!(locks.lose("job", reason));
        assert_eq!(guard.lost().await, reason);
        assert!(!locks.is_held("job"));
        let next = other.try_acquire("job").await.expect("try");
        assert!(next.is_some(), "a lost lock is free for others at once");
        let expected = match reason {
            LostReason::Released => ReleaseOutcome::AlreadyReleased,
            reason => ReleaseOutcome::Lost(reason),
        };
        assert_eq!(guard.release().await, expected);
    }
}

#[tokio::test]
async fn with_lock_until_lost_stops_on_a_connection_closed() {
    let locks = InMemoryLockTable::new().manager();
    let loser = locks.clone();
    let error = locks
        .with_lock_until_lost("job", Duration::ZERO, |_| async move {
            assert!(loser.lose("job", LostReason::ConnectionClosed));
            std::future::pending::<()>().await;
        })
        .await
        .expect_err("the body must be stopped");
    match error {
        LockError::Lost(lost) => assert_eq!(lost.reason(), LostReason::ConnectionClosed),
        other => panic!("wanted LockError::Lost, got {other:?}"),
    }
}

#[tokio::test]
async fn a_group_is_lost_as_one_session() {
    let table = InMemoryLockTable::new();
    let (locks, other) = (table.manager(), table.manager());
    let group = locks
        .acquire_many(["a", "b"], Duration::ZERO)
        .await
        .expect("free");
    assert!(locks.lose("b", LostReason::KeepaliveFailed));
    assert_eq!(group.lost().await, LostReason::KeepaliveFailed);
    assert_eq!(
        locks.held_lock_count(),
        0,
        "every key of the group went with it"
    );
    assert!(other.try_acquire("a").await.expect("try").is_some());
    assert_eq!(
        group.release().await,
        ReleaseOutcome::Lost(LostReason::KeepaliveFailed)
    );
}

#[tokio::test]
async fn end_session_loses_locks_groups_and_permits() {
    let table = InMemoryLockTable::new();
    let (locks, other) = (table.manager(), table.manager());
    let lock = locks.acquire("lock", Duration::ZERO).await.expect("lock");
    let group = locks
        .acquire_many(["g1", "g2"], Duration::ZERO)
        .await
        .expect("group");
    let permit = locks
        .acquire_permit("exports", 1, Duration::ZERO)
        .await
        .expect("permit");
    assert_eq!(locks.end_session(LostReason::ConnectionClosed), 4);
    assert_eq!(lock.lost().await, LostReason::ConnectionClosed);
    assert_eq!(group.lost().await, LostReason::ConnectionClosed);
    assert_eq!(permit.lost().await, LostReason::ConnectionClosed);
    let taken = other.try_acquire_permit("exports", 1).await.expect("try");
    assert!(taken.is_some(), "the lost permit is free for others");
    assert_eq!(
        permit.release().await,
        ReleaseOutcome::Lost(LostReason::ConnectionClosed)
    );
    assert_eq!(locks.held_lock_count(), 0);
    assert_eq!(locks.end_session(LostReason::ConnectionClosed), 0);
    drop((lock, group));
    let again = locks.acquire("lock", Duration::ZERO).await;
    assert!(again.is_ok(), "the manager stays usable");
}

#[tokio::test]
async fn the_next_acquire_fails_with_the_chosen_kind_once() {
    let locks = InMemoryLockTable::new().manager();
    let kinds = [
        AcquisitionErrorKind::Timeout,
        AcquisitionErrorKind::PoolUnavailable,
        AcquisitionErrorKind::Unreachable,
        AcquisitionErrorKind::Configuration,
        AcquisitionErrorKind::Deadlock,
        AcquisitionErrorKind::ConnectionLost,
        AcquisitionErrorKind::Cancelled,
        AcquisitionErrorKind::Backend,
    ];
    for kind in kinds {
        locks.fail_next_acquire(kind);
        let error = locks.acquire("k", Duration::ZERO).await.expect_err("armed");
        assert_eq!(error.kind(), kind, "{error}");
        assert_eq!(error.key(), "k");
        assert_eq!(error.is_timeout(), kind == AcquisitionErrorKind::Timeout);
        drop(locks.acquire("k", Duration::ZERO).await.expect("only once"));
    }
    locks.fail_next_acquire(AcquisitionErrorKind::Unreachable);
    let error = locks.try_acquire("k").await.expect_err("try_acquire too");
    assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable);
    locks.fail_next_acquire(AcquisitionErrorKind::ConnectionLost);
    let error = locks
        .acquire_many(["a", "b"], Duration::ZERO)
        .await
        .expect_err("groups too");
    assert_eq!(error.kind(), AcquisitionErrorKind::ConnectionLost);
    locks.fail_next_acquire(AcquisitionErrorKind::PoolUnavailable);
    let error = locks
        .acquire_permit("exports", 2, Duration::ZERO)
        .await
        .expect_err("permits too");
    assert_eq!(error.kind(), AcquisitionErrorKind::PoolUnavailable);
    assert!(error.is_permit(), "{error}");
    assert_eq!(
        locks.held_lock_count(),
        0,
        "a failed acquisition holds nothing"
    );
}
