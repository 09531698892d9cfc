//! Cases of what an acquisition gives and what a manager's bookkeeping says: the lock's
//! info, `is_held` and `held_lock_count`, `try_acquire`, independent keys.

use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use super::Harness;
use super::fixtures::{
    WAIT, bounded, must_acquire, must_be_busy, must_release, must_take, unique_key,
};
use locks_port::{AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, lock_id};

/// How far `acquired_at` may be from the local clock.
const CLOCK_SLACK: time::Duration = time::Duration::seconds(5);
/// (1) `acquire` yields a [`LockInfo`](locks_port::LockInfo) for the requested key: the key,
/// its derived lock id, and an `acquired_at` of now in UTC. `with_lock` hands the body
/// the same.
pub async fn acquire_yields_info_for_the_key<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let odd = format!("conformance:é 'quoted' \"; --:{}", Uuid::new_v4());
    for key in [unique_key("acquire_yields_info_for_the_key"), odd] {
        let before = OffsetDateTime::now_utc();
        let guard = must_acquire(&manager, &key, "acquire of a free key").await;
        let after = OffsetDateTime::now_utc();
        let info = guard.info().clone();
        assert_eq!(info.key(), key, "LockInfo::key must be the requested key");
        assert_eq!(
            info.lock_id(),
            lock_id(&key),
            "LockInfo::lock_id must be locks_port::lock_id(key) (sha256-v1)"
        );
        assert!(
            info.acquired_at() >= before - CLOCK_SLACK && info.acquired_at() <= after + CLOCK_SLACK,
            "LockInfo::acquired_at must be the time of acquisition: {} is not within {CLOCK_SLACK} of [{before}, {after}]",
            info.acquired_at()
        );
        assert_eq!(
            info.acquired_at().offset(),
            time::UtcOffset::UTC,
            "LockInfo::acquired_at must be in UTC"
        );
        must_release(guard, "acquire yields info").await;

        let from_body = manager
            .with_lock(&key, bounded(WAIT), |info| async move { info })
            .await
            .unwrap_or_else(|error| panic!("with_lock of a free key failed: {error}"));
        assert_eq!(
            from_body.key(),
            key,
            "with_lock must hand the body the info of the requested key"
        );
        assert_eq!(from_body.lock_id(), lock_id(&key));
    }
}

/// (2) `is_held` is true while the lock is held (through a guard or inside
/// `with_lock`) and false after it is released; `held_lock_count` follows.
pub async fn is_held_inside_and_not_after<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let key = unique_key("is_held_inside_and_not_after");
    assert!(
        !manager.is_held(&key),
        "is_held must be false before acquire"
    );
    assert_eq!(manager.held_lock_count(), 0, "a new manager holds nothing");

    let guard = must_acquire(&manager, &key, "acquire of a free key").await;
    assert!(
        manager.is_held(&key),
        "is_held must be true while a guard holds the key"
    );
    assert_eq!(
        manager.held_lock_count(),
        1,
        "held_lock_count must count a guard's lock"
    );
    must_release(guard, "is_held").await;
    assert!(
        !manager.is_held(&key),
        "is_held must be false after the guard is released"
    );
    assert_eq!(
        manager.held_lock_count(),
        0,
        "held_lock_count after release"
    );

    let inside = {
        let manager_in_body = manager.clone();
        let key_in_body = key.clone();
        manager
            .with_lock(&key, bounded(WAIT), move |_| async move {
                (
                    manager_in_body.is_held(&key_in_body),
                    manager_in_body.held_lock_count(),
                )
            })
            .await
            .unwrap_or_else(|error| panic!("with_lock of a free key failed: {error}"))
    };
    assert_eq!(
        inside,
        (true, 1),
        "inside with_lock, is_held must be true and held_lock_count 1"
    );
    assert!(
        !manager.is_held(&key),
        "is_held must be false after with_lock returns"
    );
    assert_eq!(
        manager.held_lock_count(),
        0,
        "held_lock_count after with_lock"
    );
}

/// (4) `try_acquire` takes a free key and gives `None` for a held one, whether the
/// holder is the same manager or another one; it never waits.
pub async fn try_acquire_takes_free_and_refuses_held<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("try_acquire_takes_free_and_refuses_held");
    let guard = must_take(&a, &key, "try_acquire of a free key must succeed").await;
    must_be_busy(
        &a,
        &key,
        "try_acquire of a key the same manager holds must give None",
    )
    .await;
    must_be_busy(
        &b,
        &key,
        "try_acquire of a key another manager holds must give None",
    )
    .await;
    assert_eq!(
        a.held_lock_count(),
        1,
        "a refused try_acquire must not change the holder's bookkeeping"
    );
    assert!(a.is_held(&key));
    assert_eq!(
        b.held_lock_count(),
        0,
        "a refused try_acquire must not count as held"
    );
    assert!(!b.is_held(&key));
    must_release(guard, "try_acquire").await;

    let guard = must_take(&b, &key, "try_acquire of a released key must succeed").await;
    must_be_busy(
        &a,
        &key,
        "try_acquire of a key another manager holds must give None",
    )
    .await;
    must_release(guard, "try_acquire").await;
}

/// (8) Locks on different keys are independent.
pub async fn different_keys_are_independent<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let [k1, k2, k3] = ["1", "2", "3"].map(|n| unique_key(&format!("independent-{n}")));
    let g1 = must_acquire(&a, &k1, "acquire of a free key").await;
    let g2 = must_take(&b, &k2, "a lock on another key must not block this one").await;
    let g3 = must_acquire(&a, &k3, "a manager may hold several keys").await;
    assert_eq!(
        a.held_lock_count(),
        2,
        "held_lock_count must count each key"
    );
    assert_eq!(b.held_lock_count(), 1);
    assert!(a.is_held(&k1) && a.is_held(&k3) && !a.is_held(&k2));
    assert!(b.is_held(&k2) && !b.is_held(&k1));
    // A wait that ends at its timeout, not at a grant. Its length is no contract: it
    // leaves room for opening a connection on a loaded machine (50 ms did not: an
    // adapter that opens one per wait answered `Unreachable` before it waited at all).
    match b.acquire(&k1, bounded(Duration::from_secs(1))).await {
        Ok(_guard) => panic!("a key held by another manager must stay exclusive"),
        Err(error) => assert!(error.is_timeout(), "expected a timeout, got {error}"),
    }
    must_release(g1, "independent keys").await;
    assert!(
        a.is_held(&k3),
        "releasing one key must leave the others held"
    );
    must_be_busy(&b, &k3, "releasing one key must leave the others held").await;
    must_release(g2, "independent keys").await;
    must_release(g3, "independent keys").await;
    assert_eq!(a.held_lock_count(), 0);
    assert_eq!(b.held_lock_count(), 0);
}

/// `is_held`, `held_lock_count`, `release` and `release_all` answer for one manager:
/// another manager neither sees nor can release its locks.
pub async fn bookkeeping_is_per_manager<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let c = harness.manager();
    let key = unique_key("bookkeeping_is_per_manager");
    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    assert!(
        !b.is_held(&key),
        "is_held must answer for this manager only"
    );
    assert_eq!(b.held_lock_count(), 0);
    let error = b
        .release(&key)
        .await
        .expect_err("release of a key another manager holds must fail with LockNotHeldError");
    assert_eq!(error.key(), key);
    assert_eq!(
        b.release_all().await,
        0,
        "release_all must not count other managers' locks"
    );
    assert!(a.is_held(&key));
    must_be_busy(
        &c,
        &key,
        "another manager's release must not free the holder's lock",
    )
    .await;
    must_release(guard, "per manager").await;
}

/// The empty key is refused by every acquisition (`InvalidKey`, nothing asked of the
/// backend, nothing held), while a key that merely ends empty (`"job:"`) is a key.
pub async fn empty_key_is_refused<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let error = manager
        .acquire("", Duration::from_secs(1))
        .await
        .expect_err("acquire(\"\") must be refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::InvalidKey, "{error}");
    assert_eq!(error.key(), "");
    let error = manager
        .try_acquire("")
        .await
        .expect_err("try_acquire(\"\") must be refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::InvalidKey, "{error}");
    let error = manager
        .with_lock("", Duration::from_secs(1), |_| async {})
        .await
        .expect_err("with_lock(\"\") must be refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::InvalidKey, "{error}");
    assert!(!manager.is_held(""));
    assert_eq!(manager.held_lock_count(), 0);
    let prefix = format!("{}:", unique_key("empty_key_is_refused"));
    let guard = must_acquire(&manager, &prefix, "a key ending in ':' is a key").await;
    assert_eq!(guard.info().lock_id(), lock_id(&prefix));
    must_release(guard, "a key ending in ':'").await;
}

/// `try_with_lock` runs the body when the key is free and gives its output; it skips
/// the body (`Ok(None)`) while another manager holds the key, and releases afterwards.
pub async fn try_with_lock_skips_a_held_key<H: Harness>(harness: &H) {
    let key = unique_key("try_with_lock_skips_a_held_key");
    let (manager, other) = (harness.manager(), harness.manager());
    let ran = manager
        .try_with_lock(&key, |info| async move { info.key().to_owned() })
        .await
        .expect("try_with_lock of a free key");
    assert_eq!(
        ran.as_deref(),
        Some(key.as_str()),
        "the body must run on a free key"
    );
    assert!(
        !manager.is_held(&key),
        "try_with_lock must release afterwards"
    );
    let holder = must_acquire(&other, &key, "the other holder").await;
    let skipped = manager
        .try_with_lock(&key, |_| async {
            panic!("the body must not run on a held key")
        })
        .await
        .expect("contention is not an error");
    assert!(skipped.is_none(), "a held key must be skipped");
    must_release(holder, "the other holder").await;
}
