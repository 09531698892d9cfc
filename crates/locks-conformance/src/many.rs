//! Cases of [`AcquireMany`]: several keys at once, for the managers that offer it
//! (stamped out by [`acquire_many_suite!`](crate::acquire_many_suite)).

use std::time::Duration;

use super::Harness;
use super::fixtures::{
    WAIT, assert_held_here_error, assert_timeout_error, bounded, eventually, eventually_acquirable,
    must_be_busy, must_release, must_take, unique_key,
};
use locks_port::{
    AcquireMany, AcquireOptions, DistributedLock, LockGroup, LockGuard, LockMode, LockRegistry,
    LostReason, ReleaseOutcome, lock_id,
};

/// Three unique keys of one case, sorted by lock id (the order they are taken in).
fn keys_by_lock_id(case: &str) -> Vec<String> {
    let mut keys: Vec<String> = (0..3).map(|n| unique_key(&format!("{case}-{n}"))).collect();
    keys.sort_by_key(|key| lock_id(key));
    keys
}

fn refs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

/// All keys are taken, once each, in lock-id order and in the options' mode; the
/// group's release frees them all.
pub async fn acquire_many_takes_all_in_lock_id_order<H: Harness<Manager: AcquireMany>>(
    harness: &H,
) {
    let manager = harness.manager();
    let other = harness.manager();
    let keys = keys_by_lock_id("acquire_many_takes_all");
    let asked = [
        keys[2].as_str(),
        keys[0].as_str(),
        keys[1].as_str(),
        keys[2].as_str(),
    ];
    let locks = manager
        .acquire_many(&asked, bounded(WAIT))
        .await
        .expect("acquire_many of free keys");
    let taken: Vec<&str> = locks.infos().iter().map(|info| info.key()).collect();
    assert_eq!(
        taken,
        refs(&keys),
        "one lock per key (a key named twice is one lock), in ascending lock-id order"
    );
    assert!(
        locks
            .infos()
            .iter()
            .all(|info| info.mode() == LockMode::Exclusive)
    );
    assert_eq!(manager.held_lock_count(), 3, "every key is booked");
    for key in &keys {
        must_be_busy(&other, key, "a key of a held group").await;
    }
    assert_eq!(
        locks.release().await,
        ReleaseOutcome::Unlocked,
        "the group's release unlocks every key"
    );
    assert_eq!(manager.held_lock_count(), 0);
    for key in &keys {
        must_release(must_take(&other, key, "a released group's key").await, "").await;
    }
}

/// A timeout on the middle key leaves none held: the error names the busy key and
/// the call's timeout, and the first key is given back.
pub async fn acquire_many_is_all_or_nothing<H: Harness<Manager: AcquireMany>>(harness: &H) {
    let holder = harness.manager();
    let manager = harness.manager();
    let other = harness.manager();
    let keys = keys_by_lock_id("acquire_many_is_all_or_nothing");
    let guard = must_take(&holder, &keys[1], "the middle key").await;
    let timeout = Duration::from_millis(300);
    let error = manager
        .acquire_many(&refs(&keys), bounded(timeout))
        .await
        .expect_err("acquire_many must not succeed while one of its keys is held");
    assert_timeout_error(&error, &keys[1], timeout, "acquire_many part-way");
    assert_eq!(
        manager.held_lock_count(),
        0,
        "nothing booked after an error"
    );
    for key in [&keys[0], &keys[2]] {
        let free = eventually_acquirable(&other, key, "a key of a failed group").await;
        must_release(free, "a key of a failed group").await;
    }
    must_release(guard, "the middle key").await;
}

/// A dropped call leaves nothing held and no wait queued.
pub async fn dropped_acquire_many_leaves_nothing_held<H: Harness<Manager: AcquireMany>>(
    harness: &H,
) {
    let holder = harness.manager();
    let manager = harness.manager();
    let other = harness.manager();
    let keys = keys_by_lock_id("dropped_acquire_many");
    let guard = must_take(&holder, &keys[2], "the last key").await;
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        manager.acquire_many(&refs(&keys), AcquireOptions::new()),
    )
    .await;
    assert!(
        waited.is_err(),
        "the last key is held: the call must still wait"
    );
    must_release(guard, "the last key").await;
    for key in &keys {
        let free = eventually_acquirable(&other, key, "a key of a dropped group").await;
        must_release(free, "a key of a dropped group").await;
    }
    assert_eq!(
        manager.held_lock_count(),
        0,
        "nothing booked by a dropped call"
    );
}

/// An empty list is granted at once with a guard that holds nothing.
pub async fn acquire_many_of_nothing_holds_nothing<H: Harness<Manager: AcquireMany>>(harness: &H) {
    let manager = harness.manager();
    let locks = manager
        .acquire_many(&[] as &[&str], bounded(Duration::ZERO))
        .await
        .expect("an empty list has nothing to wait for");
    assert!(locks.infos().is_empty());
    assert!(!locks.is_lost());
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(locks.release().await, ReleaseOutcome::Unlocked);
}

/// `release(key)` of one member fires the group's signal; the group's release then
/// reports it and frees the rest.
pub async fn acquire_many_tells_of_a_member_taken_away<H: Harness<Manager: AcquireMany>>(
    harness: &H,
) {
    let manager = harness.manager();
    let other = harness.manager();
    let keys = keys_by_lock_id("acquire_many_tells");
    let locks = manager
        .acquire_many(&refs(&keys), bounded(WAIT))
        .await
        .expect("acquire_many of free keys");
    manager
        .release(&keys[0])
        .await
        .expect("a member of a held group is held");
    let lost = locks.lost();
    eventually(
        || lost.is_lost(),
        "a member taken away must fire the group's lost()",
    )
    .await;
    assert_eq!(lost.reason(), Some(LostReason::Released));
    must_be_busy(&other, &keys[1], "the other members stay held").await;
    assert_eq!(
        locks.release().await,
        ReleaseOutcome::AlreadyReleased,
        "the group's release must report the member it no longer had"
    );
    for key in &keys {
        let free = eventually_acquirable(&other, key, "a released group's key").await;
        must_release(free, "a released group's key").await;
    }
}

/// A group with the empty key among its keys is refused (`InvalidKey`) and nothing of
/// it is held.
pub async fn acquire_many_refuses_an_empty_key<H: Harness<Manager: AcquireMany>>(harness: &H) {
    let keys = keys_by_lock_id("acquire_many_refuses_an_empty_key");
    let manager = harness.manager();
    let error = manager
        .acquire_many(&[keys[0].as_str(), "", keys[1].as_str()], bounded(WAIT))
        .await
        .expect_err("a group with the empty key must be refused");
    assert_eq!(
        error.kind(),
        locks_port::AcquisitionErrorKind::InvalidKey,
        "{error}"
    );
    assert_eq!(
        manager.held_lock_count(),
        0,
        "nothing of the group may be held"
    );
    for key in &keys {
        let guard = must_take(&harness.manager(), key, "a key of the refused group").await;
        must_release(guard, "a key of the refused group").await;
    }
}

/// A group whose wait times out on a key the asking manager holds itself (its own
/// guard) says so, as the single lock's timeout does, naming that key; nothing of the
/// group stays held. Another manager's group on the same keys times out without saying
/// so (the negative control).
pub async fn acquire_many_names_a_key_this_manager_holds<H: Harness<Manager: AcquireMany>>(
    harness: &H,
) {
    let manager = harness.manager();
    let other = harness.manager();
    let keys = keys_by_lock_id("acquire_many_names_a_key_this_manager_holds");
    let held = must_take(&manager, &keys[1], "the middle key alone").await;
    let timeout = Duration::from_millis(250);
    match manager.acquire_many(&refs(&keys), bounded(timeout)).await {
        Ok(_locks) => panic!("a group must not take a key its own manager holds"),
        Err(error) => assert_held_here_error(&error, held.info(), timeout, "a group"),
    }
    assert_eq!(
        manager.held_lock_count(),
        1,
        "only the single lock stays held"
    );
    match other.acquire_many(&refs(&keys), bounded(timeout)).await {
        Ok(_locks) => panic!("another manager's group must not take a held key"),
        Err(error) => {
            assert_timeout_error(&error, &keys[1], timeout, "another manager's group");
            assert!(!error.is_held_by_this_manager(), "{error}");
        }
    }
    assert_eq!(other.held_lock_count(), 0);
    must_release(held, "the middle key").await;
}
