//! What a manager holds: one entry per held key, with the session that holds it and
//! the notifier of its guard's lost signal; registering a grant and taking entries out
//! (the unlock that follows is a floor up, in `release.rs`).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use locks_port::{LockInfo, LockMode, LossNotifier};
use smallvec::SmallVec;
use tokio::time::Instant;

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
    /// When it was granted (its guard's `acquired_at`, as the clock read it), for the
    /// error of a wait on a key this manager holds.
    since: SystemTime,
    slot: SessionSlot,
    notifier: LossNotifier,
    /// When the connection last answered (the last keepalive), or, until the first,
    /// when the monitor first saw the lock: `None` until then (a grant reads no clock;
    /// the first keepalive comes at most one health-check interval later for it).
    last_answer: Option<Instant>,
    /// Whether a keepalive is in flight on the connection.
    pinging: bool,
    holding: Holding,
}

impl Held {
    /// The entry of the grant `info` describes (its lock id, mode and time; `key` is
    /// its key, shared), of the acquisition with `ticket`.
    pub(crate) fn new(
        key: Arc<str>,
        ticket: u64,
        info: &LockInfo,
        slot: SessionSlot,
        notifier: LossNotifier,
        holding: Holding,
    ) -> Self {
        Self {
            key,
            ticket,
            lock_id: info.lock_id(),
            mode: info.mode(),
            since: info.acquired_at_system_time(),
            slot,
            notifier,
            last_answer: None,
            pinging: false,
            holding,
        }
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The key, as the guard's [`LockInfo`] shares it.
    pub(crate) fn shared_key(&self) -> &Arc<str> {
        &self.key
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

    /// Whether a keepalive is due at `now` at this `cadence`; if so it counts as in
    /// flight until [`answered`](Self::answered).
    pub(crate) fn keepalive_due(&mut self, now: Instant, cadence: Duration) -> bool {
        let due = !self.pinging
            && now.saturating_duration_since(*self.last_answer.get_or_insert(now)) >= cadence;
        self.pinging |= due;
        due
    }

    /// The connection answered a keepalive at `now`.
    pub(crate) fn answered(&mut self, now: Instant) {
        self.last_answer = Some(now);
        self.pinging = false;
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

/// The entries of one lock id: almost always one, kept inline (no allocation per
/// grant).
pub(crate) type Entries = SmallVec<[Held; 1]>;

/// Every lock one manager holds, by lock id: what the server locks, and a number to
/// hash, where a key is a string (the lock id of a key is known on every path that
/// looks it up). An id has one entry, or several when the manager holds it shared more
/// than once (one per guard), or, by a 64-bit collision, holds another key of the same
/// id (the server sees one lock). Every change of the count is told to the locks-held
/// instrument.
pub(crate) struct Book {
    by_id: HashMap<i64, Entries, foldhash::fast::RandomState>,
    count: usize,
    metrics: Arc<Metrics>,
    /// The lock ids whose unlock runs in the background now (once per unlock), with
    /// [`release_in_background`](crate::PostgresLockManagerBuilder::release_in_background).
    releasing: Vec<i64>,
}

impl Book {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            by_id: HashMap::default(),
            count: 0,
            metrics,
            releasing: Vec::new(),
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
        self.count
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether `key` (whose lock id is `lock_id`) is held.
    pub(crate) fn contains(&self, key: &str, lock_id: i64) -> bool {
        self.by_id
            .get(&lock_id)
            .is_some_and(|entries| entries.iter().any(|held| *held.key == *key))
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
        self.by_id
            .get(&lock_id)?
            .iter()
            .find(|held| {
                *held.key == *key
                    && (mode == LockMode::Exclusive || held.mode == LockMode::Exclusive)
            })
            .map(|held| (held.mode, held.since))
    }

    /// Adds an entry; gives back the entries it displaces: a second exclusive grant of
    /// one lock id (only a transaction-pooling proxy can make that happen).
    pub(crate) fn insert(&mut self, entry: Held) -> Entries {
        let entries = self.by_id.entry(entry.lock_id).or_default();
        let conflict = entry.mode == LockMode::Exclusive
            || entries.iter().any(|held| held.mode == LockMode::Exclusive);
        let displaced = if conflict {
            std::mem::take(entries)
        } else {
            Entries::new()
        };
        self.metrics.held_changed(entry.mode, 1);
        entries.push(entry);
        self.count = self.count + 1 - displaced.len();
        displaced
            .iter()
            .for_each(|held| self.metrics.held_changed(held.mode, -1));
        displaced
    }

    /// Takes out the entry of the acquisition with `ticket` of `lock_id`. The id is
    /// looked up once; the entry is moved out of its place, and the id's place goes
    /// only when it held nothing else (other shared holds are rare).
    pub(crate) fn remove_one(&mut self, lock_id: i64, ticket: u64) -> Option<Held> {
        let Entry::Occupied(mut place) = self.by_id.entry(lock_id) else {
            return None;
        };
        let entries = place.get_mut();
        let index = entries.iter().position(|held| held.ticket == ticket)?;
        let taken = entries.swap_remove(index);
        if entries.is_empty() {
            place.remove();
        }
        self.count -= 1;
        self.metrics.held_changed(taken.mode, -1);
        Some(taken)
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
        let Some(entries) = self.by_id.remove(&lock_id) else {
            return Entries::new();
        };
        let (taken, rest): (Entries, Entries) =
            entries.into_iter().partition(|held| *held.key == *key);
        if !rest.is_empty() {
            self.by_id.insert(lock_id, rest);
        }
        self.count -= taken.len();
        taken
            .iter()
            .for_each(|held| self.metrics.held_changed(held.mode, -1));
        taken
    }

    /// Takes every entry out (a shutdown).
    pub(crate) fn drain(&mut self) -> Vec<Held> {
        self.count = 0;
        let drained: Vec<Held> = self
            .by_id
            .drain()
            .flat_map(|(_, entries)| entries)
            .collect();
        drained
            .iter()
            .for_each(|held| self.metrics.held_changed(held.mode, -1));
        drained
    }

    /// Every entry, for the health monitor.
    pub(crate) fn entries_mut(&mut self) -> impl Iterator<Item = &mut Held> {
        self.by_id.values_mut().flatten()
    }

    /// Records that the acquisition `ticket` now holds its lock in `mode` (a
    /// downgrade), on its shared connection's place too; `false` when it is gone.
    pub(crate) fn set_mode(&mut self, ticket: &Ticket, mode: LockMode) -> bool {
        let Some(held) = self
            .by_id
            .get_mut(&ticket.lock_id)
            .and_then(|entries| entries.iter_mut().find(|held| held.ticket == ticket.number))
        else {
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
        self.by_id
            .get_mut(&ticket.lock_id)?
            .iter_mut()
            .find(|held| held.ticket == ticket.number)
    }
}

#[cfg(test)]
mod tests;
