//! A lock id's place on a shared connection ([`Membership`]), from the reservation before
//! its try to its unlock, and what the session is known to hold of the lock ([`Known`]),
//! which says how a place dropped without leaving is undone: freed when nothing was sent
//! for it, a plain unlock when the lock is known held, a check of `pg_locks` first only
//! when a try or an unlock was in flight ([`settle`]; with a runtime, tries and unlocks
//! run to their answer on tasks of their own, so that is left for a runtime shutting
//! down). The hosts and the tries on them are the floor's other half, in `multiplex.rs`.

use std::sync::Arc;
#[cfg(test)]
use std::{collections::HashSet, sync::Mutex, time::Duration};

use locks_port::LockMode;
#[cfg(test)]
use tokio::sync::Notify;

use super::Host;
#[cfg(test)]
use super::HostState;
use crate::connection::Session;
use crate::limit::Limit;
use crate::slot::SessionSlot;
use crate::sql::{Answer, Statement};

/// A lock id's place on a host, from the reservation before its try to its unlock.
pub(crate) struct Membership {
    host: Arc<Host>,
    lock_id: i64,
    mode: LockMode,
    left: bool,
    /// What the session is known to hold of the lock, which says how a place dropped
    /// without leaving is undone.
    known: Known,
}

/// What a host's session is known to hold of a place's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Nothing: no statement about it was sent yet (dropped, the place is only freed).
    Nothing,
    /// Held, nothing in flight (dropped, a plain unlock).
    Held,
    /// A try or an unlock is in flight (dropped, an unlock only if `pg_locks` shows it
    /// held). Tries and unlocks are finished on tasks of their own when their callers
    /// go, so a place is dropped so only where those tasks cannot run (a runtime
    /// shutting down).
    InFlight,
}

impl Membership {
    /// The place reserved for a try of `lock_id` on `host`: nothing sent yet.
    pub(super) fn reserved(host: Arc<Host>, lock_id: i64, mode: LockMode) -> Self {
        Self::new(host, lock_id, mode, Known::Nothing)
    }

    /// The place of `lock_id`, held on `host`'s session.
    pub(super) fn held(host: Arc<Host>, lock_id: i64, mode: LockMode) -> Self {
        Self::new(host, lock_id, mode, Known::Held)
    }

    fn new(host: Arc<Host>, lock_id: i64, mode: LockMode, known: Known) -> Self {
        Self {
            host,
            lock_id,
            mode,
            left: false,
            known,
        }
    }

    /// The host the place is on.
    pub(super) fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// Records that the try is about to be sent: dropped from now until it is answered,
    /// the place is undone by a check of `pg_locks` (the try may or may not have run).
    pub(super) fn trying(&mut self) {
        self.known = Known::InFlight;
    }

    /// Records that the try was granted: dropped, the place is undone by a plain unlock.
    pub(super) fn granted(&mut self) {
        self.known = Known::Held;
    }

    /// A place for `lock_id` on a host whose session is in `slot`, belonging to no
    /// multiplexer: for the bookkeeping's unit tests (an empty slot: dropping it does
    /// nothing).
    #[cfg(test)]
    pub(crate) fn on_slot(slot: SessionSlot, lock_id: i64) -> Self {
        let host = Arc::new(Host {
            slot,
            answer_timeout: Duration::from_secs(1),
            state: Mutex::new(HostState {
                ids: HashSet::from([lock_id]),
                retired: false,
                trying: 0,
            }),
            room: Arc::new(Notify::new()),
        });
        Self::held(host, lock_id, LockMode::Exclusive)
    }

    /// Marks the place as left without freeing it: its host was claimed whole
    /// ([`Host::claim_whole`](super::Host)), which cleared every place at once.
    pub(super) fn claimed(&mut self) {
        self.left = true;
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

    /// Records that the lock's unlock is about to be sent: dropped from now until it
    /// leaves, the place is undone by a check of `pg_locks` (the unlock may or may not
    /// have run).
    pub(crate) fn unlocking(&mut self) {
        self.known = Known::InFlight;
    }

    /// Frees the place (the lock is unlocked or gone); `true` when the connection now
    /// holds nothing: the caller, holding the slot, gives the session back or closes it.
    pub(crate) fn leave(&mut self) -> bool {
        self.left = true;
        self.host.leave(self.lock_id)
    }

    /// Frees the place, giving the session back if the connection now holds nothing.
    pub(super) fn vacate(mut self, slot: &mut Option<Session>) {
        self.left = true;
        self.host.leave_pooling(self.lock_id, slot);
    }

    /// Closes the host's session (it failed), which frees every lock on it; the
    /// health monitor tells the others' guards.
    pub(super) fn close_host(mut self, slot: &mut Option<Session>) {
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
        let known = self.known;
        if let Ok(mut slot) = host.slot.try_lock()
            && (slot.is_none() || known == Known::Nothing)
        {
            // The session is gone (lost, or closed), or nothing was sent for this lock:
            // nothing to undo on it; emptied, the session goes back to the pool.
            host.leave_pooling(lock_id, &mut slot);
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(settle(host, lock_id, mode, known));
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

/// After a place was dropped without leaving (a granted lock nobody took, a cancelled
/// acquisition or release on a shared connection): makes sure the session does not hold
/// `lock_id` (statements run in order, so this comes after whatever was sent), then
/// frees the place; closes the session if that cannot be shown. Known held with
/// nothing in flight, a plain unlock does; in flight, the unlock only if `pg_locks`
/// shows it held (that read copies the server's whole lock table, `docs/capacity.md`;
/// tries and unlocks run to their answer on tasks of their own, so it is left for a
/// runtime shutting down); nothing sent, nothing to undo.
async fn settle(host: Arc<Host>, lock_id: i64, mode: LockMode, known: Known) {
    let mut slot = host.slot.lock().await;
    if let Some(session) = slot.as_mut().filter(|_| known != Known::Nothing) {
        let check = match known {
            Known::Held => Statement::Unlock { lock_id, mode },
            _ => Statement::UnlockIfHeld { lock_id, mode },
        };
        let answer = check
            .run(session, Limit::Waiting(host.answer_timeout))
            .await;
        if !matches!(answer, Ok(Ok(Answer::Bool(_)))) {
            drop(slot.take());
            host.retire();
        }
    }
    host.leave_pooling(lock_id, &mut slot);
}
