//! The counting semaphores' state on the shared table: one entry of N permits per
//! semaphore class while someone holds or waits for one, the cells of held permits, and
//! each manager's list of the permits it holds (so its "session" can end them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use locks_port::LossNotifier;
use tokio::sync::Semaphore as Permits;

/// The semaphores of one table, by class (two names of one class share permits, as on
/// PostgreSQL). An entry lives while someone holds or waits for one of its permits.
#[derive(Default)]
pub(crate) struct Semaphores {
    entries: Mutex<HashMap<i32, Arc<Entry>>>,
}

/// Who holds one slot (its holder id) and since when; `None` while free.
pub(crate) type Slots = Vec<Option<(Option<String>, SystemTime)>>;

/// One semaphore: its permits, its FIFO queue and who holds each slot.
pub(crate) struct Entry {
    pub(crate) permits: u32,
    pub(crate) queue: Permits,
    /// Who holds each slot, and since when.
    slots: Mutex<Slots>,
    /// Holders and waiters: the entry goes when the last leaves.
    users: AtomicUsize,
    pub(crate) waiting: AtomicUsize,
}

impl Semaphores {
    fn map(&self) -> MutexGuard<'_, HashMap<i32, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the entry of `class` for `permits`, or says which N is in use.
    pub(crate) fn join(self: &Arc<Self>, class: i32, permits: u32) -> Result<Use, u32> {
        let mut map = self.map();
        let entry = map.entry(class).or_insert_with(|| {
            Arc::new(Entry {
                permits,
                queue: Permits::new(permits as usize),
                slots: Mutex::new(vec![None; permits as usize]),
                users: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
            })
        });
        if entry.permits != permits {
            return Err(entry.permits);
        }
        entry.users.fetch_add(1, Ordering::SeqCst);
        Ok(Use {
            semaphores: Arc::clone(self),
            class,
            entry: Arc::clone(entry),
        })
    }

    /// The entry of `class`, while someone holds or waits for one of its permits.
    pub(crate) fn get(&self, class: i32) -> Option<Arc<Entry>> {
        self.map().get(&class).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}

/// A holder's or waiter's use of an entry; the last one removes it.
pub(crate) struct Use {
    semaphores: Arc<Semaphores>,
    class: i32,
    pub(crate) entry: Arc<Entry>,
}

impl Drop for Use {
    fn drop(&mut self) {
        let mut map = self.semaphores.map();
        if self.entry.users.fetch_sub(1, Ordering::SeqCst) == 1 {
            map.remove(&self.class);
        }
    }
}

impl Entry {
    pub(crate) fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A held permit, shared by its guard and its manager (whose `end_session` can take it).
pub(crate) struct PermitCell {
    taken: Mutex<Option<Use>>,
    slot: u32,
    notifier: LossNotifier,
}

impl PermitCell {
    /// The cell of the permit `taken` holds, in `slot`; `notifier` tells its guard.
    pub(crate) fn new(taken: Use, slot: u32, notifier: LossNotifier) -> Self {
        Self {
            taken: Mutex::new(Some(taken)),
            slot,
            notifier,
        }
    }

    /// The semaphore class of the permit, while it is held.
    fn class(&self) -> Option<i32> {
        (self.taken.lock().unwrap_or_else(PoisonError::into_inner))
            .as_ref()
            .map(|taken| taken.class)
    }

    /// Gives the permit back, then tells its guard `reason` (as a lock's key is free
    /// before its guard is told); `false` when it was given back already.
    pub(crate) fn give_back(&self, reason: locks_port::LostReason) -> bool {
        let taken = self
            .taken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(taken) = taken else {
            return false;
        };
        if let Some(place) = taken.entry.slots().get_mut(self.slot as usize) {
            *place = None;
        }
        taken.entry.queue.add_permits(1);
        self.notifier.notify(reason);
        true
    }
}

/// The permits held through one manager, by acquisition token.
#[derive(Default)]
pub(crate) struct LivePermits {
    map: Mutex<HashMap<u64, Arc<PermitCell>>>,
}

impl LivePermits {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<PermitCell>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn insert(&self, token: u64, cell: Arc<PermitCell>) {
        self.map().insert(token, cell);
    }

    pub(crate) fn remove(&self, token: u64) {
        self.map().remove(&token);
    }

    pub(crate) fn drain(&self) -> Vec<Arc<PermitCell>> {
        self.map().drain().map(|(_, cell)| cell).collect()
    }

    /// Takes out the permits of the semaphore `class`.
    pub(crate) fn take_class(&self, class: i32) -> Vec<Arc<PermitCell>> {
        let mut map = self.map();
        let tokens: Vec<u64> = (map.iter())
            .filter(|(_, cell)| cell.class() == Some(class))
            .map(|(token, _)| *token)
            .collect();
        (tokens.iter())
            .filter_map(|token| map.remove(token))
            .collect()
    }
}
