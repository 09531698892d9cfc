//! `acquire_many`: all or nothing, one global order, one deadline, cancel safe as a whole.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use locks_conformance::Lcg;
use locks_memory::{InMemoryLockManager, InMemoryLockTable};
use locks_port::{
    AcquireOptions, DistributedLock, LockAcquisitionError, LockGuard, LockMode, LockRegistry,
    LostReason, ReleaseOutcome, lock_id,
};

use crate::poll_once;

/// Something that holds a group of locks until it is dropped.
type Held = Box<dyn Send>;
type Taking<'a> = Pin<Box<dyn Future<Output = Result<Held, LockAcquisitionError>> + Send + 'a>>;
/// One way of taking a group of keys within a deadline: the library's, or a broken one
/// for the harness's self-checks.
type Take = for<'a> fn(&'a InMemoryLockManager, &'a [&'a str], Duration) -> Taking<'a>;

/// The deadline of each group in the harness: far above what a fair run needs, so
/// reaching it means the tasks deadlocked.
const GROUP_DEADLINE: Duration = Duration::from_secs(2);

fn acquire_many<'a>(
    manager: &'a InMemoryLockManager,
    keys: &'a [&'a str],
    timeout: Duration,
) -> Taking<'a> {
    Box::pin(async move { Ok(Box::new(manager.acquire_many(keys, timeout).await?) as Held) })
}

/// Broken on purpose: one `acquire` per key, in the caller's order.
fn one_by_one_in_given_order<'a>(
    manager: &'a InMemoryLockManager,
    keys: &'a [&'a str],
    timeout: Duration,
) -> Taking<'a> {
    Box::pin(async move {
        let mut guards = Vec::new();
        for key in keys {
            guards.push(manager.acquire(key, timeout).await?);
        }
        Ok(Box::new(guards) as Held)
    })
}

/// Six tasks, each taking 15 random subsets of 2 to 5 of 10 keys (in random order)
/// with `take` on the manager `manager(task)` gives it. Fails with "two holders of …"
/// when two tasks were inside one key at once, with "deadlock: …" when a group was not
/// had within [`GROUP_DEADLINE`].
async fn random_overlapping_subsets(manager: impl Fn() -> InMemoryLockManager, take: Take) {
    let keys: Vec<String> = (0..10).map(|n| format!("many:{n}")).collect();
    let in_use: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..6_u64 {
        let manager = manager();
        let (keys, in_use) = (keys.clone(), Arc::clone(&in_use));
        tasks.push(tokio::spawn(async move {
            let mut random = Lcg::new(task + 1);
            for _ in 0..15 {
                let subset = random.subset(&keys, 2, 5);
                let held = take(&manager, &subset, GROUP_DEADLINE)
                    .await
                    .map_err(|error| format!("deadlock: task {task}: {error}"))?;
                for key in &subset {
                    let mut in_use = in_use.lock().unwrap();
                    let holders = in_use.entry((*key).to_owned()).or_default();
                    *holders += 1;
                    if *holders > 1 {
                        return Err(format!("two holders of {key} at once"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                for key in &subset {
                    *in_use.lock().unwrap().get_mut(*key).unwrap() -= 1;
                }
                drop(held);
            }
            if manager.held_lock_count() == 0 {
                Ok(())
            } else {
                Err(format!("task {task} still books locks"))
            }
        }));
    }
    for task in tasks {
        if let Err(failure) = task.await.unwrap() {
            panic!("{failure}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_overlapping_subsets_never_deadlock_or_overlap() {
    let table = InMemoryLockTable::new();
    random_overlapping_subsets(|| table.manager(), acquire_many).await;
    assert!(table.is_empty(), "every lock given back");
}

/// The harness must see an overlap: every task on a table of its own excludes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "two holders of")]
async fn the_harness_catches_an_overlap() {
    random_overlapping_subsets(InMemoryLockManager::new, acquire_many).await;
}

/// The harness must see a deadlock: one `acquire` per key in the caller's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "deadlock: ")]
async fn the_harness_catches_a_deadlock() {
    let table = InMemoryLockTable::new();
    random_overlapping_subsets(|| table.manager(), one_by_one_in_given_order).await;
}

/// `keys` sorted by lock id: the order `acquire_many` takes them in.
fn by_lock_id(keys: &[&'static str]) -> Vec<&'static str> {
    let mut sorted = keys.to_vec();
    sorted.sort_by_key(|key| lock_id(key));
    sorted
}

/// The timeout bounds the whole group, not each key: the first busy key freed late
/// leaves only what is left of the deadline for the next one.
#[tokio::test]
async fn one_deadline_for_the_group() {
    let table = InMemoryLockTable::new();
    let (holder, manager) = (table.manager(), table.manager());
    let keys = by_lock_id(&["deadline:a", "deadline:b"]);
    let first = holder
        .acquire(keys[0], AcquireOptions::new())
        .await
        .unwrap();
    let _second = holder
        .acquire(keys[1], AcquireOptions::new())
        .await
        .unwrap();
    let freeing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(first);
    });
    let started = Instant::now();
    let error = manager
        .acquire_many(&keys, Duration::from_millis(300))
        .await
        .expect_err("the second key stays held");
    let waited = started.elapsed();
    assert_eq!(error.key(), keys[1], "the first key was had in time");
    assert!(
        waited < Duration::from_millis(450),
        "one 300 ms deadline for both keys, yet it waited {waited:?}"
    );
    assert_eq!(manager.held_lock_count(), 0);
    freeing.await.unwrap();
}

/// `Duration::MAX` saturates instead of overflowing.
#[tokio::test]
async fn the_longest_timeout_saturates() {
    let manager = InMemoryLockManager::new();
    let locks = manager
        .acquire_many(&["max:a", "max:b"], Duration::MAX)
        .await
        .unwrap();
    assert_eq!(locks.infos().len(), 2);
    assert_eq!(locks.release().await, ReleaseOutcome::Unlocked);
}

/// A dropped `acquire_many` gives back the keys it took, also when the last lock was
/// handed to it and it was never polled again.
#[tokio::test]
async fn a_dropped_acquire_many_leaves_nothing_held() {
    let table = InMemoryLockTable::new();
    let (holder, manager, other) = (table.manager(), table.manager(), table.manager());
    let keys = by_lock_id(&["dropped:a", "dropped:b", "dropped:c"]);
    for hand_over in [false, true] {
        let guard = holder
            .acquire(keys[2], AcquireOptions::new())
            .await
            .unwrap();
        let mut taking = Box::pin(manager.acquire_many(&keys, AcquireOptions::new()));
        assert!(poll_once(taking.as_mut()).await, "waits for the last key");
        assert!(
            other.try_acquire(keys[0]).await.unwrap().is_none(),
            "the waiting group holds its first keys"
        );
        if hand_over {
            drop(guard); // handed to the group, which is never polled again
            drop(taking);
        } else {
            drop(taking); // still queued for the last key
            drop(guard);
        }
        assert_eq!(manager.held_lock_count(), 0);
        for key in &keys {
            let free = other.try_acquire(key).await.unwrap();
            assert!(
                free.is_some(),
                "{key} must be free (hand over: {hand_over})"
            );
        }
        assert!(table.is_empty());
    }
}

/// One guard for the group: duplicates merged, `release(key)` of a member fires the
/// group's signal, and the group's release frees the rest.
#[tokio::test]
async fn one_guard_releases_the_group_and_tells_of_any_loss() {
    let table = InMemoryLockTable::new();
    let (manager, other) = (table.manager(), table.manager());
    let locks = manager
        .acquire_many(&["group:a", "group:b", "group:a"], AcquireOptions::new())
        .await
        .unwrap();
    let ids: Vec<i64> = locks.infos().iter().map(|info| info.lock_id()).collect();
    assert_eq!(ids.len(), 2, "duplicates are one lock");
    assert!(ids.is_sorted(), "taken in lock-id order");
    assert_eq!(manager.held_lock_count(), 2);
    assert!(!locks.is_lost());

    manager.release("group:a").await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), locks.lost())
        .await
        .expect("a member taken away fires the group's signal");
    assert_eq!(reason, LostReason::Released);
    assert!(other.try_acquire("group:b").await.unwrap().is_none());
    let again = manager.acquire("group:a", Duration::ZERO).await.unwrap();

    assert_eq!(locks.release().await, ReleaseOutcome::AlreadyReleased);
    assert!(
        manager.is_held("group:a"),
        "a later acquisition is not the group's"
    );
    assert!(other.try_acquire("group:b").await.unwrap().is_some());
    assert_eq!(again.release().await, ReleaseOutcome::Unlocked);
    assert!(table.is_empty());
}

/// The mode comes from the options: two shared groups hold the same keys at once and
/// keep a writer out; dropping the guards frees everything.
#[tokio::test]
async fn shared_groups_hold_together() {
    let table = InMemoryLockTable::new();
    let (reader_1, reader_2, writer) = (table.manager(), table.manager(), table.manager());
    let keys = ["shared:a", "shared:b"];
    let first = reader_1
        .acquire_many(&keys, AcquireOptions::shared().with_timeout(Duration::ZERO))
        .await
        .unwrap();
    let second = reader_2
        .acquire_many(&keys, AcquireOptions::shared().with_timeout(Duration::ZERO))
        .await
        .expect("readers share");
    assert!(first.infos().iter().all(|i| i.mode() == LockMode::Shared));
    let error = writer
        .acquire_many(&keys, Duration::from_millis(20))
        .await
        .expect_err("a writer waits for the readers");
    assert!(error.is_timeout());
    drop((first, second));
    assert_eq!(reader_1.held_lock_count() + reader_2.held_lock_count(), 0);
    let locks = writer.acquire_many(&keys, Duration::ZERO).await.unwrap();
    assert!(
        locks
            .infos()
            .iter()
            .all(|i| i.mode() == LockMode::Exclusive)
    );
}

/// Any list of strings names a group: arrays, slices, `&Vec<String>`, owned vectors,
/// iterators of `format!`ed keys; through the inherent method and the port's trait.
#[tokio::test]
async fn acquire_many_takes_any_list_of_strings() {
    async fn through_the_trait<L: locks_port::AcquireMany>(locks: &L, keys: &[String]) -> usize {
        use locks_port::LockGroup;
        let group = locks
            .acquire_many(keys, Duration::ZERO)
            .await
            .expect("trait");
        group.infos().len()
    }
    let locks = InMemoryLockManager::new();
    let owned: Vec<String> = (0..3).map(|n| format!("account:{n}")).collect();
    let borrowed: Vec<&str> = owned.iter().map(String::as_str).collect();
    let sizes = [
        locks
            .acquire_many(&owned, Duration::ZERO)
            .await
            .map(|g| g.infos().len()),
        locks
            .acquire_many(owned.clone(), Duration::ZERO)
            .await
            .map(|g| g.infos().len()),
        locks
            .acquire_many(&borrowed[..], Duration::ZERO)
            .await
            .map(|g| g.infos().len()),
        locks
            .acquire_many(["a", "b"], Duration::ZERO)
            .await
            .map(|g| g.infos().len()),
        locks
            .acquire_many((0..4).map(|n| format!("k:{n}")), Duration::ZERO)
            .await
            .map(|g| g.infos().len()),
    ];
    let sizes: Vec<usize> = sizes
        .into_iter()
        .map(|size| size.expect("granted"))
        .collect();
    assert_eq!(sizes, [3, 3, 3, 2, 4]);
    assert_eq!(through_the_trait(&locks, &owned).await, 3);
    assert_eq!(
        locks.held_lock_count(),
        0,
        "every group was released on drop"
    );
}
