//! The manager: per-manager bookkeeping over a shared [`InMemoryLockTable`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockAcquisitionError, LockMode,
    LockNotHeldError, LockRegistry, LossNotifier, WaitStrategy, deadline_after,
};
#[cfg(doc)]
use locks_port::{LockInfo, LostReason};
use tokio::sync::TryAcquireError;

use crate::book::ManagerInner;
use crate::guard::InMemoryLockGuard;
use crate::table::{HeldPermit, InMemoryLockTable, READER_PERMITS, Slot};

/// The shortest sleep between two tries of [`WaitStrategy::Poll`].
const MIN_RETRY_INTERVAL: Duration = Duration::from_millis(1);

/// A single-process lock manager with the contract of the PostgreSQL one.
///
/// Managers on one [`InMemoryLockTable`] contend like processes on one database; each
/// manager has its own bookkeeping (`is_held`, `held_lock_count`, `release`,
/// `release_all` answer for it alone). Cloning a manager shares it, bookkeeping
/// included, like cloning an `Arc`.
///
/// Waiters on a lock are served first-come first-served, and a released lock goes to
/// the first waiter directly: a [`try_acquire`](DistributedLock::try_acquire) cannot
/// take it from under a queue. Shared holders ([`LockMode::Shared`]) hold a key
/// together; an exclusive waiter queued behind them keeps later shared requests
/// waiting behind it, so writers are not starved.
///
/// A guard's lock is lost here only through its manager:
/// [`release`](DistributedLock::release) or [`release_all`](LockRegistry::release_all)
/// of a key whose guard is still in use fires that guard's
/// [`lost`](locks_port::LockGuard::lost) signal with [`LostReason::Released`]; and, for
/// tests of the caller's loss path, [`lose`](Self::lose) and
/// [`end_session`](Self::end_session) take locks, groups and permits away with any
/// [`LostReason`] (`ConnectionClosed`, `KeepaliveFailed`, a server restart), while
/// [`fail_next_acquire`](Self::fail_next_acquire) makes the next acquisition fail with a
/// chosen [`AcquisitionErrorKind`].
///
/// # Runtime
/// `acquire` with a timeout and the [`WaitStrategy::Poll`] strategy use Tokio's timer
/// (a Tokio runtime with time enabled). Everything else, dropping a guard included,
/// needs no runtime.
#[derive(Clone)]
pub struct InMemoryLockManager {
    pub(crate) inner: Arc<ManagerInner>,
}

/// How many of a lock's permits `mode` takes.
pub(crate) fn permits(mode: LockMode) -> u32 {
    match mode {
        LockMode::Shared => 1,
        _ => READER_PERMITS,
    }
}

/// Builds an [`InMemoryLockManager`].
///
/// ```
/// use locks_memory::{InMemoryLockManager, InMemoryLockTable};
///
/// let table = InMemoryLockTable::new();
/// let manager = InMemoryLockManager::builder()
///     .table(&table)
///     .holder_id("worker-1")
///     .build();
/// assert_eq!(manager.holder_id(), Some("worker-1"));
/// ```
#[derive(Debug, Default)]
#[must_use]
pub struct InMemoryLockManagerBuilder {
    table: Option<InMemoryLockTable>,
    holder_id: Option<String>,
}

impl InMemoryLockManagerBuilder {
    /// Shares `table` with other managers (default: a fresh table of its own).
    pub fn table(mut self, table: &InMemoryLockTable) -> Self {
        self.table = Some(table.clone());
        self
    }

    /// The label put in every [`LockInfo`] this manager hands out.
    pub fn holder_id(mut self, holder_id: impl Into<String>) -> Self {
        self.holder_id = Some(holder_id.into());
        self
    }

    /// The manager.
    #[must_use]
    pub fn build(self) -> InMemoryLockManager {
        InMemoryLockManager {
            inner: Arc::new(ManagerInner::new(
                self.table.unwrap_or_default(),
                self.holder_id,
            )),
        }
    }
}

impl InMemoryLockManager {
    /// A manager on a fresh table of its own, without a holder id.
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A manager on a fresh table of its own, with a holder id (the Python library's
    /// `InMemoryLockManager(holder_id="test-worker")`).
    #[must_use]
    pub fn with_holder_id(holder_id: impl Into<String>) -> Self {
        Self::builder().holder_id(holder_id).build()
    }

    /// A new manager, without a holder id, on `table`.
    #[must_use]
    pub fn on_table(table: &InMemoryLockTable) -> Self {
        Self::builder().table(table).build()
    }

    /// Configures a manager.
    pub fn builder() -> InMemoryLockManagerBuilder {
        InMemoryLockManagerBuilder::default()
    }

    /// The table this manager's locks live in: pass it to
    /// [`on_table`](Self::on_table) for a manager that contends with this one.
    #[must_use]
    pub fn table(&self) -> &InMemoryLockTable {
        &self.inner.table
    }

    /// The label put in every [`LockInfo`] this manager hands out.
    #[must_use]
    pub fn holder_id(&self) -> Option<&str> {
        self.inner.holder_id()
    }

    /// Waits for the lock's permits as `options` say; `false` when the time ran out.
    ///
    /// Cancel safe: the permits are taken by Tokio's cancel-safe `Acquire` future or by
    /// a synchronous `try_acquire`, and forgotten only after no await is left.
    pub(crate) async fn wait_for_permit(
        slot: &Slot,
        key: &str,
        options: AcquireOptions,
    ) -> Result<bool, LockAcquisitionError> {
        let semaphore = slot.semaphore();
        let wanted = permits(options.mode());
        match (options.timeout(), options.wait_strategy()) {
            (Some(timeout), _) if timeout.is_zero() => Self::try_permit(slot, key, wanted),
            (Some(timeout), WaitStrategy::Poll) => {
                Self::poll(slot, key, wanted, options.retry_interval(), timeout).await
            }
            // Without a timeout every strategy waits in the queue, as in the Python library
            // (and the PostgreSQL manager): polling is for bounded waits.
            (None, _) => {
                let permit = semaphore
                    .acquire_many(wanted)
                    .await
                    .map_err(|_| closed(key))?;
                permit.forget();
                Ok(true)
            }
            (Some(timeout), _) => {
                let deadline = tokio::time::Instant::from_std(deadline_after(
                    std::time::Instant::now(),
                    timeout,
                ));
                match tokio::time::timeout_at(deadline, semaphore.acquire_many(wanted)).await {
                    Ok(permit) => {
                        permit.map_err(|_| closed(key))?.forget();
                        Ok(true)
                    }
                    Err(_elapsed) => Ok(false),
                }
            }
        }
    }

    /// One attempt: `true` when the permits were taken.
    fn try_permit(slot: &Slot, key: &str, wanted: u32) -> Result<bool, LockAcquisitionError> {
        match slot.semaphore().try_acquire_many(wanted) {
            Ok(permit) => {
                permit.forget();
                Ok(true)
            }
            Err(TryAcquireError::NoPermits) => Ok(false),
            Err(TryAcquireError::Closed) => Err(closed(key)),
        }
    }

    /// The Python library's strategy: try, sleep, try again until the deadline. Never joins
    /// the queue, so it can be overtaken by queued waiters.
    async fn poll(
        slot: &Slot,
        key: &str,
        wanted: u32,
        retry_interval: Duration,
        timeout: Duration,
    ) -> Result<bool, LockAcquisitionError> {
        let deadline =
            tokio::time::Instant::from_std(deadline_after(std::time::Instant::now(), timeout));
        let interval = retry_interval.max(MIN_RETRY_INTERVAL);
        loop {
            if Self::try_permit(slot, key, wanted)? {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(interval.min(deadline - now)).await;
        }
    }

    /// Books a taken permit and hands out its guard. No await: the permit cannot be
    /// lost between being taken and being booked.
    fn book(&self, key: &str, slot: Slot, mode: LockMode) -> InMemoryLockGuard {
        let inner = &self.inner;
        let token = inner.next_token();
        let info = inner.info(key, slot.lock_id(), mode);
        let notifier = LossNotifier::new();
        let lost = notifier.signal();
        inner.insert(&info, token, notifier, HeldPermit::new(slot, permits(mode)));
        InMemoryLockGuard::new(Arc::clone(inner), token, info, lost)
    }
}

/// Managers made by their table (the table's own API, built here: the table knows
/// nothing of managers).
impl InMemoryLockTable {
    /// A new manager on this table, with its own bookkeeping and no holder id.
    #[must_use]
    pub fn manager(&self) -> InMemoryLockManager {
        InMemoryLockManager::on_table(self)
    }

    /// A new manager on this table with a holder id.
    #[must_use]
    pub fn manager_with_holder_id(&self, holder_id: impl Into<String>) -> InMemoryLockManager {
        InMemoryLockManager::builder()
            .table(self)
            .holder_id(holder_id)
            .build()
    }
}

impl Default for InMemoryLockManager {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for InMemoryLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryLockManager")
            .field("holder_id", &self.inner.holder_id())
            .field("held_lock_count", &self.held_lock_count())
            .field("table", &self.inner.table)
            .finish()
    }
}

/// The table's semaphores are never closed; this is here so nothing can panic.
fn closed(key: &str) -> LockAcquisitionError {
    LockAcquisitionError::new(key, AcquisitionErrorKind::Backend, "lock table closed")
}

impl DistributedLock for InMemoryLockManager {
    type Guard = InMemoryLockGuard;

    /// Takes the lock for `key`, waiting as `options` say.
    ///
    /// [`WaitStrategy::Queue`] waits first-come first-served; [`WaitStrategy::Poll`]
    /// tries every `retry_interval` (at least 1 ms) without joining the queue, like the
    /// Python library. A zero timeout makes exactly one attempt.
    ///
    /// # Errors
    /// A timeout, as [`LockAcquisitionError::timed_out`]; when this manager holds `key`
    /// itself (in a mode that excludes the one asked for) the error says so, as
    /// [`LockAcquisitionError::held_by_this_manager`] words it. Without a timeout such
    /// a wait lasts until that guard is released, for ever if nobody releases it.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future while it waits leaves the queue, returns a
    /// permit that was handed to it meanwhile to the next waiter, and leaves nothing
    /// in the bookkeeping or the table.
    async fn acquire(
        &self,
        key: &str,
        options: impl Into<AcquireOptions> + Send,
    ) -> Result<InMemoryLockGuard, LockAcquisitionError> {
        locks_port::check_key(key)?;
        self.inner.injected_failure(key)?;
        let options = options.into();
        let slot = Slot::join(&self.inner.table.inner, self.inner.table.inner.lock_id(key));
        if Self::wait_for_permit(&slot, key, options).await? {
            Ok(self.book(key, slot, options.mode()))
        } else {
            // `slot` is dropped on return, leaving the table.
            let timeout = options.timeout().unwrap_or_default();
            Err(self.inner.timed_out(key, options.mode(), timeout))
        }
    }

    /// Takes the lock for `key` in `mode` if it can be had now without jumping the
    /// queue: exclusive when nobody holds it or waits for it, shared when no exclusive
    /// holder has it and nobody waits.
    ///
    /// # Errors
    /// `InvalidKey` for the empty key, or the failure armed by
    /// [`fail_next_acquire`](Self::fail_next_acquire); contention is `Ok(None)`.
    ///
    /// # Cancel safety
    /// Cancel safe: it completes without waiting.
    async fn try_acquire_with(
        &self,
        key: &str,
        mode: LockMode,
    ) -> Result<Option<InMemoryLockGuard>, LockAcquisitionError> {
        locks_port::check_key(key)?;
        self.inner.injected_failure(key)?;
        let slot = Slot::join(&self.inner.table.inner, self.inner.table.inner.lock_id(key));
        if Self::try_permit(&slot, key, permits(mode))? {
            Ok(Some(self.book(key, slot, mode)))
        } else {
            Ok(None)
        }
    }

    /// Releases the lock this manager holds for `key`; its guard, if any, then finds
    /// nothing left to release.
    ///
    /// # Errors
    /// [`LockNotHeldError`] when this manager does not hold `key`.
    ///
    /// # Cancel safety
    /// Cancel safe: it completes without waiting.
    async fn release(&self, key: &str) -> Result<(), LockNotHeldError> {
        let removed = self.inner.held_map().remove_key(key);
        if removed.is_empty() {
            return Err(LockNotHeldError::new(key));
        }
        // Dropped outside the bookkeeping mutex: hands the lock on.
        drop(removed);
        Ok(())
    }

    fn is_held(&self, key: &str) -> bool {
        self.inner.held_map().contains(key)
    }
}

impl LockRegistry for InMemoryLockManager {
    /// Releases every lock this manager holds (guards' included) and returns how many.
    ///
    /// # Cancel safety
    /// Cancel safe: it completes without waiting.
    async fn release_all(&self) -> usize {
        let held = self.inner.held_map().drain();
        let count = held.len();
        drop(held);
        count
    }

    fn held_lock_count(&self) -> usize {
        self.inner.held_map().len()
    }
}
