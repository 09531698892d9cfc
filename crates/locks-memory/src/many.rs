//! Several keys at once: all or nothing, in one global order, within one deadline.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use locks_port::{
    AcquireMany, AcquireOptions, LockAcquisitionError, LockGroup, LockInfo, LossNotifier,
    LostSignal, ReleaseOutcome, deadline_after,
};

use crate::book::{ManagerInner, not_released};
use crate::manager::{InMemoryLockManager, permits};
use crate::table::{HeldPermit, Slot};

impl InMemoryLockManager {
    /// Takes the locks of all `keys`, or none: in one global order (ascending lock id,
    /// keys with the same lock id merged, the first of them named), within one deadline
    /// (`options`' timeout, for the whole group), each in `options`' mode. Every caller
    /// that takes several keys this way takes them in the same order, so two of them can
    /// never deadlock on each other. The same contract as the PostgreSQL manager's
    /// `acquire_many`.
    ///
    /// An empty `keys` is granted at once: the guard holds nothing, its
    /// [`release`](InMemoryLockGroup::release) reports `Unlocked` and its
    /// [`lost`](InMemoryLockGroup::lost) never fires.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_memory::InMemoryLockTable;
    /// use locks_memory::locks_port::DistributedLock;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let table = InMemoryLockTable::new();
    /// let (locks, other) = (table.manager(), table.manager());
    /// let transfer = locks
    ///     .acquire_many(&["account:17", "account:4", "account:17"], Duration::from_secs(2))
    ///     .await?;
    /// assert_eq!(transfer.infos().len(), 2, "a key named twice is one lock");
    /// assert!(other.try_acquire("account:4").await?.is_none());
    /// transfer.release().await;
    /// assert!(other.try_acquire("account:4").await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// A timeout, as [`LockAcquisitionError::timed_out`] with the group's timeout,
    /// naming the first key (in lock-id order) still busy at the deadline. Nothing is
    /// held after an error: the locks taken before it are given back.
    ///
    /// # Cancel safety
    /// Cancel safe as a whole: dropping the future at any await gives back every lock
    /// it took and leaves the queue it waits in; nothing is booked until every lock is
    /// taken, and the booking does not await.
    pub fn acquire_many<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<InMemoryLockGroup, LockAcquisitionError>> + Send {
        let keys = locks_port::owned_keys(keys);
        let options = options.into();
        async move {
            let keys = keys?;
            if let Some(first) = keys.first() {
                self.inner.injected_failure(first)?;
            }
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.acquire_group(&keys, options).await
        }
    }

    /// [`acquire_many`](Self::acquire_many) of checked keys.
    async fn acquire_group(
        &self,
        keys: &[&str],
        options: AcquireOptions,
    ) -> Result<InMemoryLockGroup, LockAcquisitionError> {
        let table = &self.inner.table.inner;
        let ordered = self.inner.table.key_derivation().lock_order(keys);
        let deadline = options
            .timeout()
            .map(|timeout| deadline_after(Instant::now(), timeout));
        let wanted = permits(options.mode());
        // Dropping this (an error, a cancelled future) gives every lock back.
        let mut taken: Vec<(&str, HeldPermit)> = Vec::with_capacity(ordered.len());
        for (&lock_id, &key) in &ordered {
            let slot = Slot::join(table, lock_id);
            let left = match deadline {
                Some(deadline) => {
                    options.with_timeout(deadline.saturating_duration_since(Instant::now()))
                }
                None => options,
            };
            if !Self::wait_for_permit(&slot, key, left).await? {
                let timeout = options.timeout().unwrap_or_default();
                return Err(self.inner.timed_out(key, options.mode(), timeout));
            }
            taken.push((key, HeldPermit::new(slot, wanted)));
        }
        Ok(self.book_group(taken, options))
    }

    /// Books every taken lock under one token and one loss signal. No await.
    fn book_group(
        &self,
        taken: Vec<(&str, HeldPermit)>,
        options: AcquireOptions,
    ) -> InMemoryLockGroup {
        let inner = &self.inner;
        let token = inner.next_token();
        let notifier = LossNotifier::new();
        let mut infos = Vec::with_capacity(taken.len());
        for (key, permit) in taken {
            let info = inner.info(key, permit.lock_id(), options.mode());
            inner.insert(&info, token, notifier.clone(), permit);
            infos.push(info);
        }
        InMemoryLockGroup {
            manager: Arc::clone(inner),
            infos,
            token,
            lost: notifier.signal(),
            armed: true,
        }
    }
}

/// For code generic over the manager: the inherent [`InMemoryLockManager::acquire_many`].
impl AcquireMany for InMemoryLockManager {
    type Locks = InMemoryLockGroup;

    fn acquire_many<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<InMemoryLockGroup, LockAcquisitionError>> + Send {
        Self::acquire_many(self, keys, options)
    }
}

/// The locks of one [`acquire_many`](InMemoryLockManager::acquire_many), released
/// together.
///
/// Dropping it releases them all at once, synchronously (no runtime needed), like
/// [`InMemoryLockGuard`](crate::InMemoryLockGuard). [`lost`](Self::lost) fires when any
/// of them is no longer held: here, when the manager's `release(key)`, `release_all`,
/// `lose(key, reason)` or `end_session(reason)` took one away.
#[must_use = "dropping the guard releases the locks at once"]
pub struct InMemoryLockGroup {
    manager: Arc<ManagerInner>,
    infos: Vec<LockInfo>,
    token: u64,
    lost: LostSignal,
    /// False once the locks were released.
    armed: bool,
}

impl InMemoryLockGroup {
    /// The locks, in the order they were taken (ascending lock id).
    #[must_use]
    pub fn infos(&self) -> &[LockInfo] {
        &self.infos
    }

    /// Fires when any of the locks is no longer held (see
    /// [`LockGuard::lost`](locks_port::LockGuard::lost)).
    #[must_use]
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Whether any of the locks is no longer held.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Releases every lock now: `Unlocked` when each one still held was unlocked by
    /// this call, `AlreadyReleased` when the manager took one away first (the others are
    /// released all the same), `Lost(reason)` when the group was lost (see
    /// [`InMemoryLockManager::lose`]).
    ///
    /// # Cancel safety
    /// The release happens on the first poll, without waiting; a future dropped before
    /// it is polled drops the guard, which releases the locks too.
    pub async fn release(mut self) -> ReleaseOutcome {
        self.release_now()
    }

    fn release_now(&mut self) -> ReleaseOutcome {
        if !std::mem::replace(&mut self.armed, false) {
            return ReleaseOutcome::AlreadyReleased;
        }
        let mut outcome = ReleaseOutcome::Unlocked;
        for info in &self.infos {
            if !self.manager.release_token(info.key(), self.token) {
                outcome = not_released(&self.lost);
            }
        }
        outcome
    }
}

/// The inherent methods, for code generic over the manager.
impl LockGroup for InMemoryLockGroup {
    fn infos(&self) -> &[LockInfo] {
        Self::infos(self)
    }

    fn lost(&self) -> LostSignal {
        Self::lost(self)
    }

    async fn release(self) -> ReleaseOutcome {
        Self::release(self).await
    }
}

impl Drop for InMemoryLockGroup {
    fn drop(&mut self) {
        self.release_now();
    }
}

impl fmt::Debug for InMemoryLockGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryLockGroup")
            .field("infos", &self.infos)
            .field("token", &self.token)
            .field("lost", &self.lost.reason())
            .field("armed", &self.armed)
            .finish()
    }
}
