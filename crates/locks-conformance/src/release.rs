//! Cases of explicit release: `release(key)`, `release_all` and a guard's `release`, and
//! what each reports.

use std::time::Duration;

use super::Harness;
use super::fixtures::{must_acquire, must_be_busy, must_release, must_take, unique_key};
use locks_port::{DistributedLock, LockGuard, LockRegistry, ReleaseOutcome};

/// (5) `release(key)` makes the key acquirable again, after `try_acquire` and
/// [`LockGuard::into_held`] as in the Python library; so does a guard's release.
pub async fn release_makes_key_acquirable_again<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("release_makes_key_acquirable_again");

    let guard = must_take(&a, &key, "try_acquire of a free key").await;
    let info = guard.into_held();
    assert_eq!(info.key(), key, "into_held must hand back the lock's info");
    assert!(
        a.is_held(&key),
        "after into_held the manager must still hold the key"
    );
    assert_eq!(a.held_lock_count(), 1);
    must_be_busy(&b, &key, "after into_held the lock must stay held").await;
    if let Err(error) = a.release(&key).await {
        panic!("release of a key held through into_held failed: {error}");
    }
    assert!(!a.is_held(&key), "is_held must be false after release(key)");
    assert_eq!(a.held_lock_count(), 0);
    let guard = must_take(&b, &key, "release(key) must make the key acquirable again").await;
    must_be_busy(&a, &key, "the key is now held by another manager").await;
    must_release(guard, "release").await;

    let guard = must_acquire(&a, &key, "acquire after the other manager released").await;
    must_be_busy(&b, &key, "acquired again").await;
    must_release(guard, "release").await;
    let guard = must_take(
        &b,
        &key,
        "a guard's release must make the key acquirable again",
    )
    .await;
    must_release(guard, "release").await;
}

/// (6) `release` of a key this manager does not hold fails with
/// [`LockNotHeldError`](locks_port::LockNotHeldError) naming the key, with the Python library's
/// message; so does a second release of the same key.
pub async fn release_of_unheld_key_fails<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let key = unique_key("release_of_unheld_key_fails");
    let error = manager
        .release(&key)
        .await
        .expect_err("release of a never-held key must fail with LockNotHeldError");
    assert_eq!(error.key(), key, "LockNotHeldError must name the key");
    assert_eq!(
        error.to_string(),
        format!("Lock '{key}' is not held by this session"),
        "LockNotHeldError's message must be the Python `eventsource` library's"
    );

    let guard = must_take(&manager, &key, "try_acquire of a free key").await;
    let _info = guard.into_held();
    if let Err(error) = manager.release(&key).await {
        panic!("release of a held key failed: {error}");
    }
    let error = manager
        .release(&key)
        .await
        .expect_err("a second release of the same key must fail with LockNotHeldError");
    assert_eq!(error.key(), key);
}

/// (9) `release_all` releases everything this manager holds (guards included) and
/// returns how many; it leaves other managers' locks alone; with nothing held it
/// returns 0. A guard whose lock it took reports
/// [`ReleaseOutcome::AlreadyReleased`] and does not disturb the key's next holder.
pub async fn release_all_returns_count_and_empties<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let c = harness.manager();
    let keys = ["1", "2", "3"].map(|n| unique_key(&format!("release_all-{n}")));
    let other = unique_key("release_all-other");

    assert_eq!(
        a.release_all().await,
        0,
        "release_all with nothing held must return 0"
    );
    let _ = must_take(&a, &keys[0], "try_acquire").await.into_held();
    let _ = must_take(&a, &keys[1], "try_acquire").await.into_held();
    let guard = must_acquire(&a, &keys[2], "acquire").await;
    let _ = must_take(&b, &other, "try_acquire").await.into_held();
    assert_eq!(
        a.held_lock_count(),
        3,
        "held_lock_count must count this manager's locks only (another manager holds one more)"
    );

    assert_eq!(
        a.release_all().await,
        3,
        "release_all must return how many locks it released"
    );
    assert_eq!(
        a.held_lock_count(),
        0,
        "release_all must empty the registry"
    );
    for key in &keys {
        assert!(!a.is_held(key), "is_held must be false after release_all");
    }
    let mut taken = Vec::new();
    for key in &keys {
        taken.push(must_take(&c, key, "release_all must free every lock it counted").await);
    }
    assert_eq!(
        guard.release().await,
        ReleaseOutcome::AlreadyReleased,
        "a guard whose lock release_all took must report AlreadyReleased"
    );
    must_be_busy(
        &b,
        &keys[2],
        "a stale guard's release must not free the key's next holder",
    )
    .await;

    assert!(
        b.is_held(&other),
        "release_all of one manager must leave another manager's locks alone"
    );
    assert_eq!(b.held_lock_count(), 1);
    must_be_busy(
        &c,
        &other,
        "release_all of one manager must leave another manager's locks held",
    )
    .await;
    assert_eq!(
        a.release_all().await,
        0,
        "a second release_all must find nothing"
    );
    assert_eq!(b.release_all().await, 1);
    let guard = must_take(&c, &other, "release_all must free the lock").await;
    must_release(guard, "release_all").await;
    for guard in taken {
        must_release(guard, "release_all").await;
    }
}

/// [`LockGuard::release`] says what happened: `Unlocked` for a held lock,
/// `AlreadyReleased` after `release(key)`; a stale guard never releases a newer
/// acquisition of the same key by the same manager.
pub async fn guard_release_reports_outcome<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("guard_release_reports_outcome");

    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    assert_eq!(
        guard.release().await,
        ReleaseOutcome::Unlocked,
        "releasing a held guard must report Unlocked"
    );

    let stale = must_acquire(&a, &key, "acquire of a released key").await;
    if let Err(error) = a.release(&key).await {
        panic!("release(key) of a key held through a guard failed: {error}");
    }
    assert!(!a.is_held(&key), "release(key) must release a guard's lock");
    let guard = must_take(&b, &key, "release(key) must free a guard's lock").await;
    assert_eq!(
        stale.release().await,
        ReleaseOutcome::AlreadyReleased,
        "a guard's release after release(key) must report AlreadyReleased"
    );
    must_be_busy(
        &a,
        &key,
        "a stale guard's release must not free another manager's lock",
    )
    .await;
    must_release(guard, "guard outcome").await;

    let stale = must_acquire(&a, &key, "acquire of a released key").await;
    if let Err(error) = a.release(&key).await {
        panic!("release(key) failed: {error}");
    }
    let current = must_acquire(&a, &key, "a new acquisition by the same manager").await;
    drop(stale);
    assert_eq!(
        stale_free_check(&a, &b, &key).await,
        (true, 1),
        "dropping a stale guard must not release the same manager's newer acquisition"
    );
    must_release(current, "guard outcome").await;
    assert_eq!(a.held_lock_count(), 0);
}

/// Whether `a` still holds `key` (and its count) after giving a stale guard's drop
/// time to do damage, checking with `b` that the key stays busy.
async fn stale_free_check<M: DistributedLock + LockRegistry>(
    a: &M,
    b: &M,
    key: &str,
) -> (bool, usize) {
    // An asynchronous release by drop would happen within this time.
    tokio::time::sleep(Duration::from_millis(200)).await;
    must_be_busy(
        b,
        key,
        "dropping a stale guard must not release the same manager's newer acquisition",
    )
    .await;
    (a.is_held(key), a.held_lock_count())
}
