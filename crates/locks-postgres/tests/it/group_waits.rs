//! `acquire_many`'s tries in one statement: a group that finds a key busy holds the keys
//! before it and none after it while it waits (the global order is kept), and the old
//! way (one try per round trip) keeps the same rule.

use std::time::Duration;

use locks_port::{DistributedLock, LockGuard, LockRegistry, ReleaseOutcome};
use locks_postgres::PostgresLockManager;

use crate::faults::{holder_pids, wait_for, waiting_pids};
use crate::support::{admin, pool, unique_key};

/// Six keys in the global order (ascending lock id), with their ids.
fn ordered_keys(manager: &PostgresLockManager, name: &str) -> Vec<(i64, String)> {
    let mut keys: Vec<(i64, String)> = (0..6)
        .map(|n| unique_key(&format!("{name}-{n}")))
        .map(|key| (manager.lock_id(&key), key))
        .collect();
    keys.sort();
    keys
}

async fn waits_holding_only_the_keys_before_the_busy_one(manager: PostgresLockManager) {
    let admin = admin().await;
    let keys = ordered_keys(&manager, "group-waits");
    let (busy_id, busy_key) = keys[2].clone();
    let other = PostgresLockManager::new(pool(1));
    let blocker = other
        .acquire(&busy_key, Duration::from_secs(5))
        .await
        .expect("the blocker takes the third key");
    let names: Vec<String> = keys.iter().map(|(_, key)| key.clone()).collect();
    let waiting = tokio::spawn({
        let manager = manager.clone();
        async move {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            manager.acquire_many(&names, Duration::from_secs(30)).await
        }
    });
    wait_for("the group to queue for the busy key", || async {
        assert!(
            !waiting.is_finished(),
            "the group ended before the key was free"
        );
        !waiting_pids(&admin, busy_id).await.is_empty()
    })
    .await;
    let waiter = waiting_pids(&admin, busy_id).await[0];
    for (index, (lock_id, _)) in keys.iter().enumerate() {
        let holds = holder_pids(&admin, *lock_id).await.contains(&waiter);
        assert_eq!(
            holds,
            index < 2,
            "while it waits for key 2, the group's session must hold keys 0 and 1 and \
             none after the busy one (key {index}: held = {holds})"
        );
    }
    assert_eq!(blocker.release().await, ReleaseOutcome::Unlocked);
    let group = waiting
        .await
        .expect("the task")
        .expect("the group once the key is free");
    assert_eq!(group.infos().len(), 6);
    for (lock_id, key) in &keys {
        assert_eq!(holder_pids(&admin, *lock_id).await, vec![waiter], "{key}");
    }
    assert_eq!(group.release().await, ReleaseOutcome::Unlocked);
    for (lock_id, key) in &keys {
        assert!(
            holder_pids(&admin, *lock_id).await.is_empty(),
            "{key} still held"
        );
    }
    // The group's session went back to the pool after its release (one statement).
    assert_eq!(manager.pool().status().available, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_group_holds_the_keys_before_the_busy_one_and_none_after() {
    waits_holding_only_the_keys_before_the_busy_one(PostgresLockManager::new(pool(1))).await;
}

/// A group whose keys are all free is granted whole, and a busy last key times out with
/// nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_last_key_times_out_with_nothing_held() {
    let admin = admin().await;
    let manager = PostgresLockManager::new(pool(1));
    let keys = ordered_keys(&manager, "group-last");
    let other = PostgresLockManager::new(pool(1));
    let _blocker = other
        .acquire(&keys[5].1, Duration::from_secs(5))
        .await
        .expect("the blocker takes the last key");
    let names: Vec<&str> = keys.iter().map(|(_, key)| key.as_str()).collect();
    let error = manager
        .acquire_many(&names, Duration::from_millis(300))
        .await
        .expect_err("the last key is busy");
    assert!(error.to_string().contains(&keys[5].1), "{error}");
    assert_eq!(manager.held_lock_count(), 0);
    // The session that took the first five was closed: the server frees them as the
    // backend exits.
    for (lock_id, key) in &keys[..5] {
        wait_for(&format!("{key} to be freed"), || async {
            holder_pids(&admin, *lock_id).await.is_empty()
        })
        .await;
    }
}
