//! Cases of shared (reader) locks beside exclusive ones.

use std::time::Duration;

use super::Harness;
use super::fixtures::{
    WAIT, assert_timeout_error, bounded, eventually_acquirable, join, must_acquire, must_release,
    unique_key,
};
use locks_port::{
    AcquireOptions, DistributedLock, LockError, LockGuard, LockMode, LockRegistry, LostReason,
};

async fn must_try<M: DistributedLock>(
    manager: &M,
    key: &str,
    mode: LockMode,
    why: &str,
) -> Option<M::Guard> {
    manager
        .try_acquire_with(key, mode)
        .await
        .unwrap_or_else(|error| {
            panic!("{why}: try_acquire_with({key:?}, {mode:?}) failed: {error}")
        })
}

/// `manager`'s try of `key` in `mode` must be refused (`why`: who must stay out).
async fn must_refuse<M: DistributedLock>(manager: &M, key: &str, mode: LockMode, why: &str) {
    assert!(must_try(manager, key, mode, why).await.is_none(), "{why}");
}

/// `manager` acquires `key` shared (`why`: which holder this is).
async fn must_read<M: DistributedLock>(manager: &M, key: &str, why: &str) -> M::Guard {
    manager
        .acquire(key, AcquireOptions::new().with_mode(LockMode::Shared))
        .await
        .unwrap_or_else(|error| panic!("{why}: acquire shared of {key:?} failed: {error}"))
}

/// `held`'s try-upgrade, which must not fail (`why`: the situation); its answer, and
/// the guard's mode must say it.
async fn must_try_upgrade<G: LockGuard>(held: &mut G, why: &str) -> bool {
    let upgraded = held
        .try_upgrade()
        .await
        .unwrap_or_else(|error| panic!("upgrading {why}: {error}"));
    let mode = match upgraded {
        true => LockMode::Exclusive,
        false => LockMode::Shared,
    };
    assert_eq!(held.info().mode(), mode, "upgrading {why}");
    assert!(!held.is_lost(), "upgrading {why}: the lock is still held");
    upgraded
}

/// Shared holders hold one key together and keep an exclusive holder out until the
/// last of them releases; the info says the mode.
pub async fn shared_holders_coexist<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let c = harness.manager();
    let key = unique_key("shared_holders_coexist");
    let first = a
        .acquire(&key, AcquireOptions::shared().with_timeout(WAIT))
        .await
        .expect("a shared acquire of a free key");
    assert_eq!(first.info().mode(), LockMode::Shared);
    let second = must_try(&b, &key, LockMode::Shared, "a second reader")
        .await
        .expect("a second shared holder must get in beside the first");
    assert_eq!(second.info().mode(), LockMode::Shared);
    must_refuse(
        &c,
        &key,
        LockMode::Exclusive,
        "an exclusive try must be refused while readers hold the key",
    )
    .await;
    assert!(c.try_acquire(&key).await.expect("try_acquire").is_none());
    must_release(first, "first reader").await;
    must_refuse(
        &c,
        &key,
        LockMode::Exclusive,
        "one reader left must still keep a writer out",
    )
    .await;
    must_release(second, "second reader").await;
    let writer = eventually_acquirable(&c, &key, "a writer after the readers").await;
    assert_eq!(writer.info().mode(), LockMode::Exclusive);
    must_release(writer, "writer").await;
}

/// One manager that takes a key shared twice holds it twice: each guard is its own
/// hold, releasing one leaves the other held and untold, the manager counts both, and
/// its `release(key)` ends both. (The memory double once booked one entry a key: the
/// second hold displaced the first, telling its guard the lock was lost.)
pub async fn one_manager_holds_a_key_shared_twice<H: Harness>(harness: &H) {
    let a = harness.manager();
    let c = harness.manager();
    let key = unique_key("one_manager_holds_a_key_shared_twice");
    let first = must_read(&a, &key, "the first hold").await;
    let second = must_read(&a, &key, "the second hold, by the same manager").await;
    assert!(
        !first.is_lost(),
        "the second hold must not take the first's place"
    );
    assert_eq!(a.held_lock_count(), 2, "two holds of one key");
    must_release(second, "the second hold").await;
    assert!(!first.is_lost(), "releasing one hold leaves the other");
    assert!(a.is_held(&key));
    must_refuse(
        &c,
        &key,
        LockMode::Exclusive,
        "the first hold still keeps a writer out",
    )
    .await;
    let again = must_read(&a, &key, "a hold again").await;
    a.release(&key).await.expect("release(key) while held");
    assert_eq!(
        a.held_lock_count(),
        0,
        "release(key) ends every hold of the key"
    );
    assert_eq!(first.lost().await, LostReason::Released);
    assert_eq!(again.lost().await, LostReason::Released);
    let writer = eventually_acquirable(&c, &key, "a writer after both holds").await;
    must_release(writer, "writer").await;
}

/// An exclusive holder keeps shared requests out: a shared try gives none and a
/// bounded shared wait times out.
pub async fn exclusive_excludes_shared<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("exclusive_excludes_shared");
    let writer = must_acquire(&a, &key, "acquire of a free key").await;
    must_refuse(
        &b,
        &key,
        LockMode::Shared,
        "a shared try must be refused while a writer holds the key",
    )
    .await;
    let timeout = Duration::from_millis(100);
    match b
        .acquire(&key, bounded(timeout).with_mode(LockMode::Shared))
        .await
    {
        Ok(_guard) => panic!("a shared acquire got a key held exclusively"),
        Err(error) => assert_timeout_error(&error, &key, timeout, "a shared wait on a writer"),
    }
    must_release(writer, "writer").await;
    let reader = b
        .acquire(&key, bounded(WAIT).with_mode(LockMode::Shared))
        .await
        .expect("a shared acquire after the writer");
    must_release(reader, "reader").await;
}

/// A writer queued behind a reader is not starved by readers that come after it: they
/// cannot join the reader (a shared try gives none) and are served after the writer.
pub async fn queued_writer_is_not_starved<H: Harness>(harness: &H) {
    let reader = harness.manager();
    let writer = harness.manager();
    let late_reader = harness.manager();
    let key = unique_key("queued_writer_is_not_starved");
    let first = reader
        .acquire(&key, AcquireOptions::shared().with_timeout(WAIT))
        .await
        .expect("a shared acquire of a free key");
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let task = |manager: H::Manager, name: &'static str, mode: LockMode| {
        let key = key.clone();
        let order = std::sync::Arc::clone(&order);
        tokio::spawn(async move {
            let guard = manager
                .acquire(&key, bounded(WAIT).with_mode(mode))
                .await
                .unwrap_or_else(|error| panic!("{name}: {error}"));
            order.lock().expect("order").push(name);
            tokio::time::sleep(Duration::from_millis(50)).await;
            must_release(guard, name).await;
        })
    };
    let queued_writer = task(writer, "writer", LockMode::Exclusive);
    tokio::time::sleep(Duration::from_millis(300)).await;
    must_refuse(
        &late_reader,
        &key,
        LockMode::Shared,
        "a reader arriving after a queued writer must not jump ahead of it",
    )
    .await;
    let queued_reader = task(late_reader, "late reader", LockMode::Shared);
    tokio::time::sleep(Duration::from_millis(300)).await;
    must_release(first, "first reader").await;
    join(queued_writer).await;
    join(queued_reader).await;
    assert_eq!(
        *order.lock().expect("order"),
        ["writer", "late reader"],
        "the queued writer must be served before the reader that came after it"
    );
}

/// A downgraded lock lets readers in beside it and keeps writers out until it is
/// released; its info says shared, and downgrading it again changes nothing.
pub async fn downgrade_lets_readers_in_and_keeps_writers_out<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let c = harness.manager();
    let key = unique_key("downgrade_lets_readers_in_and_keeps_writers_out");
    let mut held = must_acquire(&a, &key, "acquire of a free key").await;
    must_refuse(
        &b,
        &key,
        LockMode::Shared,
        "a shared try must be refused while the key is held exclusively",
    )
    .await;
    held.downgrade()
        .await
        .unwrap_or_else(|error| panic!("downgrading a held exclusive lock: {error}"));
    assert_eq!(held.info().mode(), LockMode::Shared);
    assert!(!held.is_lost(), "a downgraded lock is still held");
    assert!(
        a.is_held(&key),
        "the manager still holds the downgraded key"
    );
    let reader = must_try(&b, &key, LockMode::Shared, "a reader after the downgrade")
        .await
        .expect("a reader must get in beside a downgraded lock");
    must_refuse(
        &c,
        &key,
        LockMode::Exclusive,
        "a writer must stay out while the downgraded lock is held",
    )
    .await;
    held.downgrade()
        .await
        .unwrap_or_else(|error| panic!("downgrading a shared lock: {error}"));
    assert_eq!(held.info().mode(), LockMode::Shared);
    must_release(held, "the downgraded lock").await;
    must_refuse(
        &c,
        &key,
        LockMode::Exclusive,
        "the reader left must still keep a writer out",
    )
    .await;
    must_release(reader, "reader").await;
    let writer = eventually_acquirable(&c, &key, "a writer after both readers").await;
    must_release(writer, "writer").await;
}

/// A downgrade lets no queued writer in: it stays queued until the downgraded lock is
/// released, and readers that come after it wait behind it. A reader queued before any
/// writer gets in at the downgrade.
pub async fn downgrade_keeps_a_queued_writer_waiting<H: Harness>(harness: &H) {
    let holder = harness.manager();
    let reader = harness.manager();
    let writer = harness.manager();
    let late_reader = harness.manager();
    let key = unique_key("downgrade_keeps_a_queued_writer_waiting");
    let mut held = must_acquire(&holder, &key, "acquire of a free key").await;
    let queued_reader = {
        let key = key.clone();
        tokio::spawn(async move {
            let guard = reader
                .acquire(&key, bounded(WAIT).with_mode(LockMode::Shared))
                .await
                .unwrap_or_else(|error| panic!("the queued reader: {error}"));
            assert_eq!(guard.info().mode(), LockMode::Shared);
            guard
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.downgrade()
        .await
        .unwrap_or_else(|error| panic!("downgrading with a reader queued: {error}"));
    let early = tokio::time::timeout(WAIT, join(queued_reader))
        .await
        .expect("the reader queued before the downgrade must get in beside it");
    let queued_writer = {
        let key = key.clone();
        tokio::spawn(async move {
            let guard = writer
                .acquire(&key, bounded(WAIT))
                .await
                .unwrap_or_else(|error| panic!("the queued writer: {error}"));
            must_release(guard, "the queued writer").await;
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !queued_writer.is_finished(),
        "a writer must wait while the downgraded lock and a reader hold the key"
    );
    must_refuse(
        &late_reader,
        &key,
        LockMode::Shared,
        "a reader arriving after a queued writer must not jump ahead of it",
    )
    .await;
    must_release(early, "the early reader").await;
    must_release(held, "the downgraded lock").await;
    join(queued_writer).await;
}

/// A downgrade with a writer already queued for the key keeps the lock: the holder's
/// own shared request goes ahead of the writer it keeps waiting (on PostgreSQL, a
/// session never queues behind a waiter that waits for the session itself). The writer
/// stays queued, a reader arriving after it waits behind it, and the writer gets the
/// key once the downgraded lock is released.
pub async fn downgrade_with_a_writer_queued_keeps_the_lock<H: Harness>(harness: &H) {
    let holder = harness.manager();
    let writer = harness.manager();
    let late_reader = harness.manager();
    let key = unique_key("downgrade_with_a_writer_queued_keeps_the_lock");
    let mut held = must_acquire(&holder, &key, "acquire of a free key").await;
    let queued_writer = {
        let key = key.clone();
        tokio::spawn(async move {
            let guard = writer
                .acquire(&key, bounded(WAIT))
                .await
                .unwrap_or_else(|error| panic!("the queued writer: {error}"));
            must_release(guard, "the queued writer").await;
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.downgrade()
        .await
        .unwrap_or_else(|error| panic!("downgrading with a writer queued: {error}"));
    assert_eq!(held.info().mode(), LockMode::Shared);
    assert!(
        !held.is_lost(),
        "a lock downgraded with a writer queued is still held"
    );
    assert!(
        holder.is_held(&key),
        "the manager still holds the downgraded key"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !queued_writer.is_finished(),
        "the queued writer must wait while the downgraded lock is held"
    );
    must_refuse(
        &late_reader,
        &key,
        LockMode::Shared,
        "a reader arriving after the queued writer must not jump ahead of it",
    )
    .await;
    must_release(held, "the downgraded lock").await;
    join(queued_writer).await;
}

/// Downgrading a lock the manager no longer holds (taken by `release(key)`) fails as
/// lost, with the reason its signal gives, and changes nothing.
pub async fn downgrade_of_a_lock_no_longer_held_fails<H: Harness>(harness: &H) {
    let case = "downgrade_of_a_lock_no_longer_held_fails";
    change_of_a_lock_no_longer_held_fails(harness, case, LockMode::Exclusive, async |held| {
        held.downgrade().await
    })
    .await;
}

/// A mode change (`change`) of a lock held in `mode` and then taken by `release(key)`
/// fails as lost, with the reason its signal gives, and changes nothing: the guard
/// still says `mode`, and dropping it does not free the next holder's lock.
async fn change_of_a_lock_no_longer_held_fails<H: Harness>(
    harness: &H,
    case: &str,
    mode: LockMode,
    change: impl AsyncFnOnce(&mut <H::Manager as DistributedLock>::Guard) -> Result<(), LockError>,
) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key(case);
    let mut held = a
        .acquire(&key, AcquireOptions::new().with_mode(mode))
        .await
        .unwrap_or_else(|error| panic!("acquire {mode:?} of a free key: {error}"));
    a.release(&key).await.expect("release by key");
    match change(&mut held).await {
        Err(LockError::Lost(error)) => {
            assert_eq!(error.key(), key);
            assert_eq!(error.reason(), LostReason::Released);
        }
        other => panic!("{case}: changing a released lock must fail as lost, got {other:?}"),
    }
    assert_eq!(held.info().mode(), mode);
    let writer = eventually_acquirable(&b, &key, "a writer after the release").await;
    drop(held);
    let c = harness.manager();
    must_refuse(
        &c,
        &key,
        LockMode::Shared,
        "dropping the stale guard must not free the writer's lock",
    )
    .await;
    must_release(writer, "writer").await;
}

/// A reader alone on a key upgrades at once: the guard says exclusive, readers and
/// writers stay out, and the release frees the key. An exclusive lock's try-upgrade is
/// `true` and changes nothing.
pub async fn try_upgrade_of_a_lone_reader_makes_it_exclusive<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("try_upgrade_of_a_lone_reader_makes_it_exclusive");
    let mut held = must_read(&a, &key, "a reader of a free key").await;
    let upgraded = must_try_upgrade(&mut held, "a lone reader").await;
    assert!(upgraded, "a reader alone on its key must upgrade");
    assert!(a.is_held(&key), "the manager still holds the upgraded key");
    must_refuse(
        &b,
        &key,
        LockMode::Shared,
        "a reader must stay out of an upgraded lock",
    )
    .await;
    must_refuse(
        &b,
        &key,
        LockMode::Exclusive,
        "a writer must stay out of an upgraded lock",
    )
    .await;
    let again = must_try_upgrade(&mut held, "an exclusive lock").await;
    assert!(again, "an exclusive lock's try-upgrade is true");
    must_release(held, "the upgraded lock").await;
    let reader = eventually_acquirable(&b, &key, "a writer after the release").await;
    must_release(reader, "the writer").await;
}

/// Beside another reader the try-upgrade says no and changes nothing: the lock is still
/// held shared (a third reader gets in, a writer does not). Once the other reader has
/// left, it upgrades.
pub async fn try_upgrade_beside_another_reader_says_no<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let c = harness.manager();
    let key = unique_key("try_upgrade_beside_another_reader_says_no");
    let mut held = must_read(&a, &key, "a reader of a free key").await;
    let other = must_read(&b, &key, "a second reader").await;
    let upgraded = must_try_upgrade(&mut held, "beside another reader").await;
    assert!(!upgraded, "a reader beside another one must not upgrade");
    let third = must_try(&c, &key, LockMode::Shared, "a third reader")
        .await
        .expect("the lock whose upgrade was refused must still be shared");
    must_refuse(
        &c,
        &key,
        LockMode::Exclusive,
        "a writer must stay out while the readers hold the key",
    )
    .await;
    must_release(other, "the second reader").await;
    must_release(third, "the third reader").await;
    let upgraded = must_try_upgrade(&mut held, "once alone").await;
    assert!(upgraded, "a reader left alone must upgrade");
    must_refuse(
        &c,
        &key,
        LockMode::Shared,
        "a reader must stay out of an upgraded lock",
    )
    .await;
    must_release(held, "the upgraded lock").await;
}

/// With a writer queued for the key, the try-upgrade never waits: it says no (the
/// writer goes first: PostgreSQL 13 to 16, the in-memory double) or upgrades ahead of
/// the writer (PostgreSQL 17 and later); either way the guard says the mode it holds,
/// the lock is kept, a reader stays out of an upgraded lock, and the writer waits while
/// the lock is held and gets the key once it is released.
pub async fn try_upgrade_with_a_writer_queued_never_waits<H: Harness>(harness: &H) {
    let holder = harness.manager();
    let writer = harness.manager();
    let reader = harness.manager();
    let key = unique_key("try_upgrade_with_a_writer_queued_never_waits");
    let mut held = must_read(&holder, &key, "a reader of a free key").await;
    let queued_writer = {
        let key = key.clone();
        tokio::spawn(async move {
            let guard = writer
                .acquire(&key, bounded(WAIT))
                .await
                .unwrap_or_else(|error| panic!("the queued writer: {error}"));
            assert_eq!(guard.info().mode(), LockMode::Exclusive);
            must_release(guard, "the queued writer").await;
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let upgraded = tokio::time::timeout(WAIT, must_try_upgrade(&mut held, "with a writer queued"))
        .await
        .expect("a try-upgrade with a writer queued must not wait");
    if upgraded {
        must_refuse(
            &reader,
            &key,
            LockMode::Shared,
            "a reader must stay out of an upgraded lock",
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !queued_writer.is_finished(),
        "the queued writer must wait while the lock is held (upgraded: {upgraded})"
    );
    must_release(held, "the reader").await;
    join(queued_writer).await;
}

/// Upgrading a lock the manager no longer holds (taken by `release(key)`) fails as
/// lost, with the reason its signal gives, and changes nothing.
pub async fn try_upgrade_of_a_lock_no_longer_held_fails<H: Harness>(harness: &H) {
    let case = "try_upgrade_of_a_lock_no_longer_held_fails";
    change_of_a_lock_no_longer_held_fails(harness, case, LockMode::Shared, async |held| {
        held.try_upgrade().await.map(|_| ())
    })
    .await;
}
