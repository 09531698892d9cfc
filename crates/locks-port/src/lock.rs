//! The two traits of the port, split along the Python library's two consumer groups.

use std::fmt;
use std::future::{Future, IntoFuture, poll_fn};
use std::pin::pin;
use std::task::Poll;

use crate::{
    AcquireOptions, LockAcquisitionError, LockError, LockInfo, LockLostError, LockMode,
    LockNotHeldError, LostReason, LostSignal,
};

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
    /// The lock had already been lost (the guard's [`LockGuard::lost`] signal fired
    /// with this reason); there was nothing left to release.
    Lost(LostReason),
    /// The unlock was sent and its answer is read in the background (a manager's
    /// opt-in "release off the caller's path"): the lock is free once the backend has
    /// read it, and the connection is reused only once the answer says so; a failure
    /// is logged and the session closed, which frees the lock just the same.
    InBackground,
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

    /// The signal that fires when the lock is no longer held: `.await` it (for example
    /// in a `select!` beside the protected work) to learn the [`LostReason`], or ask
    /// [`LostSignal::is_lost`]. It never fires while the lock is held.
    ///
    /// How fast a loss is noticed depends on the manager: the in-memory manager loses a
    /// lock only when told to (its `release(key)`, `release_all()`, and for tests
    /// `lose(key, reason)` and `end_session(reason)`), noticed at once; the PostgreSQL
    /// manager documents its detection bounds.
    fn lost(&self) -> LostSignal;

    /// Whether the lock is no longer held (a cheap local check).
    fn is_lost(&self) -> bool {
        self.lost().is_lost()
    }

    /// Releases the lock now and reports how.
    ///
    /// Never fails: backend errors are logged and answered by closing the session.
    ///
    /// # Cancel safety
    /// Dropping the returned future part-way still releases the lock: at worst the
    /// session that held it is closed instead of unlocked.
    fn release(self) -> impl Future<Output = ReleaseOutcome> + Send;

    /// Stops managing the lock through this guard and leaves it held by the manager,
    /// like the Python library's `try_acquire`: it stays held until
    /// [`DistributedLock::release`] for its key or [`LockRegistry::release_all`].
    fn into_held(self) -> LockInfo;

    /// Turns an exclusive lock into a shared one without letting go of it: no writer
    /// can take the key in between, and readers (shared holders, waiting or trying)
    /// can join as soon as it returns. The guard's [`info`](Self::info) then says
    /// [`LockMode::Shared`], and releasing it releases the shared lock. A shared lock is
    /// left as it is.
    ///
    /// The way back is [`try_upgrade`](Self::try_upgrade), which never waits.
    ///
    /// ```
    /// use locks_port::prelude::*;
    ///
    /// /// Rebuilds the cache under the exclusive lock, then keeps reading it beside
    /// /// other readers, with no writer in between.
    /// async fn rebuild_then_read<L: DistributedLock>(locks: &L) -> Result<(), LockError> {
    ///     let mut guard = locks.acquire("cache:prices", AcquireOptions::new()).await?;
    ///     // ... rebuild the cache ...
    ///     guard.downgrade().await?;
    ///     assert_eq!(guard.info().mode(), LockMode::Shared);
    ///     // ... read it, while other readers may join ...
    ///     guard.release().await;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// - [`LockError::Lost`]: the lock was no longer held (lost, or taken by the
    ///   manager's `release(key)` or `release_all()`); nothing was done.
    /// - [`LockError::Acquisition`] of kind
    ///   [`Configuration`](crate::AcquisitionErrorKind::Configuration): the manager
    ///   cannot downgrade (the default of this method, for guards that do not
    ///   implement it); the lock is still held, exclusive.
    /// - [`LockError::Acquisition`] of any other kind: the downgrade failed (the
    ///   connection ended, the server did not answer in time, or refused, in its own
    ///   words); the lock is no longer held and the guard's [`lost`](Self::lost)
    ///   signal fires.
    ///
    /// # Cancel safety
    /// Dropped before it began (while waiting for the lock's connection, say), nothing
    /// changed. Dropped part-way, the lock is downgraded or, where the manager cannot
    /// know which, lost: its session is closed, which frees it, and the lost signal
    /// fires. Never held in a mode the manager does not know.
    fn downgrade(&mut self) -> impl Future<Output = Result<(), LockError>> + Send {
        let outcome = match self.info().mode() {
            LockMode::Shared => Ok(()),
            _ => Err(LockError::from(LockAcquisitionError::new(
                self.info().key(),
                crate::AcquisitionErrorKind::Configuration,
                "this lock manager cannot downgrade a lock",
            ))),
        };
        std::future::ready(outcome)
    }

    /// Turns a shared lock into an exclusive one without letting go of it, if that can
    /// be done at once: `true` when the lock is now exclusive (or already was); `false`
    /// when another holder shares the key, and the lock is then still held shared, as
    /// before. The guard's [`info`](Self::info) says the mode it holds.
    ///
    /// With a writer queued for the key (waiting for this reader, among others), the
    /// backend decides who goes first: PostgreSQL 13 to 16 and the in-memory double
    /// say `false` (the writer first); PostgreSQL 17 and later upgrade the reader ahead
    /// of the writer that waits for it. Either way nothing waits, and the writer gets
    /// the key next.
    ///
    /// It never waits, so it cannot deadlock. A waiting upgrade could: two readers
    /// that both waited to upgrade would each wait for the other to leave (PostgreSQL
    /// fails one of them as a deadlock, SQLSTATE 40P01, after its `deadlock_timeout`),
    /// which is why reader-writer locks rarely offer one. A reader that must write
    /// whatever happens releases the shared lock and acquires the exclusive one, and
    /// reads again: another writer may have come in between.
    ///
    /// ```
    /// use locks_port::prelude::*;
    ///
    /// /// Reads the cache and, if it is stale and nobody else reads it, refreshes it
    /// /// under the same lock.
    /// async fn read_or_refresh<L: DistributedLock>(locks: &L) -> Result<(), LockError> {
    ///     let mut guard = locks
    ///         .acquire("cache:prices", AcquireOptions::new().with_mode(LockMode::Shared))
    ///         .await?;
    ///     // ... read; the cache is stale ...
    ///     if guard.try_upgrade().await? {
    ///         assert_eq!(guard.info().mode(), LockMode::Exclusive);
    ///         // ... refresh it, alone ...
    ///     }
    ///     guard.release().await;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// - [`LockError::Lost`]: the lock was no longer held (lost, or taken by the
    ///   manager's `release(key)` or `release_all()`); nothing was done.
    /// - [`LockError::Acquisition`] of kind
    ///   [`Configuration`](crate::AcquisitionErrorKind::Configuration): the manager
    ///   cannot upgrade (the default of this method, for guards that do not implement
    ///   it); the lock is still held, shared.
    /// - [`LockError::Acquisition`] of any other kind: the upgrade failed (the
    ///   connection ended, the server did not answer in time, or refused, in its own
    ///   words); the lock is no longer held and the guard's [`lost`](Self::lost)
    ///   signal fires.
    ///
    /// # Cancel safety
    /// Dropped before it began (while waiting for the lock's connection, say), nothing
    /// changed. Dropped part-way, the lock is upgraded, still shared or, where the
    /// manager cannot know which, lost: its session is closed, which frees it, and the
    /// lost signal fires. Never held in a mode the manager does not know.
    fn try_upgrade(&mut self) -> impl Future<Output = Result<bool, LockError>> + Send {
        let outcome = match self.info().mode() {
            LockMode::Exclusive => Ok(true),
            _ => Err(LockError::from(LockAcquisitionError::new(
                self.info().key(),
                crate::AcquisitionErrorKind::Configuration,
                "this lock manager cannot upgrade a lock",
            ))),
        };
        std::future::ready(outcome)
    }
}

/// Acquire and release string-keyed locks (the Python library's `DistributedLock`).
///
/// The traits use `async fn`-style methods returning `impl Future`, so they are not
/// dyn-compatible: write code that takes locks generic over `L: DistributedLock`
/// (monomorphised, no boxing), or pick one concrete manager. To choose the manager at
/// run time, wrap the managers you use in an enum of your own that implements the trait
/// by delegating.
///
/// ```
/// use std::time::Duration;
/// use locks_port::prelude::*;
///
/// /// Runs the nightly job if no other instance is running it right now.
/// async fn nightly<L: DistributedLock>(locks: &L) -> Result<bool, LockAcquisitionError> {
///     let Some(guard) = locks.try_acquire("job:nightly").await? else {
///         return Ok(false); // another instance has it
///     };
///     // ... the job; `guard.lost()` fires if the lock is lost meanwhile ...
///     guard.release().await;
///     Ok(true)
/// }
///
/// /// Waits up to 2 s for the tenant's lock.
/// async fn per_tenant<L: DistributedLock>(locks: &L) -> Result<(), LockAcquisitionError> {
///     let guard = locks.acquire("tenant:42", Duration::from_secs(2)).await?;
///     assert_eq!(guard.info().key(), "tenant:42");
///     Ok(())
/// }
/// # let locks = locks_memory_stand_in::Locks;
/// # let _ = (nightly(&locks), per_tenant(&locks));
/// # mod locks_memory_stand_in {
/// #     use locks_port::prelude::*;
/// #     use locks_port::{LossNotifier, LostSignal, LockInfo, LockNotHeldError, ReleaseOutcome};
/// #     #[derive(Debug)] pub struct Guard(LockInfo, LossNotifier);
/// #     impl LockGuard for Guard {
/// #         fn info(&self) -> &LockInfo { &self.0 }
/// #         fn lost(&self) -> LostSignal { self.1.signal() }
/// #         async fn release(self) -> ReleaseOutcome { ReleaseOutcome::Unlocked }
/// #         fn into_held(self) -> LockInfo { self.0 }
/// #     }
/// #     pub struct Locks;
/// #     impl DistributedLock for Locks {
/// #         type Guard = Guard;
/// #         async fn acquire(&self, key: &str, _: impl Into<AcquireOptions> + Send) -> Result<Guard, LockAcquisitionError> { unimplemented!("{key}") }
/// #         async fn try_acquire_with(&self, key: &str, _: LockMode) -> Result<Option<Guard>, LockAcquisitionError> { unimplemented!("{key}") }
/// #         async fn release(&self, key: &str) -> Result<(), LockNotHeldError> { Err(LockNotHeldError::new(key)) }
/// #         fn is_held(&self, _: &str) -> bool { false }
/// #     }
/// # }
/// ```
///
/// A second acquisition of a key the same manager already holds contends like any
/// other holder: [`try_acquire`](DistributedLock::try_acquire) gives `None`, and
/// [`acquire`](DistributedLock::acquire) waits for the first to be released. A bounded
/// wait then times out with an error that says the holder is this manager
/// ([`LockAcquisitionError::is_held_by_this_manager`], reason `Timeout after 0.5s: this
/// manager holds 'job:nightly' itself (exclusive, holder id "worker-1", since …):
/// release that guard first`); a wait without a timeout waits for ever, or until some
/// other task releases that guard (the task that holds it and awaits the second
/// acquisition never will).
pub trait DistributedLock: Send + Sync {
    /// The guard of a held lock.
    type Guard: LockGuard;

    /// Takes the lock for `key`, waiting as `options` say: forever by default, or up to
    /// a timeout (one attempt at least, so a zero timeout is exactly one try). Anything
    /// that converts into [`AcquireOptions`] will do: a [`Duration`](std::time::Duration)
    /// bounds the wait, a [`LockMode`] chooses the mode.
    ///
    /// # Errors
    /// [`LockAcquisitionError`]: a timeout (reason `Timeout after {s}s`, followed by
    /// `: this manager holds '{key}' itself (…): release that guard first` when the
    /// holder is this very manager), or a backend failure (reason `Database error: …`,
    /// the backend's error as source). Without a timeout there is no timeout error: a
    /// key this manager holds is waited for until that guard is released.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any await point leaves no lock held and
    /// nothing held on the manager's behalf.
    fn acquire(
        &self,
        key: &str,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<Self::Guard, LockAcquisitionError>> + Send;

    /// Takes the exclusive lock for `key` if it is free right now; `Ok(None)` when it is
    /// held (by anyone, this manager included: [`is_held`](DistributedLock::is_held)
    /// tells whether the holder is this manager). Never waits for the lock.
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
    ) -> impl Future<Output = Result<Option<Self::Guard>, LockAcquisitionError>> + Send {
        self.try_acquire_with(key, LockMode::Exclusive)
    }

    /// [`try_acquire`](DistributedLock::try_acquire) in `mode`: a shared try succeeds
    /// while other shared holders hold the key, and gives `Ok(None)` while an exclusive
    /// holder holds it or an exclusive waiter is queued for it.
    ///
    /// # Errors
    /// As [`try_acquire`](DistributedLock::try_acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](DistributedLock::acquire).
    fn try_acquire_with(
        &self,
        key: &str,
        mode: LockMode,
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

    /// How soon, at worst, a holder of this manager's locks is told that the backend
    /// ended its session (the guard's [`lost`](LockGuard::lost) signal fires), when the
    /// manager knows it; `None` (the default) when it does not.
    ///
    /// A caller that takes over work from a holder whose session ended without a word
    /// (a terminated session, a killed process) waits this long before starting, so that
    /// the old holder has stopped first; it is the old holder's manager that knows the
    /// bound, so the old holder records it where the next one reads it (the shard terms
    /// of `locks-shard` do). With `None` a caller keeps its own conservative delay. A
    /// holder cut off from the backend is not covered by it (its session ends by the
    /// backend's timers, which a lease orders after the holder's own stop).
    fn loss_notice_bound(&self) -> Option<std::time::Duration> {
        None
    }

    /// Runs `body` while holding the lock for `key` and releases it afterwards, the
    /// Python library's `async with manager.acquire(key):`. Whatever `body` returns, an
    /// error included, is handed back unchanged once the lock is released.
    ///
    /// The [`ReleaseOutcome`] of that release is not returned. When it matters (to
    /// learn that the lock was lost while `body` ran, [`ReleaseOutcome::Lost`]), take the
    /// guard yourself and release it:
    /// `let guard = locks.acquire(key, options).await?; ...; let outcome = guard.release().await;`,
    /// or use [`with_lock_until_lost`](DistributedLock::with_lock_until_lost), which
    /// stops `body` when the lock is lost and says so.
    ///
    /// # Errors
    /// The acquisition error when the lock could not be taken (`body` did not run).
    ///
    /// # Cancel safety
    /// Dropping the future drops the guard, which releases the lock.
    fn with_lock<F, Fut, T>(
        &self,
        key: &str,
        options: impl Into<AcquireOptions> + Send,
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

    /// Runs `body` while holding the lock for `key` if the lock is free right now, and
    /// releases it afterwards; `Ok(None)` when someone holds it ("skip if already
    /// running"). One [`try_acquire`](DistributedLock::try_acquire): it never waits.
    ///
    /// ```
    /// use locks_port::prelude::*;
    ///
    /// /// Runs the nightly job unless another instance is running it.
    /// async fn nightly<L: DistributedLock>(locks: &L) -> Result<(), LockAcquisitionError> {
    ///     match locks.try_with_lock("job:nightly", |_info| async { /* the job */ }).await? {
    ///         Some(()) => println!("done"),
    ///         None => println!("another instance is running it; skipped"),
    ///     }
    ///     Ok(())
    /// }
    /// # let _ = nightly::<NoLocks>;
    /// # struct NoLocks;
    /// # impl DistributedLock for NoLocks {
    /// #     type Guard = G;
    /// #     async fn acquire(&self, key: &str, _: impl Into<AcquireOptions> + Send) -> Result<G, LockAcquisitionError> { unimplemented!("{key}") }
    /// #     async fn try_acquire_with(&self, key: &str, _: LockMode) -> Result<Option<G>, LockAcquisitionError> { unimplemented!("{key}") }
    /// #     async fn release(&self, key: &str) -> Result<(), locks_port::LockNotHeldError> { unimplemented!("{key}") }
    /// #     fn is_held(&self, _: &str) -> bool { false }
    /// # }
    /// # #[derive(Debug)] struct G;
    /// # impl LockGuard for G {
    /// #     fn info(&self) -> &locks_port::LockInfo { unimplemented!() }
    /// #     fn lost(&self) -> locks_port::LostSignal { unimplemented!() }
    /// #     async fn release(self) -> locks_port::ReleaseOutcome { unimplemented!() }
    /// #     fn into_held(self) -> locks_port::LockInfo { unimplemented!() }
    /// # }
    /// ```
    ///
    /// # Errors
    /// A backend failure (or the empty key), as
    /// [`try_acquire`](DistributedLock::try_acquire); contention is `Ok(None)`.
    ///
    /// # Cancel safety
    /// Dropping the future drops the guard, which releases the lock.
    fn try_with_lock<F, Fut, T>(
        &self,
        key: &str,
        body: F,
    ) -> impl Future<Output = Result<Option<T>, LockAcquisitionError>> + Send
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let Some(guard) = self.try_acquire(key).await? else {
                return Ok(None);
            };
            let output = body(guard.info().clone()).await;
            guard.release().await;
            Ok(Some(output))
        }
    }

    /// Runs `body` while holding the lock for `key`, and stops it (drops its future at
    /// its next await) the moment the lock is lost: the common pattern for work that
    /// must not go on without its lock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_port::prelude::*;
    ///
    /// async fn run_job<L: DistributedLock>(locks: &L) -> Result<u32, LockError> {
    ///     locks
    ///         .with_lock_until_lost("job:reindex", Duration::from_secs(5), |_info| async {
    ///             // ... work that must stop if the lock is lost ...
    ///             42
    ///         })
    ///         .await
    /// }
    /// # let _ = run_job::<NoLocks>;
    /// # struct NoLocks;
    /// # impl DistributedLock for NoLocks {
    /// #     type Guard = G;
    /// #     async fn acquire(&self, key: &str, _: impl Into<AcquireOptions> + Send) -> Result<G, LockAcquisitionError> { unimplemented!("{key}") }
    /// #     async fn try_acquire_with(&self, key: &str, _: LockMode) -> Result<Option<G>, LockAcquisitionError> { unimplemented!("{key}") }
    /// #     async fn release(&self, key: &str) -> Result<(), locks_port::LockNotHeldError> { unimplemented!("{key}") }
    /// #     fn is_held(&self, _: &str) -> bool { false }
    /// # }
    /// # #[derive(Debug)] struct G;
    /// # impl LockGuard for G {
    /// #     fn info(&self) -> &locks_port::LockInfo { unimplemented!() }
    /// #     fn lost(&self) -> locks_port::LostSignal { unimplemented!() }
    /// #     async fn release(self) -> locks_port::ReleaseOutcome { unimplemented!() }
    /// #     fn into_held(self) -> locks_port::LockInfo { unimplemented!() }
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Acquisition`] when the lock could not be taken (`body` did not run);
    /// [`LockError::Lost`] when it was lost while `body` ran (`body` was dropped where
    /// it stood, so make it safe to stop at an await, as any cancellable future).
    ///
    /// # Cancel safety
    /// Dropping the future drops the body and the guard, which releases the lock.
    fn with_lock_until_lost<F, Fut, T>(
        &self,
        key: &str,
        options: impl Into<AcquireOptions> + Send,
        body: F,
    ) -> impl Future<Output = Result<T, LockError>> + Send
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let guard = self.acquire(key, options).await?;
            let outcome = {
                let mut body = pin!(body(guard.info().clone()));
                let mut lost = pin!(guard.lost().into_future());
                poll_fn(|cx| {
                    if let Poll::Ready(output) = body.as_mut().poll(cx) {
                        return Poll::Ready(Ok(output));
                    }
                    lost.as_mut().poll(cx).map(Err)
                })
                .await
            };
            guard.release().await;
            outcome.map_err(|reason| LockLostError::new(key, reason).into())
        }
    }
}

/// Bulk operations over what one manager holds (the Python library's `LockRegistry`).
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
