//! Counting semaphores on the shared table: one FIFO semaphore of N permits per
//! semaphore class, with the contract of the PostgreSQL manager's.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use locks_port::time::OffsetDateTime;
use locks_port::{
    AcquireOptions, LockAcquisitionError, LossNotifier, LostSignal, PermitDerivation, PermitGuard,
    PermitHolder, PermitHolders, PermitInfo, ReleaseOutcome, Semaphore, check_permits,
    deadline_after, permits_disagree,
};

use crate::book::{ManagerInner, not_released};
use crate::manager::InMemoryLockManager;
use crate::semaphore_table::{Entry, PermitCell, Use};

/// Counts a waiter while it waits.
struct Waiting<'e>(&'e Entry);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl InMemoryLockManager {
    fn semaphore_use(&self, name: &str, permits: u32) -> Result<Use, LockAcquisitionError> {
        let permits = check_permits(name, permits)?;
        self.inner
            .injected_failure(name)
            .map_err(LockAcquisitionError::for_permit)?;
        let class = PermitDerivation::CURRENT.class(name);
        self.inner
            .table
            .inner
            .semaphores
            .join(class, permits)
            .map_err(|in_use| permits_disagree(name, permits, &[in_use]))
    }

    /// Books a taken permit: the first free slot, a guard. No await.
    fn grant(&self, name: &str, taken: Use) -> InMemoryPermit {
        let holder_id = self.holder_id().map(str::to_owned);
        let slot = {
            let mut slots = taken.entry.slots();
            let free = slots.iter().position(Option::is_none).unwrap_or(0);
            if let Some(place) = slots.get_mut(free) {
                *place = Some((holder_id.clone(), SystemTime::now()));
            }
            free
        };
        let slot = u32::try_from(slot).unwrap_or(0);
        let notifier = LossNotifier::new();
        let info = PermitInfo::acquired_now(name, taken.entry.permits, slot, holder_id);
        let lost = notifier.signal();
        let cell = Arc::new(PermitCell::new(taken, slot, notifier));
        let token = self.inner.next_token();
        self.inner.permits.insert(token, Arc::clone(&cell));
        InMemoryPermit {
            info,
            lost,
            cell,
            manager: Arc::clone(&self.inner),
            token,
        }
    }
}

impl Semaphore for InMemoryLockManager {
    type Permit = InMemoryPermit;

    /// Takes one of `permits` permits of `name`: first come, first served.
    ///
    /// # Errors
    /// A timeout, or [`Configuration`](locks_port::AcquisitionErrorKind::Configuration)
    /// for a bad `permits` or one that differs from the one in use.
    ///
    /// # Cancel safety
    /// Cancel safe: Tokio's semaphore leaves the queue on drop, and a permit is booked
    /// without an await once taken.
    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        options: impl Into<AcquireOptions> + Send,
    ) -> Result<InMemoryPermit, LockAcquisitionError> {
        let options = options.into();
        let taken = self.semaphore_use(name, permits)?;
        let queue = &taken.entry.queue;
        let acquired = match options.timeout() {
            Some(timeout) if timeout.is_zero() => queue.try_acquire().ok(),
            timeout => {
                taken.entry.waiting.fetch_add(1, Ordering::SeqCst);
                let _waiting = Waiting(&taken.entry);
                let acquire = queue.acquire();
                match timeout {
                    None => acquire.await.ok(),
                    Some(timeout) => {
                        let deadline = tokio::time::Instant::from_std(deadline_after(
                            std::time::Instant::now(),
                            timeout,
                        ));
                        tokio::time::timeout_at(deadline, acquire)
                            .await
                            .ok()
                            .and_then(Result::ok)
                    }
                }
            }
        };
        let acquired = acquired.map(tokio::sync::SemaphorePermit::forget).is_some();
        match acquired {
            true => Ok(self.grant(name, taken)),
            false => Err(LockAcquisitionError::timed_out(
                name,
                options.timeout().unwrap_or_default(),
            )
            .for_permit()),
        }
    }

    async fn try_acquire_permit(
        &self,
        name: &str,
        permits: u32,
    ) -> Result<Option<InMemoryPermit>, LockAcquisitionError> {
        let taken = self.semaphore_use(name, permits)?;
        let Ok(permit) = taken.entry.queue.try_acquire() else {
            return Ok(None);
        };
        permit.forget();
        Ok(Some(self.grant(name, taken)))
    }

    async fn permit_holders(&self, name: &str) -> Result<PermitHolders, LockAcquisitionError> {
        let class = PermitDerivation::CURRENT.class(name);
        let entry = self.inner.table.inner.semaphores.get(class);
        let Some(entry) = entry else {
            return Ok(PermitHolders::default());
        };
        let held = entry
            .slots()
            .iter()
            .enumerate()
            .filter_map(|(slot, place)| {
                let (holder_id, since) = place.as_ref()?;
                Some(PermitHolder::new(
                    u32::try_from(slot).unwrap_or(0),
                    holder_id.clone(),
                    Some(OffsetDateTime::from(*since)),
                ))
            })
            .collect();
        let mut holders = PermitHolders::default();
        holders.permits = vec![entry.permits];
        holders.held = held;
        holders.waiting = entry.waiting.load(Ordering::SeqCst);
        Ok(holders)
    }
}

/// A permit held through an [`InMemoryLockManager`]. Dropping it gives the permit to
/// the first waiter at once, synchronously (no runtime needed). Its
/// [`lost`](PermitGuard::lost) signal fires when the guard itself releases it, or with
/// the reason given to [`end_session`](InMemoryLockManager::end_session).
#[must_use = "dropping the permit releases it at once"]
pub struct InMemoryPermit {
    info: PermitInfo,
    lost: LostSignal,
    cell: Arc<PermitCell>,
    manager: Arc<ManagerInner>,
    token: u64,
}

impl InMemoryPermit {
    fn release_now(&mut self) -> ReleaseOutcome {
        self.manager.permits.remove(self.token);
        if self.cell.give_back(locks_port::LostReason::Released) {
            ReleaseOutcome::Unlocked
        } else {
            not_released(&self.lost)
        }
    }
}

impl PermitGuard for InMemoryPermit {
    fn info(&self) -> &PermitInfo {
        &self.info
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Releases the permit and reports [`ReleaseOutcome::Unlocked`], or
    /// [`ReleaseOutcome::Lost`] when the permit was taken away first (`end_session`).
    ///
    /// # Cancel safety
    /// The release happens on the first poll; a future dropped before drops the guard,
    /// which releases the permit too.
    async fn release(mut self) -> ReleaseOutcome {
        self.release_now()
    }
}

impl Drop for InMemoryPermit {
    fn drop(&mut self) {
        self.release_now();
    }
}

impl fmt::Debug for InMemoryPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryPermit")
            .field("info", &self.info)
            .field("lost", &self.lost.is_lost())
            .finish()
    }
}
