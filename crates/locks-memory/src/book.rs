//! One manager's bookkeeping: the locks it holds, by key, each with the acquisition
//! token its guard releases by, and the permits it holds; what guards, groups, permits
//! and the manager's own API share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use locks_port::{
    AcquisitionErrorKind, LockAcquisitionError, LockInfo, LockMode, LossNotifier, LostReason,
    LostSignal, ReleaseOutcome,
};

use crate::semaphore_table::LivePermits;
use crate::table::{HeldPermit, InMemoryLockTable};

/// The state of one manager (and its clones), shared with its guards.
pub(crate) struct ManagerInner {
    pub(crate) table: InMemoryLockTable,
    holder_id: Option<String>,
    next_token: AtomicU64,
    held: Mutex<HashMap<String, Held>>,
    /// The permits held through this manager, so its "session" can end them.
    pub(crate) permits: LivePermits,
    /// The failure the next acquisition returns (see `fail_next_acquire`).
    pub(crate) next_failure: Mutex<Option<AcquisitionErrorKind>>,
}

/// One lock this manager holds.
pub(crate) struct Held {
    /// Which acquisition this is: a guard only releases the acquisition it came from.
    pub(crate) token: u64,
    /// Tells the guard when the lock is taken away.
    pub(crate) notifier: LossNotifier,
    /// Dropping it releases the lock.
    permit: HeldPermit,
    /// When it was granted (its guard's `acquired_at`), for the error of a wait on it.
    since: SystemTime,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.notifier.notify(LostReason::Released);
    }
}

/// What a guard's release reports when its lock was no longer booked: `Lost(reason)`
/// after a loss, `AlreadyReleased` after the manager's `release`/`release_all`.
pub(crate) fn not_released(lost: &LostSignal) -> ReleaseOutcome {
    match lost.reason() {
        Some(reason) if reason != LostReason::Released => ReleaseOutcome::Lost(reason),
        _ => ReleaseOutcome::AlreadyReleased,
    }
}

impl ManagerInner {
    /// An empty book on `table`.
    pub(crate) fn new(table: InMemoryLockTable, holder_id: Option<String>) -> Self {
        Self {
            table,
            holder_id,
            next_token: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            permits: LivePermits::default(),
            next_failure: Mutex::new(None),
        }
    }

    /// The label put in every [`LockInfo`] this manager hands out.
    pub(crate) fn holder_id(&self) -> Option<&str> {
        self.holder_id.as_deref()
    }

    /// The bookkeeping, even if a panic elsewhere poisoned its mutex.
    pub(crate) fn held_map(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new acquisition's token: its guard releases only what was booked with it.
    pub(crate) fn next_token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    /// What a guard says of the lock of `key` taken now in `mode`.
    pub(crate) fn info(&self, key: &str, lock_id: i64, mode: LockMode) -> LockInfo {
        LockInfo::acquired_now(key, lock_id, self.holder_id.clone()).with_mode(mode)
    }

    /// Books the taken `permit` of `key` (granted as `info` says) for the acquisition
    /// `token`; `notifier` is told when the entry goes.
    pub(crate) fn insert(
        &self,
        info: &LockInfo,
        token: u64,
        notifier: LossNotifier,
        permit: HeldPermit,
    ) {
        let key = info.key();
        let held = Held {
            token,
            notifier,
            permit,
            since: info.acquired_at_system_time(),
        };
        // A manager books a key only while holding its lock, so no entry can be there;
        // if one were, dropping it would release its permit, never leak it.
        let previous = self.held_map().insert(key.to_owned(), held);
        drop(previous);
    }

    /// The timeout of a wait in `mode` for `key` that lasted `timeout`, saying so when
    /// this manager holds `key` itself in a mode that excludes `mode` (as the PostgreSQL
    /// manager's error does).
    pub(crate) fn timed_out(
        &self,
        key: &str,
        mode: LockMode,
        timeout: Duration,
    ) -> LockAcquisitionError {
        let error = LockAcquisitionError::timed_out(key, timeout);
        let held = self
            .held_map()
            .get(key)
            .map(|held| (held.permit.mode(), held.since));
        match held {
            Some((held_mode, since))
                if mode == LockMode::Exclusive || held_mode == LockMode::Exclusive =>
            {
                error.held_by_this_manager(held_mode, since, self.holder_id())
            }
            _ => error,
        }
    }

    /// Downgrades `key` to shared if it is still booked for the acquisition `token`;
    /// whether it was.
    pub(crate) fn downgrade_token(&self, key: &str, token: u64) -> bool {
        match self.held_map().get_mut(key) {
            Some(entry) if entry.token == token => {
                entry.permit.downgrade();
                true
            }
            _ => false,
        }
    }

    /// Upgrades `key` to exclusive if it is still booked for the acquisition `token` and
    /// the permits are free now: `None` when it is not booked, else whether it is
    /// exclusive now.
    pub(crate) fn try_upgrade_token(&self, key: &str, token: u64) -> Option<bool> {
        match self.held_map().get_mut(key) {
            Some(entry) if entry.token == token => Some(entry.permit.try_upgrade()),
            _ => None,
        }
    }

    /// Releases `key` if it is still booked for the acquisition `token`.
    pub(crate) fn release_token(&self, key: &str, token: u64) -> bool {
        let removed = {
            let mut held = self.held_map();
            match held.get(key) {
                Some(entry) if entry.token == token => held.remove(key),
                _ => None,
            }
        };
        // Dropped outside the bookkeeping mutex: hands the lock on, leaves the table.
        removed.is_some()
    }
}
