//! The lock table managers share: one FIFO semaphore per lock id, of
//! [`READER_PERMITS`] permits: a shared holder takes one, an exclusive holder takes all.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use locks_port::{KeyDerivation, LockMode, Proclamation};
use tokio::sync::Semaphore;

/// The permits of one lock: the most shared holders one key can have at once (more
/// wait, as they would for an exclusive holder). An exclusive holder takes all of them.
pub(crate) const READER_PERMITS: u32 = 1 << 20;

/// The locks of one "database": managers on the same table contend on the same
/// locks, like processes sharing one PostgreSQL server. Cloning shares the table.
///
/// Locks are identified by their lock id ([`KeyDerivation`]), as on the server, so two
/// keys contend exactly when PostgreSQL would make them contend. Each lock is a
/// first-come first-served queue; an entry exists only while someone holds or waits
/// for its lock, so the table does not grow with the number of keys ever used.
///
/// ```
/// use locks_memory::InMemoryLockTable;
///
/// let table = InMemoryLockTable::new();
/// let worker_1 = table.manager_with_holder_id("worker-1");
/// let worker_2 = table.manager_with_holder_id("worker-2");
/// assert!(table.is_empty());
/// # drop((worker_1, worker_2));
/// ```
#[derive(Clone)]
pub struct InMemoryLockTable {
    pub(crate) inner: Arc<TableInner>,
}

pub(crate) struct TableInner {
    derivation: KeyDerivation,
    locks: Mutex<HashMap<i64, Arc<Semaphore>>>,
    /// The counting semaphores (`acquire_permit`), apart from the locks as on the server.
    pub(crate) semaphores: Arc<crate::semaphore_table::Semaphores>,
    /// The leader board: the latest term of each election.
    pub(crate) terms: Terms,
}

impl InMemoryLockTable {
    /// An empty table using [`KeyDerivation::CURRENT`].
    #[must_use]
    pub fn new() -> Self {
        Self::with_key_derivation(KeyDerivation::CURRENT)
    }

    /// An empty table deriving lock ids with `derivation` (every manager on the table
    /// uses it, as every process on one database must).
    #[must_use]
    pub fn with_key_derivation(derivation: KeyDerivation) -> Self {
        Self {
            inner: Arc::new(TableInner {
                derivation,
                locks: Mutex::new(HashMap::new()),
                semaphores: Arc::default(),
                terms: Terms::default(),
            }),
        }
    }

    /// The derivation of this table's lock ids.
    #[must_use]
    pub fn key_derivation(&self) -> KeyDerivation {
        self.inner.derivation
    }

    /// How many locks and semaphores are held or waited for right now (for diagnostics
    /// and tests).
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.lock_map().len() + self.inner.semaphores.len()
    }

    /// Whether no lock is held or waited for.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for InMemoryLockTable {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for InMemoryLockTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryLockTable")
            .field("key_derivation", &self.inner.derivation)
            .field("len", &self.len())
            .finish()
    }
}

impl TableInner {
    /// The map, even if a panic elsewhere poisoned its mutex (no critical section here
    /// can leave it inconsistent).
    fn lock_map(&self) -> MutexGuard<'_, HashMap<i64, Arc<Semaphore>>> {
        self.locks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lock_id(&self, key: &str) -> i64 {
        self.derivation.lock_id(key)
    }
}

/// A use of one lock's table entry: held by each waiter and each holder. When the last
/// use goes away, the entry is removed.
///
/// Every `Arc` clone of an entry's semaphore is created and dropped under the table's
/// mutex, so "only the table and this slot hold it" is decided without races.
pub(crate) struct Slot {
    table: Arc<TableInner>,
    lock_id: i64,
    semaphore: Option<Arc<Semaphore>>,
}

impl Slot {
    /// Joins the entry of `lock_id`, creating it if nobody uses it.
    pub(crate) fn join(table: &Arc<TableInner>, lock_id: i64) -> Self {
        let semaphore = Arc::clone(
            table
                .lock_map()
                .entry(lock_id)
                .or_insert_with(|| Arc::new(Semaphore::new(READER_PERMITS as usize))),
        );
        Self {
            table: Arc::clone(table),
            lock_id,
            semaphore: Some(semaphore),
        }
    }

    /// The lock id of the entry.
    pub(crate) fn lock_id(&self) -> i64 {
        self.lock_id
    }

    pub(crate) fn semaphore(&self) -> &Semaphore {
        // Only `drop` takes it out.
        self.semaphore
            .as_deref()
            .unwrap_or_else(|| unreachable!("a slot's semaphore is only taken by drop"))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = self.table.lock_map();
        if let Some(semaphore) = self.semaphore.take() {
            let last_use = map.get(&self.lock_id).is_some_and(|entry| {
                Arc::ptr_eq(entry, &semaphore) && Arc::strong_count(entry) == 2
            });
            if last_use {
                map.remove(&self.lock_id);
            }
            drop(semaphore);
        }
    }
}

/// The held permits of a lock: returns them when dropped, then leaves the entry.
pub(crate) struct HeldPermit {
    slot: Slot,
    permits: u32,
}

impl HeldPermit {
    /// Wraps a slot whose `permits` were acquired and forgotten.
    pub(crate) fn new(slot: Slot, permits: u32) -> Self {
        Self { slot, permits }
    }

    /// The lock id of the held lock.
    pub(crate) fn lock_id(&self) -> i64 {
        self.slot.lock_id()
    }

    /// How the lock is held: exclusive while the hold has every permit.
    pub(crate) fn mode(&self) -> LockMode {
        if self.permits == READER_PERMITS {
            LockMode::Exclusive
        } else {
            LockMode::Shared
        }
    }

    /// Keeps one permit and gives the rest back (an exclusive hold becomes a shared
    /// one): the readers first in the queue get in; a writer first in it still waits.
    pub(crate) fn downgrade(&mut self) {
        let extra = self.permits.saturating_sub(1);
        self.permits -= extra;
        self.slot.semaphore().add_permits(extra as usize);
    }

    /// Gives every permit back now (the key is free for the next holder); dropping it
    /// afterwards gives nothing more back.
    pub(crate) fn give_up(&mut self) {
        let permits = std::mem::take(&mut self.permits);
        self.slot.semaphore().add_permits(permits as usize);
    }

    /// Takes the permits a shared hold lacks, if they are free now (an exclusive hold
    /// then); whether the hold is exclusive. Never waits: with other readers in, or a
    /// writer queued (it has taken every permit given back since it queued), the hold
    /// stays as it is.
    pub(crate) fn try_upgrade(&mut self) -> bool {
        let missing = READER_PERMITS - self.permits;
        if missing == 0 {
            return true;
        }
        match self.slot.semaphore().try_acquire_many(missing) {
            Ok(permits) => {
                permits.forget();
                self.permits = READER_PERMITS;
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for HeldPermit {
    fn drop(&mut self) {
        // Hands the lock to the first waiter, if any; `slot` is dropped after this,
        // leaving the entry (and removing it if nobody else uses it).
        self.slot.semaphore().add_permits(self.permits as usize);
    }
}

/// The latest term of each election name.
#[derive(Debug, Default)]
pub(crate) struct Terms(Mutex<HashMap<String, Proclamation>>);

impl Terms {
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Proclamation>) -> T) -> T {
        // No critical section here can leave the map inconsistent.
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}
