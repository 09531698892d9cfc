//! The double can lose: `lose`, `end_session` and `fail_next_acquire` drive a caller's
//! code through every loss and error branch, for a lock, a group and a permit.

use std::future::{Future, IntoFuture};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use locks_memory::{InMemoryLockManager, InMemoryLockTable};
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

/// A waker that, when woken (inside the loss's `notify`), tries the lost key or permit
/// through another manager: whether it was free at the moment the guard was told.
struct TriesAtWake {
    other: InMemoryLockManager,
    permit: bool,
    free: Mutex<Option<bool>>,
}

impl Wake for TriesAtWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut cx = Context::from_waker(Waker::noop());
        let free = if self.permit {
            let mut tried = pin!(self.other.try_acquire_permit("exports", 1));
            matches!(tried.as_mut().poll(&mut cx), Poll::Ready(Ok(Some(_))))
        } else {
            let mut tried = pin!(self.other.try_acquire("job"));
            matches!(tried.as_mut().poll(&mut cx), Poll::Ready(Ok(Some(_))))
        };
        *self.free.lock().expect("not poisoned") = Some(free);
    }
}

/// PostgreSQL frees a lock when its session ends and the client hears of it after, so a
/// loss handler can take the key again at once; the double keeps that order for `lose`
/// and `end_session`, locks and permits alike.
#[tokio::test]
async fn a_guard_is_told_of_its_loss_only_once_its_key_is_free() {
    for (permit, by_end_session) in [(false, false), (false, true), (true, true)] {
        let table = InMemoryLockTable::new();
        let locks = table.manager();
        let tries = Arc::new(TriesAtWake {
            other: table.manager(),
            permit,
            free: Mutex::new(None),
        });
        let waker = Waker::from(Arc::clone(&tries));
        let mut cx = Context::from_waker(&waker);
        let (lock, held_permit);
        let lost = if permit {
            held_permit = locks.acquire_permit("exports", 1, Duration::ZERO).await;
            held_permit.as_ref().expect("free").lost()
        } else {
            lock = locks.acquire("job", Duration::ZERO).await;
            lock.as_ref().expect("free").lost()
        };
        let mut lost = pin!(lost.into_future());
        assert!(lost.as_mut().poll(&mut cx).is_pending(), "held");
        if by_end_session {
            assert_eq!(locks.end_session(LostReason::ConnectionClosed), 1);
        } else {
            assert!(locks.lose("job", LostReason::ConnectionClosed));
        }
        let free = *tries.free.lock().expect("not poisoned");
        assert_eq!(
            free,
            Some(true),
            "told of its loss (permit: {permit}, end_session: {by_end_session}) while the key was still taken"
        );
    }
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
