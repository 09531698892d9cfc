//! The lock manager type of a coordinator built without one.

use std::future::Future;

use locks_port::{
    AcquireOptions, DistributedLock, LockAcquisitionError, LockGuard, LockInfo, LockMode,
    LockNotHeldError, LostSignal, ReleaseOutcome,
};

/// The lock manager of a coordinator built with
/// [`MigrationCoordinator::without_lock_manager`](crate::MigrationCoordinator::without_lock_manager):
/// a type with no values, so no lock can ever be asked of it. Such a coordinator copies
/// and dual-writes, and refuses `cutover` with
/// [`MigrationError::LockManagerRequired`](crate::MigrationError::LockManagerRequired).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoLockManager {}

/// The guard type of [`NoLockManager`]; has no values either.
#[derive(Debug)]
pub enum NoLockGuard {}

// The `ready(match … {})` bodies cannot run: there is no value to call them on.
#[allow(unreachable_code)]
impl LockGuard for NoLockGuard {
    fn info(&self) -> &LockInfo {
        match *self {}
    }

    fn lost(&self) -> LostSignal {
        match *self {}
    }

    fn release(self) -> impl Future<Output = ReleaseOutcome> + Send {
        std::future::ready::<ReleaseOutcome>(match self {})
    }

    fn into_held(self) -> LockInfo {
        match self {}
    }
}

#[allow(unreachable_code)]
impl DistributedLock for NoLockManager {
    type Guard = NoLockGuard;

    fn acquire(
        &self,
        _key: &str,
        _options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<Self::Guard, LockAcquisitionError>> + Send {
        std::future::ready::<Result<NoLockGuard, LockAcquisitionError>>(match *self {})
    }

    fn try_acquire_with(
        &self,
        _key: &str,
        _mode: LockMode,
    ) -> impl Future<Output = Result<Option<Self::Guard>, LockAcquisitionError>> + Send {
        std::future::ready::<Result<Option<NoLockGuard>, LockAcquisitionError>>(match *self {})
    }

    fn release(&self, _key: &str) -> impl Future<Output = Result<(), LockNotHeldError>> + Send {
        std::future::ready::<Result<(), LockNotHeldError>>(match *self {})
    }

    fn is_held(&self, _key: &str) -> bool {
        match *self {}
    }
}
