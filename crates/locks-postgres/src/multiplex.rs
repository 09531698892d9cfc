//! The shared connections of many locks (opt-in:
//! [`multiplex`](crate::PostgresLockManagerBuilder::multiplex)), on the rules of the
//! .NET DistributedLock library's multiplexed connections (the acquisition that uses
//! them is a floor up, in `acquire.rs`):
//!
//! - an acquisition first tries (`pg_try_advisory_lock`, never a blocking wait) on a
//!   connection that already holds other locks of this manager and has room;
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
//! host, from the reservation before the try to the unlock; dropped without leaving (a
//! cancelled acquire or release), a task makes sure the session does not hold the lock
//! before the place is freed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use locks_port::LockMode;

use crate::connection::Session;
use crate::limit::{Expired, Limit};
use crate::slot::{SessionSlot, new_slot};
use crate::sql::{Answer, Statement};

/// The shared connections of one manager.
pub(crate) struct Multiplexer {
    per_connection: usize,
    answer_timeout: Duration,
    hosts: Mutex<Vec<Arc<Host>>>,
}

/// One shared connection: its session and the lock ids on it.
pub(crate) struct Host {
    slot: SessionSlot,
    answer_timeout: Duration,
    state: Mutex<HostState>,
}

#[derive(Default)]
struct HostState {
    /// The lock ids held or being tried on the session: each at most once.
    ids: HashSet<i64>,
    /// Takes no more locks: it was emptied (its session pooled), or its session is gone.
    retired: bool,
}

/// A lock id's place on a host, from the reservation before its try to its unlock.
pub(crate) struct Membership {
    host: Arc<Host>,
    lock_id: i64,
    mode: LockMode,
    left: bool,
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

/// Which host takes a lock: of the hosts, given as (locks held, whether it holds this
/// lock id already), the first of the fullest that has room for one more and does not
/// hold the id (a session's advisory locks are re-entrant: a second try would succeed
/// on it).
fn fullest_with_room(
    hosts: impl Iterator<Item = (usize, bool)>,
    per_connection: usize,
) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (index, (held, holds_id)) in hosts.enumerate() {
        let room = held < per_connection && !holds_id;
        if room && best.is_none_or(|(_, most)| held > most) {
            best = Some((index, held));
        }
    }
    best.map(|(index, _)| index)
}

impl Multiplexer {
    /// `None` unless more than one lock may share a connection.
    pub(crate) fn new(per_connection: usize, answer_timeout: Duration) -> Option<Self> {
        (per_connection > 1).then(|| Self {
            per_connection,
            answer_timeout,
            hosts: Mutex::new(Vec::new()),
        })
    }

    /// A place for `lock_id` on a connection with room that does not hold it already;
    /// the fullest such connection first, so locks gather on few connections.
    fn reserve(&self, lock_id: i64, mode: LockMode) -> Option<Membership> {
        let mut hosts = lock(&self.hosts);
        hosts.retain(|host| !host.state().retired);
        let chosen = fullest_with_room(
            hosts.iter().map(|host| {
                let state = host.state();
                (state.ids.len(), state.ids.contains(&lock_id))
            }),
            self.per_connection,
        )?;
        let host = &hosts[chosen];
        let mut state = host.state();
        state.ids.insert(lock_id);
        drop(state);
        Some(Membership {
            host: Arc::clone(host),
            lock_id,
            mode,
            left: false,
        })
    }

    /// Makes a connection granted `lock_id` on its own a host for further tries.
    pub(crate) fn adopt(&self, session: Session, lock_id: i64, mode: LockMode) -> Membership {
        let host = Arc::new(Host {
            slot: new_slot(session),
            answer_timeout: self.answer_timeout,
            state: Mutex::new(HostState {
                ids: HashSet::from([lock_id]),
                retired: false,
            }),
        });
        lock(&self.hosts).push(Arc::clone(&host));
        Membership {
            host,
            lock_id,
            mode,
            left: false,
        }
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
        false
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

impl Membership {
    /// The slot of the host's session, shared by the bookkeeping entries of its locks.
    pub(crate) fn slot(&self) -> &SessionSlot {
        &self.host.slot
    }

    /// Records the mode the lock is now held in (a downgrade), so that a place
    /// dropped without leaving checks for the right one.
    pub(crate) fn set_mode(&mut self, mode: LockMode) {
        self.mode = mode;
    }

    /// Frees the place (the lock is unlocked or gone); `true` when the connection now
    /// holds nothing: the caller, holding the slot, gives the session back or closes it.
    pub(crate) fn leave(&mut self) -> bool {
        self.left = true;
        self.host.leave(self.lock_id)
    }

    /// Frees the place, giving the session back if the connection now holds nothing.
    fn vacate(mut self, slot: &mut Option<Session>) {
        if self.leave()
            && let Some(session) = slot.take()
        {
            session.into_pool();
        }
    }

    /// Closes the host's session (it failed), which frees every lock on it; the
    /// health monitor tells the others' guards.
    fn close_host(mut self, slot: &mut Option<Session>) {
        drop(slot.take());
        self.host.retire();
        self.leave();
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        self.left = true;
        let (host, lock_id, mode) = (Arc::clone(&self.host), self.lock_id, self.mode);
        if let Ok(mut slot) = host.slot.try_lock()
            && slot.is_none()
        {
            // The session is gone (lost, or closed): nothing to undo on it.
            if host.leave(lock_id) {
                drop(slot.take());
            }
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(settle(host, lock_id, mode));
            }
            Err(_) => {
                // No runtime, no I/O: close the session (if it is free), which frees
                // every lock on it; the monitor tells the other guards. Else the host
                // takes no more locks, and this place stays taken until it closes.
                host.retire();
                if let Ok(mut slot) = host.slot.try_lock() {
                    drop(slot.take());
                    host.leave(lock_id);
                }
            }
        }
    }
}

/// After a cancelled try, acquisition or release on a shared connection: makes sure
/// the session does not hold `lock_id` (statements run in order, so this comes after
/// whatever was sent), then frees the place; closes the session if that cannot be shown.
async fn settle(host: Arc<Host>, lock_id: i64, mode: LockMode) {
    let mut slot = host.slot.lock().await;
    if let Some(session) = slot.as_mut() {
        let check = Statement::UnlockIfHeld { lock_id, mode };
        let answer = check
            .run(session, Limit::Waiting(host.answer_timeout))
            .await;
        if !matches!(answer, Ok(Ok(Answer::Bool(_)))) {
            drop(slot.take());
            host.retire();
        }
    }
    if host.leave(lock_id)
        && let Some(session) = slot.take()
    {
        session.into_pool();
    }
}

impl Multiplexer {
    /// One `pg_try_advisory_lock` on a shared connection with room for `lock_id`,
    /// within `limit`.
    pub(crate) async fn try_on_host(
        &self,
        lock_id: i64,
        mode: LockMode,
        limit: Limit,
    ) -> Result<SharedTry, HostFailure> {
        let Some(member) = self.reserve(lock_id, mode) else {
            return Ok(SharedTry::NoHost);
        };
        let host = Arc::clone(&member.host);
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
        let statement = Statement::TryLock { lock_id, mode };
        match statement.run(session, limit).await {
            Ok(Ok(Answer::Bool(true))) => Ok(SharedTry::Granted(member)),
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
                    let host = Arc::clone(&member.host);
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
                    member.left = true;
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

#[cfg(test)]
mod tests {
    use super::fullest_with_room;

    #[test]
    fn locks_gather_on_the_fullest_host_with_room_that_does_not_hold_the_id() {
        let choose = |hosts: &[(usize, bool)], cap| fullest_with_room(hosts.iter().copied(), cap);
        assert_eq!(choose(&[], 10), None);
        assert_eq!(choose(&[(3, false), (7, false), (5, false)], 10), Some(1));
        // Full hosts and hosts that hold the id already are passed over.
        assert_eq!(choose(&[(3, false), (10, false), (7, true)], 10), Some(0));
        assert_eq!(choose(&[(10, false), (4, true)], 10), None);
        // Ties go to the first.
        assert_eq!(choose(&[(2, false), (2, false)], 10), Some(0));
        assert_eq!(choose(&[(0, false)], 1), Some(0));
        assert_eq!(choose(&[(1, false)], 1), None);
    }
}
