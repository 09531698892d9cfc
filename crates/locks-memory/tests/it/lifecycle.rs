//! Drop, cancellation, bookkeeping and table cleanup of the in-memory manager.

use std::time::Duration;

use locks_memory::{InMemoryLockManager, InMemoryLockTable};
use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, LockRegistry, ReleaseOutcome, WaitStrategy, lock_id,
};

use crate::poll_once;

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn dropping_a_guard_needs_no_runtime() {
    let table = InMemoryLockTable::new();
    let a = table.manager();
    let b = table.manager();
    let runtime = current_thread();
    let guard = runtime
        .block_on(a.acquire("no-runtime", AcquireOptions::new()))
        .unwrap();
    drop(runtime);
    assert!(tokio::runtime::Handle::try_current().is_err());

    drop(guard);
    assert!(!a.is_held("no-runtime"));
    assert_eq!(a.held_lock_count(), 0);
    assert!(table.is_empty(), "the table entry must be gone");

    let guard = current_thread()
        .block_on(b.try_acquire("no-runtime"))
        .unwrap();
    assert!(guard.is_some(), "the dropped guard's lock must be free");
}

#[tokio::test]
async fn a_cancelled_wait_leaves_nothing_held() {
    let table = InMemoryLockTable::new();
    let holder = table.manager();
    let waiter = table.manager();
    let guard = holder
        .acquire("cancel", AcquireOptions::new())
        .await
        .unwrap();

    let waited = tokio::time::timeout(
        Duration::from_millis(20),
        waiter.acquire("cancel", AcquireOptions::new()),
    )
    .await;
    assert!(
        waited.is_err(),
        "the lock is held: the wait must still be pending"
    );
    assert_eq!(waiter.held_lock_count(), 0);
    assert_eq!(table.len(), 1, "only the holder's entry is left");

    drop(guard);
    assert!(table.is_empty(), "nobody holds or waits: no entry");
    let guard = waiter.try_acquire("cancel").await.unwrap();
    assert!(guard.is_some());
}

#[tokio::test]
async fn a_wait_cancelled_after_being_handed_the_lock_gives_it_back() {
    let table = InMemoryLockTable::new();
    let holder = table.manager();
    let waiter = table.manager();
    let other = table.manager();
    let guard = holder
        .acquire("handed", AcquireOptions::new())
        .await
        .unwrap();
    let mut wait = Box::pin(waiter.acquire("handed", AcquireOptions::new()));
    assert!(poll_once(wait.as_mut()).await);

    drop(guard); // hands the lock to the queued wait, which is never polled again
    assert!(other.try_acquire("handed").await.unwrap().is_none());
    drop(wait);

    assert_eq!(waiter.held_lock_count(), 0);
    let guard = other.try_acquire("handed").await.unwrap();
    assert!(
        guard.is_some(),
        "the cancelled wait must give the lock back"
    );
    drop(guard);
    assert!(table.is_empty());
}

#[tokio::test]
async fn timed_out_and_refused_attempts_leave_no_entry() {
    let table = InMemoryLockTable::new();
    let holder = table.manager();
    let other = table.manager();
    let guard = holder.acquire("busy", AcquireOptions::new()).await.unwrap();
    for options in [
        AcquireOptions::new().with_timeout(Duration::from_millis(10)),
        AcquireOptions::new().with_timeout(Duration::ZERO),
        AcquireOptions::new()
            .with_timeout(Duration::from_millis(10))
            .with_wait_strategy(WaitStrategy::Poll)
            .with_retry_interval(Duration::from_millis(2)),
    ] {
        let error = other.acquire("busy", options).await.unwrap_err();
        assert!(error.is_timeout());
        assert_eq!(error.timeout(), options.timeout());
    }
    assert!(other.try_acquire("busy").await.unwrap().is_none());
    assert_eq!(table.len(), 1);
    drop(guard);
    assert!(table.is_empty());
}

#[tokio::test]
async fn every_way_of_releasing_empties_the_table() {
    let table = InMemoryLockTable::new();
    let manager = table.manager();
    for round in 0..25 {
        let keys: Vec<String> = (0..4).map(|n| format!("cleanup:{round}:{n}")).collect();
        let explicit = manager
            .acquire(&keys[0], AcquireOptions::new())
            .await
            .unwrap();
        let dropped = manager.try_acquire(&keys[1]).await.unwrap().unwrap();
        let _ = manager
            .try_acquire(&keys[2])
            .await
            .unwrap()
            .unwrap()
            .into_held();
        let _ = manager
            .try_acquire(&keys[3])
            .await
            .unwrap()
            .unwrap()
            .into_held();
        assert_eq!(table.len(), 4);
        assert_eq!(explicit.release().await, ReleaseOutcome::Unlocked);
        drop(dropped);
        manager.release(&keys[2]).await.unwrap();
        assert_eq!(manager.release_all().await, 1);
        assert!(table.is_empty(), "round {round}: {table:?}");
    }
}

#[tokio::test]
async fn a_poll_with_a_zero_interval_does_not_starve_the_runtime() {
    // On a current-thread runtime, a busy loop would never let the holder run.
    let table = InMemoryLockTable::new();
    let holder = table.manager();
    let poller = table.manager();
    let guard = holder
        .acquire("zero-interval", AcquireOptions::new())
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        guard.release().await
    });
    let options = AcquireOptions::new()
        .with_wait_strategy(WaitStrategy::Poll)
        .with_retry_interval(Duration::ZERO)
        .with_timeout(Duration::from_secs(10));
    let guard = poller.acquire("zero-interval", options).await.unwrap();
    assert_eq!(release.await.unwrap(), ReleaseOutcome::Unlocked);
    drop(guard);
}

#[tokio::test]
async fn info_carries_the_holder_id_and_the_servers_lock_id() {
    let table = InMemoryLockTable::new();
    let labelled = table.manager_with_holder_id("worker-1");
    let guard = labelled
        .acquire("cutover:tenant-123", AcquireOptions::new())
        .await
        .unwrap();
    assert_eq!(guard.info().holder_id(), Some("worker-1"));
    assert_eq!(guard.info().lock_id(), 7_696_161_359_070_260_854);
    assert_eq!(guard.info().lock_id(), lock_id("cutover:tenant-123"));
    drop(guard);

    let unlabelled = InMemoryLockManager::new();
    let guard = unlabelled.try_acquire("k").await.unwrap().unwrap();
    assert_eq!(guard.info().holder_id(), None);
    let legacy = InMemoryLockManager::with_holder_id("test-worker");
    assert_eq!(legacy.holder_id(), Some("test-worker"));
    let guard_elsewhere = legacy.try_acquire("k").await.unwrap();
    assert!(
        guard_elsewhere.is_some(),
        "managers on different tables never contend"
    );
}

#[tokio::test]
async fn clones_share_bookkeeping_and_siblings_contend() {
    let manager = InMemoryLockManager::with_holder_id("w");
    let clone = manager.clone();
    let sibling = InMemoryLockManager::on_table(manager.table());
    let _ = manager
        .try_acquire("shared")
        .await
        .unwrap()
        .unwrap()
        .into_held();
    assert!(clone.is_held("shared"), "a clone shares the bookkeeping");
    assert!(
        !sibling.is_held("shared"),
        "a sibling has its own bookkeeping"
    );
    assert!(
        sibling.try_acquire("shared").await.unwrap().is_none(),
        "siblings contend"
    );
    clone.release("shared").await.unwrap();
    assert!(!manager.is_held("shared"));
    assert!(sibling.try_acquire("shared").await.unwrap().is_some());
}

#[tokio::test]
async fn dropping_the_last_handle_of_a_manager_frees_its_locks() {
    let table = InMemoryLockTable::new();
    let manager = table.manager();
    let other = table.manager();
    let _ = manager
        .try_acquire("abandoned")
        .await
        .unwrap()
        .unwrap()
        .into_held();
    assert!(other.try_acquire("abandoned").await.unwrap().is_none());
    drop(manager);
    assert!(other.try_acquire("abandoned").await.unwrap().is_some());
}

#[tokio::test]
async fn a_stale_guard_never_releases_a_newer_acquisition() {
    let table = InMemoryLockTable::new();
    let manager = table.manager();
    let other = table.manager();
    let stale = manager
        .acquire("stale", AcquireOptions::new())
        .await
        .unwrap();
    assert_eq!(manager.release_all().await, 1);
    let current = manager
        .acquire("stale", AcquireOptions::new())
        .await
        .unwrap();
    assert_eq!(stale.release().await, ReleaseOutcome::AlreadyReleased);
    assert!(manager.is_held("stale"));
    assert!(other.try_acquire("stale").await.unwrap().is_none());
    assert_eq!(current.release().await, ReleaseOutcome::Unlocked);
    assert!(table.is_empty());
}
