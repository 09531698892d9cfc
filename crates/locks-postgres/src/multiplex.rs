//! The shared connections of many locks (opt-in:
//! [`multiplex`](crate::PostgresLockManagerBuilder::multiplex)), on the rules of the
//! .NET DistributedLock library's multiplexed connections (the acquisition that uses
//! them is a floor up, in `acquire.rs`):
//!
//! - an acquisition first tries (`pg_try_advisory_lock`, never a blocking wait) on a
//!   connection that already holds other locks of this manager and has room: the one
//!   with the fewest locks, then the fewest tries in flight, so that concurrent
//!   acquisitions spread over the connections (each statement's cost grows with the
//!   locks its session holds: PostgreSQL's `LockReleaseAll` walks them at every
//!   transaction's end) while one at a time they gather on few;
//! - when every such connection is busy with a try and the pool has a connection
//!   free, the acquisition takes a connection of its own instead of queueing;
//! - when no connection has room and the pool has none free, the acquisition waits for
//!   whichever comes first: room on a shared connection or a pool connection, so that
//!   `multiplex(k)` on a pool of `c` holds `k × c` locks;
//! - a connection never takes one lock id twice (advisory locks are re-entrant per
//!   session: a second try would succeed on it): that acquisition goes elsewhere;
//! - when that try finds the lock busy, or no connection has room, the acquisition runs
//!   as without multiplexing on a connection of its own (checkout, try, wait in the
//!   server's queue); once granted, that connection becomes a host for further tries;
//! - a connection goes back to the pool when it holds nothing (closed when that cannot
//!   be shown, ADR 0005).
//!
//! Each held lock keeps its own bookkeeping entry and lost signal; the entries of one
//! connection share its [`SessionSlot`], so the health monitor loses exactly the locks
//! of a connection that ends, each one told. A [`Membership`] is a lock id's place on a
//! host, from the reservation before the try to the unlock; its life, and how one dropped
//! without leaving is undone, is `multiplex/place.rs`. A try runs on a task of its own,
//! so a cancelled acquisition never leaves one in flight unread.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use locks_port::LockMode;
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, oneshot};

use crate::connection::Session;
use crate::limit::{Expired, Limit};
use crate::slot::{SessionSlot, new_slot};
use crate::sql::{Answer, Statement};

mod place;

pub(crate) use place::Membership;

/// The shared connections of one manager.
pub(crate) struct Multiplexer {
    per_connection: usize,
    answer_timeout: Duration,
    hosts: Mutex<Vec<Arc<Host>>>,
    /// Told whenever a place may have come free: a lock left a host, or a new host
    /// came with room.
    room: Arc<Notify>,
    /// Acquisitions on a connection of their own that will make it a host unless
    /// their first try finds the lock busy (see [`Multiplexer::opening`]).
    opening: AtomicUsize,
    /// Whether an acquisition passed over a host with room because a connection was
    /// opening: the last opening to end then says so (see [`Opening`]).
    deferred: AtomicBool,
    /// Acquisitions waiting for a pool connection (or room on a shared one).
    waiting: AtomicUsize,
}

/// An acquisition waiting for a pool connection, until dropped.
pub(crate) struct Waiting<'a>(&'a Multiplexer);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection on its way to becoming a host, until dropped.
pub(crate) struct Opening<'a>(&'a Multiplexer);

/// The last opening to end wakes the waiters only when one of them passed over a host
/// with room for it. Waking them every time fed a storm: with the pool full, each woken
/// waiter could see a moment's room in the pool's counts, count an opening of its own,
/// fail to check a connection out and, ending it, wake every waiter again; hundreds of
/// acquisitions then spun between them without a statement sent (the bench's tasks
/// curve, and `more_tasks_than_places_each_get_turns_and_finish`).
impl Drop for Opening<'_> {
    fn drop(&mut self) {
        // SeqCst here and in `reserve`: each side writes one flag and reads the other,
        // and one of them must see the other's write.
        let last = self.0.opening.fetch_sub(1, Ordering::SeqCst) == 1;
        if last && self.0.deferred.swap(false, Ordering::SeqCst) {
            self.0.room.notify_waiters();
        }
    }
}

/// One shared connection: its session and the lock ids on it.
pub(crate) struct Host {
    slot: SessionSlot,
    answer_timeout: Duration,
    state: Mutex<HostState>,
    room: Arc<Notify>,
}

#[derive(Default)]
struct HostState {
    /// The lock ids held or being tried on the session: each at most once.
    ids: HashSet<i64>,
    /// Takes no more locks: it was emptied (its session pooled), or its session is gone.
    retired: bool,
    /// Tries reserved on the session and not answered yet.
    trying: usize,
}

/// The bookkeeping of `release_all`'s fast path: by shared connection, its locks.
type ByHost<T> = HashMap<usize, (Arc<Host>, Vec<T>)>;

/// Why a try on a shared connection failed (the caller says so in an error).
pub(crate) enum HostFailure {
    /// The statement reached another server session (ADR 0014): the connection cannot
    /// hold session locks; it is closed, with the others on it.
    MovedBetweenSessions,
    /// The statement failed: refused by the server (the session is fine), or with the
    /// connection (closed, with the others on it).
    Failed(tokio_postgres::Error),
    /// No answer within the limit: the connection is closed, with the others on it.
    NoAnswer,
    /// The statement answered no row: what it did is unknown, so the connection is
    /// closed, with the others on it.
    NoRow,
}

/// What a try on a shared connection found.
pub(crate) enum SharedTry {
    Granted(Membership),
    Busy,
    /// No connection with room for this lock id (or the chosen one had ended).
    NoHost,
}

/// What the choice of a host knows of one: locks held (or being tried) on it, whether
/// it holds this lock id already, and its tries in flight.
#[derive(Clone, Copy)]
struct Seen {
    held: usize,
    holds_id: bool,
    trying: usize,
}

/// The most tries queued on one shared connection (its statements run one at a time):
/// further acquisitions wait for one of them to be answered, or for a connection of
/// their own, so that a burst spreads over the connections as they open instead of
/// piling onto the first.
const QUEUE: usize = 2;

/// Which host takes a lock: of the hosts with room for one more that do not hold the
/// id (a session's advisory locks are re-entrant: a second try would succeed on it)
/// and have fewer than [`QUEUE`] tries in flight, the one with the fewest locks, then
/// the fewest tries in flight (the first of equals). None when no host qualifies, or
/// when the chosen one is busy with a try and `pool_has_room`: a connection of its own
/// is then quicker than a queue.
fn least_busy_with_room(
    hosts: impl Iterator<Item = Seen>,
    per_connection: usize,
    pool_has_room: bool,
) -> Option<usize> {
    let mut best: Option<(usize, (usize, usize))> = None;
    for (index, seen) in hosts.enumerate() {
        let room = seen.held < per_connection && !seen.holds_id && seen.trying < QUEUE;
        let rank = (seen.held, seen.trying);
        if room && best.is_none_or(|(_, least)| rank < least) {
            best = Some((index, rank));
        }
    }
    match best {
        Some((_, (_, trying))) if trying > 0 && pool_has_room => None,
        best => best.map(|(index, _)| index),
    }
}

impl Multiplexer {
    /// `None` unless more than one lock may share a connection.
    pub(crate) fn new(per_connection: usize, answer_timeout: Duration) -> Option<Self> {
        (per_connection > 1).then(|| Self {
            per_connection,
            answer_timeout,
            hosts: Mutex::new(Vec::new()),
            room: Arc::new(Notify::new()),
            opening: AtomicUsize::new(0),
            deferred: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Counts an acquisition as waiting for a pool connection until the guard drops.
    pub(crate) fn waiting_for_pool(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(self)
    }

    /// How many of this manager's acquisitions wait for a pool connection.
    pub(crate) fn pool_waiters(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Counts a connection of an acquisition's own as a host on its way until the
    /// guard drops. Meanwhile other acquisitions take no place on a shared connection
    /// and wait for it instead: a burst that opens connections spreads over them
    /// rather than piling onto the first, whose tries are answered long before a new
    /// connection is open.
    pub(crate) fn opening(&self) -> Opening<'_> {
        self.opening.fetch_add(1, Ordering::Relaxed);
        Opening(self)
    }

    /// Resolves once a place may have come free on a shared connection after this
    /// call (see [`Notified::enable`]: enable it before looking for room, so that
    /// room freed meanwhile is not missed).
    pub(crate) fn room_freed(&self) -> Notified<'_> {
        self.room.notified()
    }

    /// A place for `lock_id` on a connection with room that does not hold it already
    /// (see [`least_busy_with_room`]), counted as a try in flight on it.
    fn reserve(&self, lock_id: i64, mode: LockMode, pool_has_room: bool) -> Option<Membership> {
        let mut hosts = lock(&self.hosts);
        hosts.retain(|host| !host.state().retired);
        let chosen = least_busy_with_room(
            hosts.iter().map(|host| {
                let state = host.state();
                Seen {
                    held: state.ids.len(),
                    holds_id: state.ids.contains(&lock_id),
                    trying: state.trying,
                }
            }),
            self.per_connection,
            pool_has_room,
        )?;
        // A connection on its way takes the burst instead (see `opening`); the waiter
        // this defers is woken when the last opening ends.
        if self.opening.load(Ordering::SeqCst) > 0 {
            self.deferred.store(true, Ordering::SeqCst);
            // An opening that ended meanwhile may have found nothing deferred.
            if self.opening.load(Ordering::SeqCst) > 0 {
                return None;
            }
        }
        let host = &hosts[chosen];
        let mut state = host.state();
        state.ids.insert(lock_id);
        state.trying += 1;
        drop(state);
        Some(Membership::reserved(Arc::clone(host), lock_id, mode))
    }

    /// Makes a connection granted `lock_id` on its own a host for further tries.
    pub(crate) fn adopt(&self, session: Session, lock_id: i64, mode: LockMode) -> Membership {
        let host = Arc::new(Host {
            slot: new_slot(session),
            answer_timeout: self.answer_timeout,
            state: Mutex::new(HostState {
                ids: HashSet::from([lock_id]),
                retired: false,
                trying: 0,
            }),
            room: Arc::clone(&self.room),
        });
        lock(&self.hosts).push(Arc::clone(&host));
        self.room.notify_waiters();
        Membership::held(host, lock_id, mode)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is one step: consistent even after a panic.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Host {
    fn state(&self) -> MutexGuard<'_, HostState> {
        lock(&self.state)
    }

    /// Frees `lock_id`'s place; `true` when the host is now empty, which retires it:
    /// the caller (holding the slot) then gives the session back or closes it.
    fn leave(&self, lock_id: i64) -> bool {
        let mut state = self.state();
        state.ids.remove(&lock_id);
        if state.ids.is_empty() {
            state.retired = true;
            return true;
        }
        let open = !state.retired;
        drop(state);
        if open {
            self.room.notify_waiters();
        }
        false
    }

    /// Frees `lock_id`'s place, with the host's session in `slot` (locked by the
    /// caller): emptied, the session goes back to the pool.
    fn leave_pooling(&self, lock_id: i64, slot: &mut Option<Session>) {
        if self.leave(lock_id)
            && let Some(session) = slot.take()
        {
            session.into_pool();
        }
    }

    /// A try reserved on the session was answered (or given up): its queue has room
    /// for one more.
    fn tried(&self) {
        let mut state = self.state();
        state.trying = state.trying.saturating_sub(1);
        drop(state);
        self.room.notify_one();
    }

    fn retire(&self) {
        self.state().retired = true;
    }

    /// Retires the host if `count` places are all it has (every one of them being
    /// released): then one `pg_advisory_unlock_all()` is exactly right.
    fn claim_whole(&self, count: usize) -> bool {
        let mut state = self.state();
        if state.retired || state.ids.len() != count {
            return false;
        }
        state.ids.clear();
        state.retired = true;
        true
    }
}

/// A try in flight on a host, until dropped.
struct InFlight<'a>(&'a Host);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.tried();
    }
}

impl Multiplexer {
    /// One `pg_try_advisory_lock` on a shared connection with room for `lock_id`,
    /// within `limit`.
    /// `pool_has_room`: whether the pool has a connection free (see
    /// [`least_busy_with_room`]).
    ///
    /// The try runs on a task of its own: an acquisition dropped while its try is in
    /// flight does not drop the try, whose answer then says what to undo (a granted lock
    /// nobody takes is unlocked, known to be held) without reading `pg_locks`.
    pub(crate) async fn try_on_host(
        &self,
        lock_id: i64,
        mode: LockMode,
        limit: Limit,
        pool_has_room: bool,
    ) -> Result<SharedTry, HostFailure> {
        let Some(member) = self.reserve(lock_id, mode, pool_has_room) else {
            return Ok(SharedTry::NoHost);
        };
        let trying = try_reserved(member, lock_id, mode, limit);
        // Polled outside a runtime (a Tokio connection driven elsewhere), in place.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return trying.await;
        };
        let (answer, answered) = oneshot::channel();
        runtime.spawn(async move {
            // Not taken (the acquisition was dropped), a granted place is dropped here:
            // its lock is unlocked (`settle`).
            drop(answer.send(trying.await));
        });
        // Only a panic in the task leaves no answer; its place was undone as it unwound.
        answered.await.unwrap_or(Ok(SharedTry::NoHost))
    }

    /// `release_all`'s fast path: a shared connection whose every lock is among
    /// `drained` gets one `pg_advisory_unlock_all()` and goes back to the pool; the
    /// other entries are handed back for one unlock each. `place` finds an entry's
    /// place on a shared connection (none: the entry holds a connection of its own).
    pub(crate) async fn unlock_whole_hosts<T>(
        &self,
        drained: Vec<T>,
        place: impl Fn(&mut T) -> Option<&mut Membership>,
    ) -> Vec<T> {
        let mut rest = Vec::new();
        let mut by_host = ByHost::new();
        for mut held in drained {
            match place(&mut held) {
                Some(member) => {
                    let host = Arc::clone(member.host());
                    by_host
                        .entry(Arc::as_ptr(&host).addr())
                        .or_insert_with(|| (host, Vec::new()))
                        .1
                        .push(held);
                }
                None => rest.push(held),
            }
        }
        for (host, mut members) in by_host.into_values() {
            let mut slot = host.slot.lock().await;
            if !host.claim_whole(members.len()) {
                drop(slot);
                rest.append(&mut members);
                continue;
            }
            for held in &mut members {
                if let Some(member) = place(held) {
                    member.claimed();
                }
            }
            // From here the session is ours: dropped, it is closed, which frees all.
            let Some(mut session) = slot.take() else {
                continue;
            };
            drop(slot);
            let limit = Limit::Waiting(self.answer_timeout);
            let answer = Statement::UnlockAll.run(&mut session, limit).await;
            if matches!(answer, Ok(Ok(Answer::Bool(true)))) {
                session.into_pool();
                tracing::debug!(
                    locks = members.len(),
                    "locks released with pg_advisory_unlock_all"
                );
            } else {
                session.close();
                tracing::warn!(
                    locks = members.len(),
                    "Error releasing advisory locks with pg_advisory_unlock_all; closed \
                     the session, which frees them"
                );
            }
        }
        rest
    }
}

/// The try of [`Multiplexer::try_on_host`] on the place reserved for it.
async fn try_reserved(
    member: Membership,
    lock_id: i64,
    mode: LockMode,
    limit: Limit,
) -> Result<SharedTry, HostFailure> {
    let host = Arc::clone(member.host());
    // However the try ends (dropped too), it is no longer in flight.
    let _in_flight = InFlight(&host);
    // The connection may be busy with another lock's statement (a keepalive that
    // gets no answer, say): that counts against the same limit.
    let Ok(mut slot) = limit.run(host.slot.lock()).await else {
        // Nothing was sent. Should this have been the last place, the session is
        // closed when the retired host is dropped.
        let mut member = member;
        member.leave();
        return Ok(SharedTry::NoHost);
    };
    let Some(session) = slot.as_mut() else {
        member.close_host(&mut slot);
        return Ok(SharedTry::NoHost);
    };
    let mut member = member;
    member.trying();
    let statement = Statement::TryLock { lock_id, mode };
    match statement.run(session, limit).await {
        Ok(Ok(Answer::Bool(true))) => {
            member.granted();
            Ok(SharedTry::Granted(member))
        }
        // The statement reached another server session (ADR 0014): the connection
        // cannot hold session locks, nor the others on it.
        Ok(Ok(Answer::WrongSession)) => {
            member.close_host(&mut slot);
            Err(HostFailure::MovedBetweenSessions)
        }
        Ok(Ok(Answer::NoRow)) => {
            member.close_host(&mut slot);
            Err(HostFailure::NoRow)
        }
        Ok(Ok(_)) => {
            member.vacate(&mut slot);
            Ok(SharedTry::Busy)
        }
        // The server refused the statement (out of shared memory for locks, say):
        // nothing was taken and the session is fine.
        Ok(Err(error)) if !error.is_closed() && error.code().is_some() => {
            member.vacate(&mut slot);
            Err(HostFailure::Failed(error))
        }
        Ok(Err(error)) => {
            member.close_host(&mut slot);
            Err(HostFailure::Failed(error))
        }
        Err(Expired) => {
            member.close_host(&mut slot);
            Err(HostFailure::NoAnswer)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Seen, least_busy_with_room};

    fn choose(hosts: &[(usize, bool, usize)], cap: usize, pool_has_room: bool) -> Option<usize> {
        let seen = hosts.iter().map(|&(held, holds_id, trying)| Seen {
            held,
            holds_id,
            trying,
        });
        least_busy_with_room(seen, cap, pool_has_room)
    }

    #[test]
    fn locks_go_to_the_least_busy_then_least_filled_host_with_room() {
        assert_eq!(choose(&[], 10, false), None);
        assert_eq!(
            choose(&[(3, false, 0), (7, false, 0), (2, false, 0)], 10, false),
            Some(2)
        );
        // Of equals, the idle one.
        assert_eq!(choose(&[(4, false, 1), (4, false, 0)], 10, false), Some(1));
        // A host with a full queue of tries is passed over.
        assert_eq!(choose(&[(1, false, 2)], 10, false), None);
        // Full hosts and hosts that hold the id already are passed over.
        assert_eq!(
            choose(&[(3, false, 0), (10, false, 0), (1, true, 0)], 10, false),
            Some(0)
        );
        assert_eq!(choose(&[(10, false, 0), (4, true, 0)], 10, false), None);
        // Ties go to the first.
        assert_eq!(choose(&[(2, false, 0), (2, false, 0)], 10, false), Some(0));
        assert_eq!(choose(&[(0, false, 0)], 1, false), Some(0));
        assert_eq!(choose(&[(1, false, 0)], 1, false), None);
    }

    #[test]
    fn busy_hosts_are_queued_on_only_when_the_pool_has_no_connection_free() {
        let busy = [(3, false, 1), (5, false, 1)];
        assert_eq!(choose(&busy, 10, true), None, "a connection of its own");
        assert_eq!(choose(&busy, 10, false), Some(0), "the least filled");
        // An idle host with room is taken even when the pool has room: one at a time,
        // locks gather on few connections.
        assert_eq!(choose(&[(5, false, 0)], 10, true), Some(0));
    }
}
