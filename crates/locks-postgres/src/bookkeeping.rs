//! What a manager holds: one entry per held key, with the session that holds it and
//! the notifier of its guard's lost signal; registering a grant and taking entries out
//! (the unlock that follows is a floor up, in `release.rs`).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hashbrown::HashTable;

use locks_port::{LockInfo, LockMode, LossNotifier};
use smallvec::SmallVec;

use crate::metrics::Metrics;
use crate::multiplex::Membership;
use crate::slot::SessionSlot;

/// How a held lock owns its session.
pub(crate) enum Holding {
    /// The session is the lock's own: the unlock gives it back.
    Alone,
    /// The session holds the locks of one `acquire_many`: the last unlock gives it back.
    Group(Arc<Group>),
    /// A shared connection (multiplexing), at the lock's place there: the connection
    /// goes back when its last lock leaves.
    Shared(Membership),
}

/// The bookkeeping entry of one held lock. Made by [`Held::new`] only.
pub(crate) struct Held {
    /// The key, shared with the guard's [`LockInfo`]: booking a grant copies none.
    key: Arc<str>,
    /// The acquisition's bookkeeping ticket (not a fencing token).
    ticket: u64,
    lock_id: i64,
    mode: LockMode,
    /// When it was granted (its guard's `acquired_at`, as the clock read it), in
    /// nanoseconds since the Unix epoch (8 bytes, not a `SystemTime`'s 16), for the
    /// error of a wait on a key this manager holds.
    since_ns: u64,
    slot: SessionSlot,
    notifier: LossNotifier,
    holding: Holding,
}

impl Held {
    /// The entry of the grant `info` describes (its lock id and mode; `key` is its key,
    /// shared; `granted` the reading its time came from), of the acquisition with
    /// `ticket`.
    pub(crate) fn new(
        key: Arc<str>,
        ticket: u64,
        info: &LockInfo,
        granted: Granted,
        slot: SessionSlot,
        notifier: LossNotifier,
        holding: Holding,
    ) -> Self {
        debug_assert_eq!(info.acquired_at_system_time(), granted.at);
        Self {
            key,
            ticket,
            lock_id: info.lock_id(),
            mode: info.mode(),
            since_ns: granted.since_ns,
            slot,
            notifier,
            holding,
        }
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// When it was granted.
    pub(crate) fn since(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.since_ns)
    }

    pub(crate) fn lock_id(&self) -> i64 {
        self.lock_id
    }

    pub(crate) fn mode(&self) -> LockMode {
        self.mode
    }

    pub(crate) fn slot(&self) -> &SessionSlot {
        &self.slot
    }

    pub(crate) fn notifier(&self) -> &LossNotifier {
        &self.notifier
    }

    /// The lock's place on a shared connection; `None` when it holds a connection of
    /// its own (alone or in a group).
    pub(crate) fn place(&mut self) -> Option<&mut Membership> {
        match &mut self.holding {
            Holding::Shared(member) => Some(member),
            Holding::Alone | Holding::Group(_) => None,
        }
    }

    /// Which acquisition this is, to find its entry again.
    pub(crate) fn ticket(&self) -> Ticket {
        Ticket {
            lock_id: self.lock_id,
            number: self.ticket,
        }
    }

    /// Records that the lock's unlock is about to be sent (a place on a shared
    /// connection then counts it in flight until it leaves).
    pub(crate) fn unlocking(&mut self) {
        if let Holding::Shared(member) = &mut self.holding {
            member.unlocking();
        }
    }

    /// Leaves the session, unlocked or gone: `true` when it now holds nothing of
    /// this manager (the caller, holding the slot, gives it back or closes it).
    pub(crate) fn leave_session(&mut self) -> bool {
        match &mut self.holding {
            Holding::Alone => true,
            Holding::Group(group) => group.left.fetch_sub(1, Ordering::AcqRel) == 1,
            Holding::Shared(member) => member.leave(),
        }
    }
}

/// When a lock was granted: one reading of the system clock, as the guard's
/// `acquired_at` and as its book entry's nanoseconds since the Unix epoch. On Linux
/// `CLOCK_REALTIME` (the clock of [`SystemTime`]) is read directly and both are made
/// from its seconds and nanoseconds: converting a `SystemTime` with std's
/// `duration_since` cost the lock cycle about 115 instructions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Granted {
    at: SystemTime,
    since_ns: u64,
}

impl Granted {
    /// Now.
    pub(crate) fn now() -> Self {
        #[cfg(target_os = "linux")]
        if let Some(granted) = Self::read_realtime() {
            return granted;
        }
        let at = SystemTime::now();
        Self {
            at,
            since_ns: nanos_since_epoch(at),
        }
    }

    /// `CLOCK_REALTIME`, read directly; `None` if it cannot be read or is before the
    /// epoch or past 2554 (then [`now`](Self::now) reads `SystemTime`).
    #[cfg(target_os = "linux")]
    fn read_realtime() -> Option<Self> {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME).ok()?;
        let secs = u64::try_from(now.tv_sec()).ok()?;
        let nanos = u32::try_from(now.tv_nsec())
            .ok()
            .filter(|&nanos| nanos < 1_000_000_000)?;
        let since_ns = secs
            .checked_mul(1_000_000_000)?
            .checked_add(u64::from(nanos))?;
        let at = UNIX_EPOCH.checked_add(Duration::new(secs, nanos))?;
        Some(Self { at, since_ns })
    }

    /// The guard's description of a grant at this time.
    pub(crate) fn info(self, key: Arc<str>, lock_id: i64, holder_id: Option<String>) -> LockInfo {
        LockInfo::acquired_at_system_time_of(key, lock_id, self.at, holder_id)
    }
}

/// `at` in nanoseconds since the Unix epoch (0 before it, `u64::MAX` past the year
/// 2554): exact for any clock reading of today.
fn nanos_since_epoch(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

/// The locks of one `acquire_many`, held on one session under one ticket and one lost
/// signal.
pub(crate) struct Group {
    /// How many of the group are still held: the session goes back to the pool with
    /// the last unlock.
    left: AtomicUsize,
    /// The lock ids of the group: a lost session takes every one of them out of the
    /// bookkeeping before the group's signal fires.
    lock_ids: Box<[i64]>,
}

impl Group {
    pub(crate) fn new(lock_ids: Box<[i64]>) -> Self {
        Self {
            left: AtomicUsize::new(lock_ids.len()),
            lock_ids,
        }
    }

    pub(crate) fn lock_ids(&self) -> &[i64] {
        &self.lock_ids
    }
}

/// One acquisition, as the health monitor finds it again.
#[derive(Clone, Debug)]
pub(crate) struct Ticket {
    pub(crate) lock_id: i64,
    pub(crate) number: u64,
}

/// Entries taken out of the book together (one lock id's, a group's), or that a grant
/// displaced: almost always one, kept inline (no allocation).
pub(crate) type Entries = SmallVec<[Held; 1]>;

/// Every lock one manager holds: the entries side by side in one vector, and a table
/// of their places by the hash of their lock id: what the server locks, and a number to
/// hash, where a key is a string (the lock id of a key is known on every path that looks
/// it up). An id has one entry, or several when the manager holds it shared more than
/// once (one per guard), or, by a 64-bit collision, holds another key of the same id
/// (the server sees one lock): their places sit side by side under one hash. The table's
/// slack (a hash table grows before it is full: up to 2.3 slots a held lock) costs a
/// place's 4 bytes and a control byte a slot, not an entry's size; the vector's at most
/// doubles (bytes a held lock: `docs/benchmarks.md`). Taking an entry out moves the last
/// one into its place. Every change of the count is told to the locks-held instrument.
pub(crate) struct Book {
    /// The entries on a connection of their own (alone or in a group) first, then those
    /// on shared connections (multiplexing): `entries[..own]` and `entries[own..]`.
    entries: Vec<Held>,
    /// How many entries come first, on connections of their own.
    own: usize,
    /// The shared connections that hold entries, by the address of their slot: the slot
    /// and how many entries it holds. The monitor looks at each once a round, without
    /// walking their locks (ADR 0029).
    shared: HashMap<usize, (SessionSlot, usize), foldhash::fast::RandomState>,
    /// The index in `entries` of each entry, by the hash of its lock id.
    places: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    metrics: Arc<Metrics>,
    /// The lock ids whose unlock runs in the background now (once per unlock), with
    /// [`release_in_background`](crate::PostgresLockManagerBuilder::release_in_background).
    releasing: Vec<i64>,
}

/// An index of `entries` as a place in the table.
fn place(index: usize) -> u32 {
    // 2³² entries would take over 300 GB: the process runs out of memory long before.
    u32::try_from(index).expect("a manager holds fewer than 2^32 locks")
}

impl Book {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            entries: Vec::new(),
            own: 0,
            shared: HashMap::default(),
            places: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            metrics,
            releasing: Vec::new(),
        }
    }

    fn hash(&self, lock_id: i64) -> u64 {
        self.hasher.hash_one(lock_id)
    }

    /// The entries of `lock_id`.
    fn of(&self, lock_id: i64) -> impl Iterator<Item = &Held> {
        self.places
            .iter_hash(self.hash(lock_id))
            .map(|&at| &self.entries[at as usize])
            .filter(move |held| held.lock_id == lock_id)
    }

    /// The index of the first entry of `lock_id` that `which` picks.
    fn find(&self, lock_id: i64, mut which: impl FnMut(&Held) -> bool) -> Option<usize> {
        let entries = &self.entries;
        self.places
            .find(self.hash(lock_id), |&at| {
                let held = &entries[at as usize];
                held.lock_id == lock_id && which(held)
            })
            .map(|&at| at as usize)
    }

    /// Takes out the first entry of `lock_id` that `which` picks: its place out of the
    /// table, and the last entry moved into its index.
    fn take(&mut self, lock_id: i64, mut which: impl FnMut(&Held) -> bool) -> Option<Held> {
        let hash = self.hash(lock_id);
        let entries = &self.entries;
        let (at, _) = self
            .places
            .find_entry(hash, |&at| {
                let held = &entries[at as usize];
                held.lock_id == lock_id && which(held)
            })
            .ok()?
            .remove();
        let mut at = at as usize;
        if at < self.own {
            // Keep the entries on connections of their own first: the last of them
            // takes this one's index, and this one leaves from the end of their run.
            let last_own = self.own - 1;
            self.entries.swap(at, last_own);
            self.relocated(last_own, at);
            at = last_own;
            self.own = last_own;
        }
        let taken = self.entries.swap_remove(at);
        self.relocated(self.entries.len(), at);
        if matches!(taken.holding, Holding::Shared(_)) {
            self.left_shared(&taken.slot);
        }
        self.metrics.held_changed(taken.mode, -1);
        Some(taken)
    }

    /// The entry now at index `to` was at index `from`: its place in the table follows.
    /// Nothing to do when `to` is past the end or equals `from`.
    fn relocated(&mut self, from: usize, to: usize) {
        if from == to {
            return;
        }
        let Some(moved) = self.entries.get(to) else {
            return;
        };
        let (from, to) = (place(from), place(to));
        if let Some(its) = self
            .places
            .find_mut(self.hasher.hash_one(moved.lock_id), |&i| i == from)
        {
            *its = to;
        }
    }

    /// An entry on the shared connection in `slot` left the book.
    fn left_shared(&mut self, slot: &SessionSlot) {
        let address = Arc::as_ptr(slot).addr();
        if let Some((_, count)) = self.shared.get_mut(&address) {
            *count -= 1;
            if *count == 0 {
                self.shared.remove(&address);
            }
        }
    }

    /// An unlock of `lock_id` was handed to its connection; its answer is not read yet.
    pub(crate) fn releasing(&mut self, lock_id: i64) {
        self.releasing.push(lock_id);
    }

    /// The unlock of `lock_id` said [`releasing`](Self::releasing) is over.
    pub(crate) fn released(&mut self, lock_id: i64) {
        if let Some(at) = self.releasing.iter().position(|id| *id == lock_id) {
            self.releasing.swap_remove(at);
        }
    }

    /// Whether an unlock of `lock_id` runs in the background.
    pub(crate) fn is_releasing(&self, lock_id: i64) -> bool {
        self.releasing.contains(&lock_id)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `key` (whose lock id is `lock_id`) is held.
    pub(crate) fn contains(&self, key: &str, lock_id: i64) -> bool {
        self.of(lock_id).any(|held| *held.key == *key)
    }

    /// How this manager holds `key` (whose lock id is `lock_id`) when that hold
    /// excludes a request in `mode`: the hold's mode and when it was granted. An
    /// exclusive request is excluded by any hold, a shared one by an exclusive hold.
    pub(crate) fn holding_against(
        &self,
        key: &str,
        lock_id: i64,
        mode: LockMode,
    ) -> Option<(LockMode, SystemTime)> {
        self.of(lock_id)
            .find(|held| {
                *held.key == *key
                    && (mode == LockMode::Exclusive || held.mode == LockMode::Exclusive)
            })
            .map(|held| (held.mode, held.since()))
    }

    /// Adds an entry; gives back the entries it displaces: a second exclusive grant of
    /// one lock id (only a transaction-pooling proxy can make that happen).
    pub(crate) fn insert(&mut self, entry: Held) -> Entries {
        let lock_id = entry.lock_id;
        let conflict = entry.mode == LockMode::Exclusive
            || self
                .of(lock_id)
                .any(|held| held.mode == LockMode::Exclusive);
        let mut displaced = Entries::new();
        if conflict {
            while let Some(held) = self.take(lock_id, |_| true) {
                displaced.push(held);
            }
        }
        self.metrics.held_changed(entry.mode, 1);
        let shared = matches!(entry.holding, Holding::Shared(_));
        if shared {
            let address = Arc::as_ptr(&entry.slot).addr();
            self.shared
                .entry(address)
                .or_insert_with(|| (Arc::clone(&entry.slot), 0))
                .1 += 1;
        }
        let end = self.entries.len();
        self.entries.push(entry);
        let at = if shared || self.own == end {
            end
        } else {
            // An entry on a connection of its own joins their run: the first shared
            // entry moves to the end.
            self.entries.swap(self.own, end);
            self.relocated(self.own, end);
            self.own
        };
        if !shared {
            self.own += 1;
        }
        let (hasher, entries) = (&self.hasher, &self.entries);
        self.places
            .insert_unique(hasher.hash_one(lock_id), place(at), |&at| {
                hasher.hash_one(entries[at as usize].lock_id)
            });
        displaced
    }

    /// Takes out the entry of the acquisition with `ticket` of `lock_id`: one probe of
    /// the table, the entry moved out of its slot.
    pub(crate) fn remove_one(&mut self, lock_id: i64, ticket: u64) -> Option<Held> {
        self.take(lock_id, |held| held.ticket == ticket)
    }

    /// Takes out the entry of `ticket` and, when it belongs to a group, the rest of
    /// its group: a lost session loses them all at once.
    pub(crate) fn remove_with_group(&mut self, ticket: &Ticket) -> Vec<Held> {
        let Some(first) = self.remove_one(ticket.lock_id, ticket.number) else {
            return Vec::new();
        };
        let group = match &first.holding {
            Holding::Group(group) => Some(Arc::clone(group)),
            Holding::Alone | Holding::Shared(_) => None,
        };
        let mut taken = vec![first];
        if let Some(group) = group {
            for &other in group
                .lock_ids
                .iter()
                .filter(|&&other| other != ticket.lock_id)
            {
                taken.extend(self.remove_one(other, ticket.number));
            }
        }
        taken
    }

    /// Takes out every entry of `key` (whose lock id is `lock_id`).
    pub(crate) fn remove_all(&mut self, key: &str, lock_id: i64) -> Entries {
        let mut taken = Entries::new();
        while let Some(held) = self.take(lock_id, |held| *held.key == *key) {
            taken.push(held);
        }
        taken
    }

    /// Takes every entry out (a shutdown).
    pub(crate) fn drain(&mut self) -> Vec<Held> {
        self.places.clear();
        self.own = 0;
        self.shared.clear();
        let drained = std::mem::take(&mut self.entries);
        drained
            .iter()
            .for_each(|held| self.metrics.held_changed(held.mode, -1));
        drained
    }

    /// Every entry.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Held> {
        self.entries.iter()
    }

    /// The entries on connections of their own (alone or in a group), for the health
    /// monitor: a look at each.
    pub(crate) fn own_entries(&self) -> impl Iterator<Item = &Held> {
        self.entries[..self.own].iter()
    }

    /// The entries on shared connections.
    pub(crate) fn shared_entries(&self) -> impl Iterator<Item = &Held> {
        self.entries[self.own..].iter()
    }

    /// The shared connections that hold entries, each once, for the health monitor:
    /// a look at each, whatever the number of locks on it.
    pub(crate) fn shared_slots(&self) -> impl Iterator<Item = &SessionSlot> {
        self.shared.values().map(|(slot, _)| slot)
    }

    /// Records that the acquisition `ticket` now holds its lock in `mode` (a
    /// downgrade), on its shared connection's place too; `false` when it is gone.
    pub(crate) fn set_mode(&mut self, ticket: &Ticket, mode: LockMode) -> bool {
        let Some(held) = self.get_mut(ticket) else {
            return false;
        };
        let was = std::mem::replace(&mut held.mode, mode);
        if let Holding::Shared(member) = &mut held.holding {
            member.set_mode(mode);
        }
        self.metrics.held_changed(was, -1);
        self.metrics.held_changed(mode, 1);
        true
    }

    /// The entry of one acquisition.
    pub(crate) fn get_mut(&mut self, ticket: &Ticket) -> Option<&mut Held> {
        let at = self.find(ticket.lock_id, |held| held.ticket == ticket.number)?;
        self.entries.get_mut(at)
    }
}

#[cfg(test)]
mod tests;
