//! The slot of a held session: shared between the bookkeeping entries of the locks on
//! it and the health monitor's keepalive; whoever takes the session out owns it. The
//! slot also keeps when the connection last answered a keepalive: one clock per
//! connection, however many locks share it.
//!
//! A slot goes back to the pool with its connection once its last lock is unlocked
//! ([`keep`]), and the connection's next lock refills it ([`new_slot`]) when nothing
//! holds it any more: one allocation (about 90 instructions) less a lock cycle.

use std::sync::{Arc, Mutex as SyncMutex, PoisonError};
use std::time::Duration;

use futures_util::lock::{Mutex as AsyncMutex, MutexGuard, MutexLockFuture};
use locks_port::LossNotifier;
use tokio::time::Instant;

use crate::connection::Session;

/// The session of a held lock. Shared between the bookkeeping entry and the health
/// monitor's keepalive; whoever takes it out owns the connection. `None` once taken.
pub(crate) type SessionSlot = Arc<Slot>;

/// The slot of a session that has just taken its first lock: the one its connection
/// kept from its last lock ([`keep`]) when nothing holds that any more, else a new one.
pub(crate) fn new_slot(mut session: Session) -> SessionSlot {
    match session.take_spare().map(Arc::downcast::<Slot>) {
        Some(Ok(spare)) => refilled(spare, session).unwrap_or_else(fresh),
        _ => fresh(session),
    }
}

fn fresh(session: Session) -> SessionSlot {
    Arc::new(Slot {
        session: AsyncMutex::new(Some(session)),
        keepalive: SyncMutex::new(Keepalive::Unseen),
    })
}

/// `spare` with `session` in it and its keepalive clock unseen, as a new slot's; the
/// session back if something still holds the slot (a keepalive, a lock's entry).
fn refilled(mut spare: SessionSlot, session: Session) -> Result<SessionSlot, Session> {
    let Some(slot) = Arc::get_mut(&mut spare) else {
        return Err(session);
    };
    slot.refill(Some(session));
    Ok(spare)
}

/// Gives `session` (taken out of `slot`: it holds no lock) back to the pool, keeping
/// `slot` and its last lock's `notifier` with the connection for its next lock.
pub(crate) fn keep(slot: &SessionSlot, notifier: &LossNotifier, session: Session) {
    let slot = Arc::clone(slot) as Arc<dyn std::any::Any + Send + Sync>;
    session.into_pool_keeping(slot, notifier.clone());
}

/// An async mutex around a held lock's session. `futures`' mutex, not tokio's: its
/// unlock is one atomic operation when nobody waits (tokio's takes its waiter list's
/// lock on every release), and a slot is nearly always free when it is taken (only a
/// keepalive in flight can hold it).
pub(crate) struct Slot {
    session: AsyncMutex<Option<Session>>,
    /// The connection's keepalive clock, read and set by the monitor only.
    keepalive: SyncMutex<Keepalive>,
}

/// When the connection last answered, and whether a keepalive is in flight.
#[derive(Clone, Copy)]
enum Keepalive {
    /// Not looked at yet by the monitor (a grant reads no clock: the first keepalive
    /// comes at most one health-check interval later for it).
    Unseen,
    /// It answered (or was first seen) then.
    Since(Instant),
    /// A keepalive is in flight.
    Pinging,
}

/// The slot is held by someone else.
#[derive(Debug)]
pub(crate) struct Busy;

impl Slot {
    /// A slot with no session in it (the book's own tests: it never looks inside).
    #[cfg(test)]
    pub(crate) fn empty() -> SessionSlot {
        Arc::new(Self {
            session: AsyncMutex::new(None),
            keepalive: SyncMutex::new(Keepalive::Unseen),
        })
    }

    /// Puts `session` in the slot, its keepalive clock unseen: as a new slot.
    fn refill(&mut self, session: Option<Session>) {
        *self.session.get_mut() = session;
        *self
            .keepalive
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = Keepalive::Unseen;
    }

    /// Waits for the slot.
    pub(crate) fn lock(&self) -> MutexLockFuture<'_, Option<Session>> {
        self.session.lock()
    }

    /// The slot, if it is free now.
    pub(crate) fn try_lock(&self) -> Result<MutexGuard<'_, Option<Session>>, Busy> {
        self.session.try_lock().ok_or(Busy)
    }

    /// Whether a keepalive is due at `now` at this `cadence`; if so it counts as in
    /// flight until [`answered`](Self::answered). The first look only starts the count.
    pub(crate) fn keepalive_due(&self, now: Instant, cadence: Duration) -> bool {
        let mut state = self
            .keepalive
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let since = match *state {
            Keepalive::Pinging => return false,
            Keepalive::Unseen => now,
            Keepalive::Since(since) => since,
        };
        let due = now.saturating_duration_since(since) >= cadence;
        *state = if due {
            Keepalive::Pinging
        } else {
            Keepalive::Since(since)
        };
        due
    }

    /// The connection answered a keepalive at `now`.
    pub(crate) fn answered(&self, now: Instant) {
        *self
            .keepalive
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Keepalive::Since(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keepalive_is_due_once_per_cadence_and_never_twice_in_flight() {
        let slot = Slot::empty();
        let cadence = Duration::from_secs(10);
        let start = Instant::now();
        // The first look only starts the count.
        assert!(!slot.keepalive_due(start, cadence));
        assert!(!slot.keepalive_due(start + Duration::from_secs(9), cadence));
        assert!(slot.keepalive_due(start + cadence, cadence));
        assert!(
            !slot.keepalive_due(start + 2 * cadence, cadence),
            "one keepalive in flight at a time"
        );
        slot.answered(start + 2 * cadence);
        assert!(!slot.keepalive_due(start + 2 * cadence, cadence));
        assert!(slot.keepalive_due(start + 3 * cadence, cadence));
    }

    #[test]
    fn a_kept_slot_is_refilled_as_a_new_one_only_when_nothing_holds_it() {
        let cadence = Duration::from_secs(10);
        let start = Instant::now();
        let mut kept = Slot::empty();
        // Its last lock's keepalive was in flight when the connection went back.
        assert!(!kept.keepalive_due(start, cadence));
        assert!(kept.keepalive_due(start + cadence, cadence));
        let holder = Arc::clone(&kept);
        assert!(Arc::get_mut(&mut kept).is_none(), "held: not refilled");
        drop(holder);
        Arc::get_mut(&mut kept)
            .expect("nothing holds it")
            .refill(None);
        // As a new slot's: the first look starts the count, a keepalive is due later.
        let later = start + 5 * cadence;
        assert!(!kept.keepalive_due(later, cadence));
        assert!(kept.keepalive_due(later + cadence, cadence));
    }
}
