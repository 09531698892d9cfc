//! Cutover step 3: take the cutover lock, and hold it with the write pause so that
//! writes resume before the lock is released.

use locks_port::{DistributedLock, LockAcquisitionError, LockGuard, LostSignal};

use crate::coordinator::{MigrationCoordinator, cutover_lock_key};
use crate::ports::{
    EventStore, Migration, MigrationRepository, PauseGuard, RoutingRepository, WritePause,
};

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// Takes `cutover:{tenant}`, waiting up to the configured lock timeout.
    pub(super) async fn take_cutover_lock(
        &self,
        locks: &L,
        migration: &Migration,
    ) -> Result<L::Guard, LockAcquisitionError> {
        let key = cutover_lock_key(migration.tenant_id);
        locks.acquire(&key, self.cutover_lock_options()).await
    }
}

/// Holds the two things a cutover holds, so that on every path (return, error, panic,
/// the future being dropped) writes resume before the lock is released: fields drop in
/// declaration order, and [`resume_then_release`](Self::resume_then_release) does the
/// same explicitly.
pub(super) struct Held<G, W> {
    pause: Option<W>,
    lock: G,
}

impl<G: LockGuard, W: PauseGuard> Held<G, W> {
    pub(super) fn new(lock: G) -> Self {
        Self { pause: None, lock }
    }

    /// The lock's lost signal: fires if the lock stops being held (its session ended).
    pub(super) fn lost(&self) -> LostSignal {
        self.lock.lost()
    }

    /// Keeps `pause` until the lock is released; the caller works with the reference.
    pub(super) fn hold_pause(&mut self, pause: W) -> &W {
        self.pause.insert(pause)
    }

    /// Resumes writes (if paused), then releases the lock.
    pub(super) async fn resume_then_release(mut self) {
        if let Some(pause) = self.pause.take() {
            pause.resume().await;
            super::step("resumed");
        }
        self.lock.release().await;
    }
}
