//! The fixtures the cases share: unique keys, acquisitions that must succeed or must
//! find the key busy, polling for asynchronous releases, and the timeout error's checks.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use uuid::Uuid;

use super::RELEASE_GRACE;
use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockAcquisitionError, LockGuard,
    LockInfo, ReleaseOutcome,
};

/// The timeout of acquisitions that are expected to succeed.
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// A key no other test run uses.
pub(crate) fn unique_key(case: &str) -> String {
    format!("conformance:{case}:{}", Uuid::new_v4())
}

pub(crate) fn bounded(timeout: Duration) -> AcquireOptions {
    AcquireOptions::new().with_timeout(timeout)
}

/// Acquires a key that must become available within [`WAIT`].
pub(crate) async fn must_acquire<M: DistributedLock>(
    manager: &M,
    key: &str,
    why: &str,
) -> M::Guard {
    match manager.acquire(key, bounded(WAIT)).await {
        Ok(guard) => guard,
        Err(error) => panic!("{why}: acquire({key:?}) failed: {error}"),
    }
}

/// Takes a key that must be free right now.
pub(crate) async fn must_take<M: DistributedLock>(manager: &M, key: &str, why: &str) -> M::Guard {
    match manager.try_acquire(key).await {
        Ok(Some(guard)) => guard,
        Ok(None) => panic!("{why}: try_acquire({key:?}) found the key held"),
        Err(error) => panic!("{why}: try_acquire({key:?}) failed: {error}"),
    }
}

/// Checks that a key is held by someone right now.
pub(crate) async fn must_be_busy<M: DistributedLock>(manager: &M, key: &str, why: &str) {
    match manager.try_acquire(key).await {
        Ok(None) => {}
        Ok(Some(_guard)) => panic!("{why}: try_acquire({key:?}) got a lock that should be held"),
        Err(error) => panic!("{why}: try_acquire({key:?}) failed: {error}"),
    }
}

/// Polls `try_acquire` until the key is free, for up to [`RELEASE_GRACE`].
pub(crate) async fn eventually_acquirable<M: DistributedLock>(
    manager: &M,
    key: &str,
    why: &str,
) -> M::Guard {
    let deadline = Instant::now() + RELEASE_GRACE;
    loop {
        match manager.try_acquire(key).await {
            Ok(Some(guard)) => return guard,
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(None) => panic!("{why}: {key:?} was still held after {RELEASE_GRACE:?}"),
            Err(error) => panic!("{why}: try_acquire({key:?}) failed: {error}"),
        }
    }
}

/// Polls a local condition for up to [`RELEASE_GRACE`].
pub(crate) async fn eventually(mut condition: impl FnMut() -> bool, why: &str) {
    let deadline = Instant::now() + RELEASE_GRACE;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "{why} (still not true after {RELEASE_GRACE:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Joins a task, re-raising its panic so the case fails with the task's message.
pub(crate) async fn join<T>(task: JoinHandle<T>) -> T {
    match task.await {
        Ok(value) => value,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => panic!("a task of the case did not finish: {error}"),
    }
}

pub(crate) async fn must_release<G: LockGuard>(guard: G, why: &str) {
    let key = guard.info().key().to_owned();
    let outcome = guard.release().await;
    assert_eq!(
        outcome,
        ReleaseOutcome::Unlocked,
        "{why}: releasing the guard of {key:?} must unlock it"
    );
}

pub(crate) fn assert_timeout_error(
    error: &LockAcquisitionError,
    key: &str,
    timeout: Duration,
    why: &str,
) {
    assert!(
        !error.is_permit(),
        "{why}: a lock's error must speak of a lock"
    );
    assert_timeout_error_of(error, key, timeout, why, "Failed to acquire lock");
}

/// The error of a wait that timed out on a key the asking manager holds itself (as
/// `held`, its guard's info, says): a timeout still, whose message names this manager
/// as the holder with the guard's mode, holder id and grant time, and the fix.
pub(crate) fn assert_held_here_error(
    error: &LockAcquisitionError,
    held: &LockInfo,
    timeout: Duration,
    why: &str,
) {
    let key = held.key();
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::Timeout,
        "{why}: {error:?}"
    );
    assert!(error.is_timeout(), "{why}: is_timeout() must stay true");
    assert_eq!(error.timeout(), Some(timeout), "{why}: the call's timeout");
    assert_eq!(error.key(), key, "{why}: the error must name the key");
    assert!(
        error.is_held_by_this_manager(),
        "{why}: the error must say this manager holds the key: {error}"
    );
    let holder = held.holder_id().map_or_else(
        || "no holder id".to_owned(),
        |id| format!("holder id {id:?}"),
    );
    let message = error.to_string();
    let words = format!(
        "Failed to acquire lock '{key}': {}: this manager holds '{key}' itself ({}, {holder}, \
         since {}T",
        locks_port::timeout_reason(timeout),
        held.mode().as_str(),
        held.acquired_at().date(),
    );
    assert!(
        message.starts_with(&words) && message.ends_with("Z): release that guard first"),
        "{why}: {message:?} must say this manager holds the key, and the fix"
    );
    // The grant's time to the microsecond, as the port writes it (its own tests hold
    // that format): the adapter passed its guard's own time, mode and holder id.
    let expected = LockAcquisitionError::timed_out(key, timeout)
        .held_by_this_manager(held.mode(), held.acquired_at(), held.holder_id())
        .to_string();
    assert_eq!(message, expected, "{why}");
}

/// [`assert_timeout_error`] for a semaphore's permit: the message speaks of a permit.
pub(crate) fn assert_permit_timeout_error(
    error: &LockAcquisitionError,
    name: &str,
    timeout: Duration,
    why: &str,
) {
    assert!(
        error.is_permit(),
        "{why}: a permit's error must speak of a permit"
    );
    let subject = "Failed to acquire a permit of semaphore";
    assert_timeout_error_of(error, name, timeout, why, subject);
}

fn assert_timeout_error_of(
    error: &LockAcquisitionError,
    key: &str,
    timeout: Duration,
    why: &str,
    subject: &str,
) {
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::Timeout,
        "{why}: a wait that outlasts its timeout must fail with kind Timeout, got {error:?}"
    );
    assert!(error.is_timeout(), "{why}: is_timeout() must be true");
    assert_eq!(
        error.timeout(),
        Some(timeout),
        "{why}: the error must carry the timeout of the call"
    );
    assert_eq!(error.key(), key, "{why}: the error must name the key");
    assert!(
        error.reason().contains("Timeout"),
        "{why}: the reason must say Timeout, got {:?}",
        error.reason()
    );
    assert_eq!(
        error.to_string(),
        format!("{subject} '{key}': {}", locks_port::timeout_reason(timeout)),
        "{why}: the message must be the Python `eventsource` library's"
    );
}
