//! The two traits of the port, split along the original's two consumer groups.

use std::fmt;
use std::future::Future;

use crate::{AcquireOptions, LockAcquisitionError, LockInfo, LockNotHeldError};

/// What an explicit release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The backend confirmed the unlock.
    Unlocked,
    /// Nothing was left to do: the lock was already released through
    /// [`DistributedLock::release`] or [`LockRegistry::release_all`].
    AlreadyReleased,
    /// The unlock failed or the backend said the lock was not held (for example, the
    /// session had been terminated). The session was closed instead, which frees
    /// whatever it held; the bookkeeping entry is gone either way.
    SessionClosed,
}

/// A held lock. Dropping it releases the lock; [`release`](LockGuard::release) does
/// the same and says what happened.
///
/// A guard only ever releases its own acquisition: after [`DistributedLock::release`]
/// or [`LockRegistry::release_all`] took its lock away, and even if the same manager
/// has acquired the key again since, the guard's release reports
/// [`ReleaseOutcome::AlreadyReleased`] and touches nothing.
///
/// Implementations are `#[must_use]`: a guard that is not bound to a variable is
/// dropped at once, and the lock with it.
pub trait LockGuard: Send + fmt::Debug {
    /// The lock this guard holds.
    fn info(&self) -> &LockInfo;

    /// Releases the lock now and reports how.
    ///
    /// Never fails: backend errors are logged and answered by closing the session.
    ///
    /// # Cancel safety
    /// Dropping the returned future part-way still releases the lock: at worst the
    /// session that held it is closed instead of unlocked.
    fn release(self) -> impl Future<Output = ReleaseOutcome> + Send;

    /// Stops managing the lock through this guard and leaves it held by the manager,
    /// like the original's `try_acquire`: it stays held until
    /// [`DistributedLock::release`] for its key or [`LockRegistry::release_all`].
    fn into_held(self) -> LockInfo;
}

/// Acquire and release string-keyed locks (the original's `DistributedLock`).
///
/// A second acquisition of a key the same manager already holds contends like any
/// other holder: [`try_acquire`](DistributedLock::try_acquire) gives `None`, and
/// [`acquire`](DistributedLock::acquire) waits for the first to be released.
pub trait DistributedLock: Send + Sync {
    /// The guard of a held lock.
    type Guard: LockGuard;

    /// Takes the lock for `key`, waiting as `options` say: forever by default, or up to
    /// a timeout (one attempt at least, so a zero timeout is exactly one try).
    ///
    /// # Errors
    /// [`LockAcquisitionError`]: a timeout (reason `Timeout after {s}s`), or a backend
    /// failure (reason `Database error: …`, the backend's error as source).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any await point leaves no lock held and
    /// nothing held on the manager's behalf.
    fn acquire(
        &self,
        key: &str,
        options: AcquireOptions,
    ) -> impl Future<Output = Result<Self::Guard, LockAcquisitionError>> + Send;

    /// Takes the lock for `key` if it is free right now; `Ok(None)` when it is held
    /// (by anyone, this manager included). Never waits for the lock.
    ///
    /// # Errors
    /// A backend failure, as [`LockAcquisitionError`] with the backend's error as
    /// source; contention is never an error.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](DistributedLock::acquire).
    fn try_acquire(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Self::Guard>, LockAcquisitionError>> + Send;

    /// Releases the lock this manager holds for `key`, whoever holds its guard
    /// (the guard then finds nothing left to release).
    ///
    /// # Errors
    /// [`LockNotHeldError`] when this manager does not hold `key`; that is the only
    /// error. Backend failures are logged and answered by closing the session.
    ///
    /// # Cancel safety
    /// Once called, the key is no longer held by this manager even if the future is
    /// dropped: at worst its session is closed instead of unlocked.
    fn release(&self, key: &str) -> impl Future<Output = Result<(), LockNotHeldError>> + Send;

    /// Whether this manager holds `key` (a local answer: other holders are not asked).
    ///
    /// Counts locks held through a guard or left to the manager by
    /// [`LockGuard::into_held`]; an acquisition still waiting does not count. A dropped
    /// guard leaves the bookkeeping at once, even where the backend unlock finishes in
    /// the background.
    fn is_held(&self, key: &str) -> bool;

    /// Runs `body` while holding the lock for `key` and releases it afterwards, the
    /// original's `async with manager.acquire(key):`. Whatever `body` returns, an
    /// error included, is handed back unchanged once the lock is released.
    ///
    /// # Errors
    /// The acquisition error when the lock could not be taken (`body` did not run).
    ///
    /// # Cancel safety
    /// Dropping the future drops the guard, which releases the lock.
    fn with_lock<F, Fut, T>(
        &self,
        key: &str,
        options: AcquireOptions,
        body: F,
    ) -> impl Future<Output = Result<T, LockAcquisitionError>> + Send
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let guard = self.acquire(key, options).await?;
            let output = body(guard.info().clone()).await;
            guard.release().await;
            Ok(output)
        }
    }
}

/// Bulk operations over what one manager holds (the original's `LockRegistry`).
pub trait LockRegistry: Send + Sync {
    /// Releases every lock this manager holds and returns how many there were.
    ///
    /// # Cancel safety
    /// Every lock is out of the bookkeeping before the first await; dropping the future
    /// part-way closes the sessions of the locks not yet unlocked, which frees them.
    fn release_all(&self) -> impl Future<Output = usize> + Send;

    /// How many locks this manager holds now.
    fn held_lock_count(&self) -> usize;
}
