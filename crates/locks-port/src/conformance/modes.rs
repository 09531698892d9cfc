//! Cases of shared (reader) locks beside exclusive ones.

use std::time::Duration;

use super::Harness;
use super::fixtures::{
    WAIT, assert_timeout_error, bounded, eventually_acquirable, join, must_acquire, must_release,
    unique_key,
};
use crate::{AcquireOptions, DistributedLock, LockGuard, LockMode};

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
    assert!(
        must_try(&c, &key, LockMode::Exclusive, "a writer")
            .await
            .is_none(),
        "an exclusive try must be refused while readers hold the key"
    );
    assert!(c.try_acquire(&key).await.expect("try_acquire").is_none());
    must_release(first, "first reader").await;
    assert!(
        must_try(&c, &key, LockMode::Exclusive, "a writer")
            .await
            .is_none(),
        "one reader left must still keep a writer out"
    );
    must_release(second, "second reader").await;
    let writer = eventually_acquirable(&c, &key, "a writer after the readers").await;
    assert_eq!(writer.info().mode(), LockMode::Exclusive);
    must_release(writer, "writer").await;
}

/// An exclusive holder keeps shared requests out: a shared try gives none and a
/// bounded shared wait times out.
pub async fn exclusive_excludes_shared<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("exclusive_excludes_shared");
    let writer = must_acquire(&a, &key, "acquire of a free key").await;
    assert!(
        must_try(&b, &key, LockMode::Shared, "a reader")
            .await
            .is_none(),
        "a shared try must be refused while a writer holds the key"
    );
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
    assert!(
        must_try(&late_reader, &key, LockMode::Shared, "a late reader")
            .await
            .is_none(),
        "a reader arriving after a queued writer must not jump ahead of it"
    );
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
