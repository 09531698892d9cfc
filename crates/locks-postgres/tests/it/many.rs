//! `acquire_many`: all or nothing, one global order, one deadline, one session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_conformance::Lcg;
use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, LostReason,
    ReleaseOutcome,
};
use locks_postgres::PostgresLockManager;

use crate::faults::{holder_pids, terminate_backend};
use crate::support::{admin, admin_with_fencing, holders, pool, unique_key};

/// Tasks asking for random overlapping subsets of 10 keys, in random order, never
/// deadlock (each call has a deadline far above what a fair run needs, and must not
/// hit it) and never overlap on a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_overlapping_subsets_never_deadlock_or_overlap() {
    let keys: Vec<String> = (0..10).map(|n| unique_key(&format!("many-{n}"))).collect();
    let in_use: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..6_u64 {
        let manager = PostgresLockManager::new(pool(1));
        let (keys, in_use) = (keys.clone(), Arc::clone(&in_use));
        tasks.push(tokio::spawn(async move {
            let mut random = Lcg::new(task + 1);
            for _ in 0..15 {
                let subset = random.subset(&keys, 2, 5);
                let locks = manager
                    .acquire_many(&subset, Duration::from_secs(30))
                    .await
                    .unwrap_or_else(|error| panic!("task {task}: {error}"));
                for key in &subset {
                    let mut in_use = in_use.lock().unwrap();
                    let holders = in_use.entry((*key).to_owned()).or_default();
                    *holders += 1;
                    assert_eq!(*holders, 1, "two holders of {key} at once");
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                for key in &subset {
                    *in_use.lock().unwrap().get_mut(*key).unwrap() -= 1;
                }
                assert_eq!(locks.release().await, ReleaseOutcome::Unlocked);
            }
            assert_eq!(manager.held_lock_count(), 0);
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("no deadlock")
            .unwrap();
    }
    let admin = admin().await;
    for key in &keys {
        assert_eq!(holders(&admin, locks_port::lock_id(key)).await, 0);
    }
}

/// A deadline that passes on the second key leaves the first one free (the session
/// that took it is closed), and the error names the busy key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_part_way_leaves_nothing_held() {
    let holder = PostgresLockManager::new(pool(1));
    let manager = PostgresLockManager::new(pool(2));
    let keys: Vec<String> = (0..3)
        .map(|n| unique_key(&format!("many-timeout-{n}")))
        .collect();
    let mut by_id: Vec<&String> = keys.iter().collect();
    by_id.sort_by_key(|key| locks_port::lock_id(key));
    let busy = by_id[1];
    let guard = holder.acquire(busy, AcquireOptions::new()).await.unwrap();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let error = manager
        .acquire_many(&refs, Duration::from_millis(300))
        .await
        .expect_err("the middle key is held");
    assert_eq!(error.kind(), AcquisitionErrorKind::Timeout, "{error}");
    assert_eq!(error.key(), busy.as_str());
    assert_eq!(manager.held_lock_count(), 0);
    let admin = admin().await;
    crate::faults::wait_for("the first key to be freed", || async {
        holders(&admin, locks_port::lock_id(by_id[0])).await == 0
    })
    .await;
    assert_eq!(holders(&admin, locks_port::lock_id(by_id[2])).await, 0);
    assert!(
        crate::faults::waiting_pids(&admin, locks_port::lock_id(busy))
            .await
            .is_empty()
    );
    guard.release().await;
}

/// A dropped `acquire_many` leaves nothing held, and its queued wait is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_many_leaves_nothing_held() {
    let holder = PostgresLockManager::new(pool(1));
    let manager = PostgresLockManager::new(pool(2));
    let keys: Vec<String> = (0..3)
        .map(|n| unique_key(&format!("many-dropped-{n}")))
        .collect();
    let mut by_id: Vec<&String> = keys.iter().collect();
    by_id.sort_by_key(|key| locks_port::lock_id(key));
    let guard = holder
        .acquire(by_id[2], AcquireOptions::new())
        .await
        .unwrap();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        manager.acquire_many(&refs, AcquireOptions::new()),
    )
    .await;
    assert!(waited.is_err(), "the last key is held: still waiting");
    let admin = admin().await;
    crate::faults::wait_for("the dropped group's session to be closed", || async {
        holders(&admin, locks_port::lock_id(by_id[0])).await == 0
            && holders(&admin, locks_port::lock_id(by_id[1])).await == 0
            && crate::faults::waiting_pids(&admin, locks_port::lock_id(by_id[2]))
                .await
                .is_empty()
    })
    .await;
    assert_eq!(manager.held_lock_count(), 0);
    guard.release().await;
}

/// One guard for the group: duplicates merged, `release(key)` of a member fires the
/// group's signal, and the group's release unlocks the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_guard_releases_the_group_and_tells_of_any_loss() {
    let manager = PostgresLockManager::new(pool(1));
    let other = PostgresLockManager::new(pool(1));
    let a = unique_key("many-group-a");
    let b = unique_key("many-group-b");
    let locks = manager
        .acquire_many(&[&a, &b, &a], AcquireOptions::new())
        .await
        .unwrap();
    assert_eq!(locks.infos().len(), 2, "duplicates are one lock");
    assert_eq!(manager.held_lock_count(), 2);
    assert!(other.try_acquire(&a).await.unwrap().is_none());
    manager.release(&a).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), locks.lost())
        .await
        .expect("a member taken away fires the group's signal");
    assert_eq!(reason, LostReason::Released);
    assert!(
        other.try_acquire(&b).await.unwrap().is_none(),
        "b is still held"
    );
    let guard = other.try_acquire(&a).await.unwrap().expect("a is free");
    guard.release().await;
    locks.release().await;
    assert_eq!(manager.held_lock_count(), 0);
    let admin = admin().await;
    assert_eq!(holders(&admin, locks_port::lock_id(&b)).await, 0);
    assert!(other.try_acquire(&b).await.unwrap().is_some());
}

/// A group whose session ends is lost whole and exactly: every key leaves the
/// bookkeeping before the group's signal fires, and each key is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_group_leaves_the_bookkeeping_before_its_signal_and_counts_every_key() {
    let admin = admin().await;
    for round in 0..5 {
        let manager = PostgresLockManager::builder(pool(1))
            .health_check_interval(Duration::from_millis(10))
            .build();
        let keys: Vec<String> = (0..50)
            .map(|n| unique_key(&format!("many-lost-{round}-{n}")))
            .collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let locks = manager
            .acquire_many(&keys, AcquireOptions::new())
            .await
            .unwrap();
        let pid = holder_pids(&admin, locks.infos()[0].lock_id()).await[0];
        let watcher = {
            let (manager, lost) = (manager.clone(), locks.lost());
            let keys: Vec<String> = keys.iter().map(|key| (*key).to_owned()).collect();
            tokio::spawn(async move {
                let reason = lost.await;
                // What a holder woken by the signal sees, at once.
                let still_held = keys.iter().filter(|key| manager.is_held(key)).count();
                (
                    reason,
                    manager.held_lock_count(),
                    still_held,
                    manager.lost_lock_counts(),
                )
            })
        };
        terminate_backend(&admin, pid).await;
        let (reason, count, still_held, lost) =
            tokio::time::timeout(Duration::from_secs(5), watcher)
                .await
                .expect("the group is told")
                .unwrap();
        assert_eq!(reason, LostReason::ConnectionClosed);
        assert_eq!(
            count, 0,
            "round {round}: keys still counted when the signal fired"
        );
        assert_eq!(
            still_held, 0,
            "round {round}: keys still held when the signal fired"
        );
        assert_eq!(
            lost.connection_closed, 50,
            "round {round}: one loss per key"
        );
        assert_eq!(
            locks.release().await,
            ReleaseOutcome::Lost(LostReason::ConnectionClosed)
        );
        assert_eq!(manager.lost_lock_counts().total(), 50);
    }
}

/// With fencing on, a group hands out one token per key, each higher than the key's
/// previous one, whoever held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_hands_out_a_fencing_token_per_key() {
    admin_with_fencing().await;
    let manager = PostgresLockManager::builder(pool(2)).fencing(true).build();
    let (a, b, c) = (
        unique_key("many-fence-a"),
        unique_key("many-fence-b"),
        unique_key("many-fence-c"),
    );
    let single = manager.acquire(&b, AcquireOptions::new()).await.unwrap();
    let before = single
        .info()
        .fencing_token()
        .expect("a single grant's token");
    single.release().await;
    let group = manager
        .acquire_many(&[&a, &b, &c], AcquireOptions::new())
        .await
        .unwrap();
    let tokens: HashMap<String, Option<i64>> = group
        .infos()
        .iter()
        .map(|info| (info.key().to_owned(), info.fencing_token()))
        .collect();
    assert!(tokens.values().all(Option::is_some), "{tokens:?}");
    assert!(tokens[&b] > Some(before), "{tokens:?} after {before}");
    group.release().await;
    let again = manager
        .acquire_many(&[&a, &c], AcquireOptions::new())
        .await
        .unwrap();
    for info in again.infos() {
        assert!(info.fencing_token() > tokens[info.key()], "{info:?}");
    }
    again.release().await;
}
