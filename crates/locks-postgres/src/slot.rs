//! The slot of a held session: shared between the bookkeeping entries of the locks on
//! it and the health monitor's keepalive; whoever takes the session out owns it. The
//! slot also keeps when the connection last answered a keepalive: one clock per
//! connection, however many locks share it.

use std::sync::{Arc, Mutex as SyncMutex, PoisonError};
use std::time::Duration;

use futures_util::lock::{Mutex as AsyncMutex, MutexGuard, MutexLockFuture};
use tokio::time::Instant;

use crate::connection::Session;

/// The session of a held lock. Shared between the bookkeeping entry and the health
/// monitor's keepalive; whoever takes it out owns the connection. `None` once taken.
pub(crate) type SessionSlot = Arc<Slot>;

/// The slot of a session that has just taken its first lock.
pub(crate) fn new_slot(session: Session) -> SessionSlot {
    Arc::new(Slot {
        session: AsyncMutex::new(Some(session)),
        keepalive: SyncMutex::new(Keepalive::Unseen),
    })
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
}
