//! A key this manager holds itself: a wait on it is told at debug level (the timeout's
//! error says so too; that is the contract suite's case, on both managers).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use locks_port::{AcquireOptions, DistributedLock, LockGuard};
use locks_postgres::PostgresLockManager;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::support::{Counting, pool, unique_key};

/// The message of the debug event.
const TOLD: &str = "the key is busy because this manager holds it itself";

/// An acquisition without a timeout of a key this manager holds waits (for ever, if
/// nobody releases the guard), and the debug event says why when the wait begins;
/// `try_acquire`'s refusal is told too. Busy because another manager holds it, neither
/// a wait nor a refusal says so (the control). Current-thread, so the subscriber set
/// for this thread sees every event of the manager's tasks.
#[tokio::test]
async fn a_wait_on_a_key_this_manager_holds_is_told_at_debug_level() {
    let seen = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(Counting {
        prefix: TOLD,
        seen: Arc::clone(&seen),
    });
    let _default = tracing::subscriber::set_default(subscriber);
    let manager = PostgresLockManager::builder(pool(3))
        .holder_id("self-held")
        .build();
    let other = PostgresLockManager::new(pool(1));
    let key = unique_key("self-held-wait");

    let elsewhere = other.acquire(&key, AcquireOptions::new()).await.unwrap();
    let error = manager
        .acquire(&key, Duration::from_millis(50))
        .await
        .expect_err("held by the other manager");
    assert!(
        error.is_timeout() && !error.is_held_by_this_manager(),
        "{error}"
    );
    assert!(manager.try_acquire(&key).await.unwrap().is_none());
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "another holder is not this one"
    );
    elsewhere.release().await;

    let first = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
    assert!(manager.try_acquire(&key).await.unwrap().is_none());
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the refused try is told");
    let waiter = {
        let (manager, key) = (manager.clone(), key.clone());
        tokio::spawn(async move { manager.acquire(&key, AcquireOptions::wait_forever()).await })
    };
    let began = tokio::time::Instant::now();
    while seen.load(Ordering::SeqCst) < 2 {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the wait on this manager's own key was not told"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "it waits while this manager holds the key"
    );
    first.release().await;
    let second = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted once the first guard was released")
        .expect("the task")
        .expect("the acquisition");
    second.release().await;
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}
