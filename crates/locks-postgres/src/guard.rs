//! The guard of a held lock.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use locks_port::{LockError, LockGuard, LockInfo, LostReason, LostSignal, ReleaseOutcome};

use crate::bookkeeping::{Entries, Ticket};
use crate::inner::Inner;
use crate::mode_change;
use crate::release;

/// A lock held by a [`PostgresLockManager`](crate::PostgresLockManager).
///
/// Dropping the guard releases the lock: inside a Tokio runtime the unlock is spawned
/// onto it; with no runtime at hand the session is closed instead, which frees the
/// lock on the server just the same. [`release`](LockGuard::release) unlocks now and
/// says how it went; [`into_held`](LockGuard::into_held) leaves the lock to the
/// manager until `release(key)` or `release_all()`.
///
/// [`lost`](LockGuard::lost) fires when the lock is no longer held: taken by the
/// manager's `release(key)`/`release_all()`, or lost with its session (see the crate's
/// health section for the reasons and how fast each is noticed).
///
/// ```no_run
/// use std::time::Duration;
/// use locks_postgres::prelude::*;
///
/// # async fn run(locks: locks_postgres::PostgresLockManager) -> Result<(), LockAcquisitionError> {
/// let guard = locks.acquire("report:daily", Duration::from_secs(1)).await?;
/// assert!(!guard.is_lost());
/// let outcome = guard.release().await;
/// assert_eq!(outcome, ReleaseOutcome::Unlocked);
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct PostgresLockGuard {
    inner: Arc<Inner>,
    info: LockInfo,
    /// The acquisition's bookkeeping ticket.
    ticket: u64,
    lost: LostSignal,
    armed: bool,
}

impl PostgresLockGuard {
    pub(crate) fn new(inner: Arc<Inner>, info: LockInfo, ticket: u64, lost: LostSignal) -> Self {
        Self {
            inner,
            info,
            ticket,
            lost,
            armed: true,
        }
    }
}

/// What a release finds when the entry is gone: lost, or released elsewhere.
pub(crate) fn gone(lost: &LostSignal) -> ReleaseOutcome {
    match lost.reason() {
        Some(reason) if reason != LostReason::Released => ReleaseOutcome::Lost(reason),
        _ => ReleaseOutcome::AlreadyReleased,
    }
}

impl LockGuard for PostgresLockGuard {
    fn info(&self) -> &LockInfo {
        &self.info
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Unlocks now.
    ///
    /// # Cancel safety
    /// The entry leaves the bookkeeping before the first await; if the future is
    /// dropped, the session is closed instead of unlocked, which frees the lock (on a
    /// shared connection of a multiplexing manager, a task unlocks it instead, so the
    /// connection's other locks stay).
    async fn release(mut self) -> ReleaseOutcome {
        self.armed = false;
        let Some(mut held) = self.inner.take_one(self.info.lock_id(), self.ticket) else {
            return gone(&self.lost);
        };
        if !self.inner.settings().release_in_background {
            if held.place().is_some() {
                return release::unlock_to_the_end(&self.inner, held).await;
            }
            return release::unlock_held!(&self.inner, held);
        }
        // Polled once here, the unlock takes the session and hands its statement to
        // the connection; the answer is read by a task of its own. The connection
        // goes back to the pool only after that answer (ADR 0010). Until then the
        // book knows the unlock is in flight, so that an acquisition of the same key
        // waits in the server's queue for it instead of racing it with a try.
        let inner = Arc::clone(&self.inner);
        let releasing = Releasing::new(&inner, held.lock_id());
        let mut unlock = Box::pin(async move {
            let outcome = release::unlock(&inner, held).await;
            drop(releasing);
            outcome
        });
        match std::future::poll_fn(|cx| Poll::Ready(unlock.as_mut().poll(cx))).await {
            Poll::Ready(outcome) => outcome,
            Poll::Pending => {
                tokio::spawn(unlock);
                ReleaseOutcome::InBackground
            }
        }
    }

    fn into_held(mut self) -> LockInfo {
        self.armed = false;
        self.info.clone()
    }

    /// One statement on the lock's session takes the lock shared beside the exclusive
    /// hold (granted at once: a session's own locks never block it), then frees the
    /// exclusive hold. On a multiplexed connection too.
    ///
    /// # Cancel safety
    /// Dropped while waiting for the connection (a keepalive in flight on it), nothing
    /// changed. Dropped once it began, before the answer was read, the session is
    /// closed, which frees the lock (on a multiplexed connection, with the other locks
    /// on it), and the health monitor tells the guards they are lost.
    async fn downgrade(&mut self) -> Result<(), LockError> {
        let ticket = Ticket {
            lock_id: self.info.lock_id(),
            number: self.ticket,
        };
        mode_change::downgrade(&self.inner, &ticket, &mut self.info, &self.lost).await
    }

    /// One statement on the lock's session tries the lock exclusive beside the shared
    /// hold (never waiting: refused while another session holds the key; with a writer
    /// queued, refused by PostgreSQL 13 to 16 and granted ahead of it by 17 and later),
    /// then frees the shared hold. On a multiplexed connection too.
    ///
    /// # Cancel safety
    /// Dropped while waiting for the connection (a keepalive in flight on it), nothing
    /// changed. Dropped once it began, before the answer was read, the session is
    /// closed, which frees the lock (on a multiplexed connection, with the other locks
    /// on it), and the health monitor tells the guards they are lost.
    async fn try_upgrade(&mut self) -> Result<bool, LockError> {
        let ticket = Ticket {
            lock_id: self.info.lock_id(),
            number: self.ticket,
        };
        mode_change::try_upgrade(&self.inner, &ticket, &mut self.info, &self.lost).await
    }
}

/// An unlock in flight in the background, in the book until dropped (answered, or the
/// task dropped with its runtime).
struct Releasing {
    inner: Arc<Inner>,
    lock_id: i64,
}

impl Releasing {
    fn new(inner: &Arc<Inner>, lock_id: i64) -> Self {
        inner.book().releasing(lock_id);
        Self {
            inner: Arc::clone(inner),
            lock_id,
        }
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        self.inner.book().released(self.lock_id);
    }
}

impl Drop for PostgresLockGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(held) = self.inner.take_one(self.info.lock_id(), self.ticket) {
            release::unlock_later(&self.inner, Entries::from_buf([held]));
        }
    }
}

impl fmt::Debug for PostgresLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockGuard")
            .field("info", &self.info)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}
