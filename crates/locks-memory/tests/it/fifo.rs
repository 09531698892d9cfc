//! Waiters are served in arrival order, and a released lock goes to the queue.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_memory::InMemoryLockTable;
use locks_port::{AcquireOptions, DistributedLock, LockGuard, ReleaseOutcome, WaitStrategy};

use crate::poll_once;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() {
    let table = InMemoryLockTable::new();
    let holder = table.manager();
    let other = table.manager();
    let key = "fifo";
    let guard = holder.acquire(key, AcquireOptions::new()).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));

    let mut waiters = Vec::new();
    for waiter in 0..10 {
        let manager = table.manager();
        let order = Arc::clone(&order);
        // Half wait forever, half with a (long) timeout: one queue either way.
        let options = if waiter % 2 == 0 {
            AcquireOptions::new()
        } else {
            AcquireOptions::new().with_timeout(Duration::from_secs(10))
        };
        let mut wait = Box::pin(async move {
            let guard = manager.acquire(key, options).await.unwrap();
            order.lock().unwrap().push(waiter);
            tokio::task::yield_now().await;
            assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
        });
        // Joins the queue now, so arrival order is exactly 0, 1, 2, ...
        assert!(poll_once(wait.as_mut()).await, "waiter {waiter} must wait");
        waiters.push(wait);
    }

    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert!(
        other.try_acquire(key).await.unwrap().is_none(),
        "a released lock must go to the first waiter, not to a try_acquire"
    );
    // Spawned in reverse: the queue, not the scheduler, decides the order.
    let tasks: Vec<_> = waiters.into_iter().rev().map(tokio::spawn).collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..10).collect::<Vec<_>>());
    assert!(table.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lock_goes_to_the_queue_not_to_a_poller() {
    let table = InMemoryLockTable::new();
    let holder = table.manager();
    let queued = table.manager();
    let poller = table.manager();
    let key = "queue-beats-poll";
    let guard = holder.acquire(key, AcquireOptions::new()).await.unwrap();
    let mut wait = Box::pin(queued.acquire(key, AcquireOptions::new()));
    assert!(poll_once(wait.as_mut()).await);
    drop(guard);

    let polling = AcquireOptions::new()
        .with_wait_strategy(WaitStrategy::Poll)
        .with_retry_interval(Duration::from_millis(5))
        .with_timeout(Duration::from_millis(50));
    let error = poller.acquire(key, polling).await.unwrap_err();
    assert!(error.is_timeout(), "{error}");

    let guard = wait.await.unwrap();
    assert!(queued.is_held(key));
    drop(guard);
    let guard = poller.acquire(key, polling).await.unwrap();
    drop(guard);
    assert!(table.is_empty());
}
