//! One manager's bookkeeping: the locks it holds, by key, each with the acquisition
//! token its guard releases by, and the permits it holds; what guards, groups, permits
//! and the manager's own API share. A key may be held more than once (shared locks
//! taken twice through one manager), as the PostgreSQL manager holds each on a session
//! of its own: every acquisition is an entry of its own.

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
    held: Mutex<Book>,
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

impl Held {
    /// Frees the key, then tells the guard `reason`: the order of a PostgreSQL session's
    /// end, where the server frees the lock and the client hears of it after, so a guard
    /// told of its loss finds the key free for anyone (itself included) at once.
    pub(crate) fn end(&mut self, reason: LostReason) {
        self.permit.give_up();
        self.notifier.notify(reason);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Told `Released` unless `end` told it something first (the first reason stays).
        self.end(LostReason::Released);
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
            held: Mutex::new(Book::default()),
            permits: LivePermits::default(),
            next_failure: Mutex::new(None),
        }
    }

    /// The label put in every [`LockInfo`] this manager hands out.
    pub(crate) fn holder_id(&self) -> Option<&str> {
        self.holder_id.as_deref()
    }

    /// The bookkeeping, even if a panic elsewhere poisoned its mutex.
    pub(crate) fn held_map(&self) -> MutexGuard<'_, Book> {
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
        self.held_map().insert(key, held);
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
        let excluding = self
            .held_map()
            .of(key)
            .iter()
            .map(|held| (held.permit.mode(), held.since))
            .find(|&(held_mode, _)| {
                mode == LockMode::Exclusive || held_mode == LockMode::Exclusive
            });
        match excluding {
            Some((held_mode, since)) => {
                error.held_by_this_manager(held_mode, since, self.holder_id())
            }
            None => error,
        }
    }

    /// Downgrades `key` to shared if it is still booked for the acquisition `token`;
    /// whether it was.
    pub(crate) fn downgrade_token(&self, key: &str, token: u64) -> bool {
        match self.held_map().entry(key, token) {
            Some(entry) => {
                entry.permit.downgrade();
                true
            }
            None => false,
        }
    }

    /// Upgrades `key` to exclusive if it is still booked for the acquisition `token` and
    /// the permits are free now: `None` when it is not booked, else whether it is
    /// exclusive now.
    pub(crate) fn try_upgrade_token(&self, key: &str, token: u64) -> Option<bool> {
        self.held_map()
            .entry(key, token)
            .map(|entry| entry.permit.try_upgrade())
    }

    /// Releases `key` if it is still booked for the acquisition `token`.
    pub(crate) fn release_token(&self, key: &str, token: u64) -> bool {
        let removed = self.held_map().remove_token(key, token);
        // Dropped outside the bookkeeping mutex: hands the lock on, leaves the table.
        removed.is_some()
    }
}

/// The locks a manager holds: every acquisition's entry, by key (one key may have
/// several, each released by its own token). No key is left with an empty list.
#[derive(Default)]
pub(crate) struct Book(HashMap<String, Vec<Held>>);

impl Book {
    /// Books `held` for `key`, beside any other hold of it.
    fn insert(&mut self, key: &str, held: Held) {
        self.0.entry(key.to_owned()).or_default().push(held);
    }

    /// Every hold of `key`.
    fn of(&self, key: &str) -> &[Held] {
        self.0.get(key).map_or(&[], Vec::as_slice)
    }

    /// The hold of `key` booked for the acquisition `token`.
    fn entry(&mut self, key: &str, token: u64) -> Option<&mut Held> {
        self.0
            .get_mut(key)?
            .iter_mut()
            .find(|held| held.token == token)
    }

    /// Takes the hold of `key` booked for the acquisition `token` out of the book.
    pub(crate) fn remove_token(&mut self, key: &str, token: u64) -> Option<Held> {
        let holds = self.0.get_mut(key)?;
        let at = holds.iter().position(|held| held.token == token)?;
        let held = holds.swap_remove(at);
        if holds.is_empty() {
            self.0.remove(key);
        }
        Some(held)
    }

    /// Takes every hold of `key` out of the book.
    pub(crate) fn remove_key(&mut self, key: &str) -> Vec<Held> {
        self.0.remove(key).unwrap_or_default()
    }

    /// Whether `key` is held at all.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// How many holds there are, counting each acquisition of a key.
    pub(crate) fn len(&self) -> usize {
        self.0.values().map(Vec::len).sum()
    }

    /// The tokens of every hold of `key`.
    pub(crate) fn tokens_of(&self, key: &str) -> Vec<u64> {
        self.of(key).iter().map(|held| held.token).collect()
    }

    /// Takes every hold booked with one of `tokens` (a group's keys share its token).
    pub(crate) fn remove_tokens(&mut self, tokens: &[u64]) -> Vec<Held> {
        let mut taken = Vec::new();
        self.0.retain(|_, holds| {
            let (gone, kept): (Vec<Held>, Vec<Held>) = std::mem::take(holds)
                .into_iter()
                .partition(|held| tokens.contains(&held.token));
            taken.extend(gone);
            *holds = kept;
            !holds.is_empty()
        });
        taken
    }

    /// Takes every hold out of the book.
    pub(crate) fn drain(&mut self) -> Vec<Held> {
        self.0.drain().flat_map(|(_, holds)| holds).collect()
    }
}
