//! Making the double lose, so callers can test their own loss and error paths: end a
//! manager's "session" (its locks, groups and permits lost with any [`LostReason`]) and
//! make the next acquisition fail with a chosen [`AcquisitionErrorKind`].

use std::sync::PoisonError;
use std::time::Duration;

#[cfg(doc)]
use locks_port::ReleaseOutcome;
use locks_port::{AcquisitionErrorKind, LockAcquisitionError, LostReason};

use crate::book::{Held, ManagerInner};
use crate::manager::InMemoryLockManager;

impl ManagerInner {
    /// The failure [`InMemoryLockManager::fail_next_acquire`] armed, once.
    pub(crate) fn injected_failure(&self, key: &str) -> Result<(), LockAcquisitionError> {
        let kind = self
            .next_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match kind {
            None => Ok(()),
            Some(AcquisitionErrorKind::Timeout) => {
                Err(LockAcquisitionError::timed_out(key, Duration::ZERO))
            }
            Some(kind) => Err(LockAcquisitionError::new(
                key,
                kind,
                format!("Database error: {kind:?}, injected by fail_next_acquire"),
            )),
        }
    }
}

impl InMemoryLockManager {
    /// Takes the lock of `key` away from this manager as a PostgreSQL manager loses it
    /// when its session ends: the key is free for others at once, then the guard's
    /// [`lost`](locks_port::LockGuard::lost) signal fires with `reason` (in that order, as
    /// the server frees a lock before its client hears of it), and the guard's release
    /// reports [`ReleaseOutcome::Lost`]. A key held as part of a group loses the whole
    /// group (one session holds them all); a key this manager holds more than once (shared,
    /// twice) loses every hold. `false` when this manager does not hold `key`.
    ///
    /// For tests of the caller's loss path; see also [`end_session`](Self::end_session).
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_memory::InMemoryLockManager;
    /// use locks_memory::locks_port::{DistributedLock, LockGuard, LostReason, ReleaseOutcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = InMemoryLockManager::new();
    /// let guard = locks.acquire("job:nightly", Duration::from_secs(1)).await?;
    /// assert!(locks.lose("job:nightly", LostReason::ConnectionClosed));
    /// assert_eq!(guard.lost().await, LostReason::ConnectionClosed);
    /// assert_eq!(guard.release().await, ReleaseOutcome::Lost(LostReason::ConnectionClosed));
    /// # Ok(())
    /// # }
    /// ```
    pub fn lose(&self, key: &str, reason: LostReason) -> bool {
        let mut taken: Vec<Held> = {
            let mut held = self.inner.held_map();
            let tokens = held.tokens_of(key);
            if tokens.is_empty() {
                return false;
            }
            held.remove_tokens(&tokens)
        };
        // Outside the bookkeeping mutex: each key is free before its guard is told.
        for entry in &mut taken {
            entry.end(reason);
        }
        true
    }

    /// Takes this manager's permits of the semaphore `name` away, as a PostgreSQL
    /// manager loses a permit when the session that holds it ends: each permit is free
    /// for others at once, then its guard's [`lost`](locks_port::PermitGuard::lost)
    /// signal fires with `reason`. Returns how many were lost (0 when it holds none).
    /// The manager's locks are kept: a test can lose a member's membership alone (a
    /// [`locks-shard`] member's permit) while its shard locks are held.
    ///
    /// [`locks-shard`]: https://docs.rs/locks-shard
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_memory::InMemoryLockManager;
    /// use locks_memory::locks_port::{DistributedLock, LockGuard, LostReason, PermitGuard, Semaphore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = InMemoryLockManager::new();
    /// let lock = locks.acquire("report", Duration::from_secs(1)).await?;
    /// let permit = locks.acquire_permit("exports", 2, Duration::from_secs(1)).await?;
    /// assert_eq!(locks.lose_permits("exports", LostReason::ConnectionClosed), 1);
    /// assert_eq!(permit.lost().await, LostReason::ConnectionClosed);
    /// assert!(!lock.is_lost());
    /// # Ok(())
    /// # }
    /// ```
    pub fn lose_permits(&self, name: &str, reason: LostReason) -> usize {
        let class = locks_port::PermitDerivation::CURRENT.class(name);
        let taken = self.inner.permits.take_class(class);
        taken.iter().filter(|cell| cell.give_back(reason)).count()
    }

    /// Ends this manager's "session": every lock, group and permit it holds is lost
    /// with `reason` (their `lost()` signals fire with it, their keys and permits are
    /// free at once). Returns how many locks and permits were lost. The manager stays
    /// usable, as a PostgreSQL manager opens new connections after one ends.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_memory::InMemoryLockManager;
    /// use locks_memory::locks_port::{LostReason, PermitGuard, Semaphore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = InMemoryLockManager::new();
    /// let permit = locks.acquire_permit("exports", 2, Duration::from_secs(1)).await?;
    /// assert_eq!(locks.end_session(LostReason::KeepaliveFailed), 1);
    /// assert_eq!(permit.lost().await, LostReason::KeepaliveFailed);
    /// # Ok(())
    /// # }
    /// ```
    pub fn end_session(&self, reason: LostReason) -> usize {
        // Everything is taken out before any lock's signal fires: a holder told of one
        // loss and looking (a shard member ticking at once) sees none of this manager's
        // locks or permits still held, as after a killed process.
        let mut held = self.inner.held_map().drain();
        let permits = self.inner.permits.drain();
        let lost_permits = permits.iter().filter(|cell| cell.give_back(reason)).count();
        for entry in &mut held {
            entry.end(reason);
        }
        let count = held.len() + lost_permits;
        drop(held);
        count
    }

    /// Makes the next acquisition through this manager (`acquire`, `try_acquire`,
    /// `acquire_many`, `acquire_permit`, `try_acquire_permit`) fail with `kind`, once,
    /// without touching any lock: a test can drive its code through the
    /// `Unreachable`, `PoolUnavailable`, `ConnectionLost`… branches. A `Timeout` reads
    /// as a zero-timeout one (`Timeout after 0.0s`); the other kinds say
    /// `Database error: {kind:?}, injected by fail_next_acquire`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_memory::InMemoryLockManager;
    /// use locks_memory::locks_port::{AcquisitionErrorKind, DistributedLock};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let locks = InMemoryLockManager::new();
    /// locks.fail_next_acquire(AcquisitionErrorKind::Unreachable);
    /// let error = locks.acquire("k", Duration::from_secs(1)).await.unwrap_err();
    /// assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable);
    /// assert!(locks.acquire("k", Duration::from_secs(1)).await.is_ok(), "once only");
    /// # }
    /// ```
    pub fn fail_next_acquire(&self, kind: AcquisitionErrorKind) {
        *self
            .inner
            .next_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(kind);
    }
}
