//! Cases of release that no one calls: a failing or panicking `with_lock` body, a
//! dropped guard, an aborted holder task.

use uuid::Uuid;

use super::Harness;
use super::fixtures::{
    WAIT, bounded, eventually, eventually_acquirable, join, must_acquire, must_be_busy,
    must_release, must_take, unique_key,
};
use locks_port::{DistributedLock, LockRegistry};

/// The error the body of [`with_lock_releases_on_error_and_returns_it`] fails with.
#[derive(Debug, PartialEq, Eq)]
struct BodyFailed(Uuid);

/// (3) `with_lock` releases the lock when its body fails, and hands back that same
/// error unchanged; another manager can take the key at once.
pub async fn with_lock_releases_on_error_and_returns_it<H: Harness>(harness: &H) {
    let manager = harness.manager();
    let key = unique_key("with_lock_releases_on_error_and_returns_it");
    let marker = Uuid::new_v4();
    let result = manager
        .with_lock(&key, bounded(WAIT), move |_| async move {
            Err::<(), _>(BodyFailed(marker))
        })
        .await;
    match result {
        Ok(Err(error)) => assert_eq!(
            error,
            BodyFailed(marker),
            "with_lock must hand back the body's own error unchanged"
        ),
        Ok(Ok(())) => panic!("with_lock turned the body's error into success"),
        Err(error) => panic!("with_lock of a free key failed to acquire: {error}"),
    }
    assert!(
        !manager.is_held(&key),
        "with_lock must release the lock when its body fails"
    );
    assert_eq!(manager.held_lock_count(), 0);
    let other = harness.manager();
    let guard = must_take(
        &other,
        &key,
        "with_lock must release the lock when its body fails (another manager tried the key)",
    )
    .await;
    must_release(guard, "with_lock error").await;
}

/// Dropping a guard releases its lock (possibly asynchronously) and removes it from
/// the manager's bookkeeping.
pub async fn dropped_guard_releases<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("dropped_guard_releases");
    let guard = must_acquire(&a, &key, "acquire of a free key").await;
    must_be_busy(&b, &key, "the key is held").await;
    drop(guard);
    eventually(
        || !a.is_held(&key) && a.held_lock_count() == 0,
        "a dropped guard's lock must leave the manager's bookkeeping",
    )
    .await;
    let guard = eventually_acquirable(&b, &key, "a dropped guard must release its lock").await;
    must_release(guard, "dropped guard").await;
}

/// A body that panics inside `with_lock` still releases the lock (the guard is
/// dropped while unwinding).
pub async fn with_lock_releases_when_body_panics<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("with_lock_releases_when_body_panics");
    let task = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move {
            a.with_lock(&key, bounded(WAIT), |_| async { panic_in_body() })
                .await
        })
    };
    match task.await {
        Err(error) if error.is_panic() => {}
        Err(error) => panic!("the task of the case did not finish: {error}"),
        Ok(Ok(())) => panic!("the body's panic was swallowed"),
        Ok(Err(error)) => panic!("with_lock of a free key failed to acquire: {error}"),
    }
    let guard = eventually_acquirable(&b, &key, "a panicking body must release its lock").await;
    eventually(
        || !a.is_held(&key) && a.held_lock_count() == 0,
        "a panicking body's lock must leave the manager's bookkeeping",
    )
    .await;
    must_release(guard, "panicking body").await;
}

/// The body of [`with_lock_releases_when_body_panics`].
fn panic_in_body() {
    panic!(
        "deliberate panic in a lock body (conformance case with_lock_releases_when_body_panics)"
    );
}

/// Aborting the task that holds a guard releases the lock (the Python library's "release on
/// cancellation of the holding task").
pub async fn aborted_holder_task_releases<H: Harness>(harness: &H) {
    let a = harness.manager();
    let b = harness.manager();
    let key = unique_key("aborted_holder_task_releases");
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel();
    let task = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let _guard = must_acquire(&a, &key, "acquire of a free key").await;
            let _ = acquired_tx.send(());
            std::future::pending::<()>().await;
        })
    };
    if acquired_rx.await.is_err() {
        join(task).await;
        panic!("the holder task ended without acquiring");
    }
    must_be_busy(&b, &key, "the holder task holds the key").await;
    task.abort();
    let _ = task.await;
    let guard =
        eventually_acquirable(&b, &key, "aborting the holding task must release its lock").await;
    eventually(
        || !a.is_held(&key) && a.held_lock_count() == 0,
        "an aborted holder's lock must leave the manager's bookkeeping",
    )
    .await;
    must_release(guard, "aborted holder").await;
}
