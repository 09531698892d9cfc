//! The guard of a lock held through an [`InMemoryLockManager`](crate::InMemoryLockManager).

use std::fmt;
use std::sync::Arc;

use locks_port::{
    LockError, LockGuard, LockInfo, LockLostError, LockMode, LostReason, LostSignal, ReleaseOutcome,
};

use crate::book::{ManagerInner, not_released};

/// A lock held through an [`InMemoryLockManager`](crate::InMemoryLockManager).
///
/// Dropping it releases the lock at once, synchronously: no runtime is needed, so a
/// guard may be dropped anywhere, after its runtime is gone included.
/// [`release`](LockGuard::release) does the same and reports
/// [`ReleaseOutcome::Unlocked`], [`ReleaseOutcome::AlreadyReleased`] when
/// `release(key)` or `release_all` got there first, or [`ReleaseOutcome::Lost`] after
/// [`lose`](crate::InMemoryLockManager::lose) or
/// [`end_session`](crate::InMemoryLockManager::end_session). A guard only ever releases the
/// acquisition it came from, never a later acquisition of the same key.
#[must_use = "dropping the guard releases the lock at once"]
pub struct InMemoryLockGuard {
    manager: Arc<ManagerInner>,
    token: u64,
    info: LockInfo,
    lost: LostSignal,
    /// False once the lock was released or handed to the manager.
    armed: bool,
}

impl InMemoryLockGuard {
    pub(crate) fn new(
        manager: Arc<ManagerInner>,
        token: u64,
        info: LockInfo,
        lost: LostSignal,
    ) -> Self {
        Self {
            manager,
            token,
            info,
            lost,
            armed: true,
        }
    }

    fn release_now(&mut self) -> ReleaseOutcome {
        if std::mem::replace(&mut self.armed, false)
            && self.manager.release_token(self.info.key(), self.token)
        {
            ReleaseOutcome::Unlocked
        } else {
            not_released(&self.lost)
        }
    }
}

impl LockGuard for InMemoryLockGuard {
    fn info(&self) -> &LockInfo {
        &self.info
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Releases the lock now and reports how.
    ///
    /// # Cancel safety
    /// The release happens on the first poll, without waiting; a future dropped
    /// before it is polled drops the guard, which releases the lock too.
    async fn release(mut self) -> ReleaseOutcome {
        self.release_now()
    }

    fn into_held(mut self) -> LockInfo {
        self.armed = false;
        self.info.clone()
    }

    /// Keeps one of the lock's permits and gives the others back: readers queued
    /// first get in at once (a writer queued first still waits for this reader).
    ///
    /// # Cancel safety
    /// Done on the first poll, without waiting.
    async fn downgrade(&mut self) -> Result<(), LockError> {
        if !(self.armed && self.manager.downgrade_token(self.info.key(), self.token)) {
            let reason = self.lost.reason().unwrap_or(LostReason::Released);
            return Err(LockLostError::new(self.info.key(), reason).into());
        }
        self.info = self.info.clone().with_mode(LockMode::Shared);
        Ok(())
    }

    /// Takes the permits a shared hold lacks if they are free now: not while another
    /// reader holds one, nor while a writer is queued (it holds every permit given back
    /// since it queued, as PostgreSQL 13 to 16 let a queued writer go first; 17 and later
    /// upgrade the reader ahead of it).
    ///
    /// # Cancel safety
    /// Done on the first poll, without waiting.
    async fn try_upgrade(&mut self) -> Result<bool, LockError> {
        let upgraded = self
            .armed
            .then(|| self.manager.try_upgrade_token(self.info.key(), self.token));
        let Some(upgraded) = upgraded.flatten() else {
            let reason = self.lost.reason().unwrap_or(LostReason::Released);
            return Err(LockLostError::new(self.info.key(), reason).into());
        };
        if upgraded {
            self.info = self.info.clone().with_mode(LockMode::Exclusive);
        }
        Ok(upgraded)
    }
}

impl Drop for InMemoryLockGuard {
    fn drop(&mut self) {
        self.release_now();
    }
}

impl fmt::Debug for InMemoryLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryLockGuard")
            .field("key", &self.info.key())
            .field("lock_id", &self.info.lock_id())
            .field("token", &self.token)
            .field("armed", &self.armed)
            .finish()
    }
}
