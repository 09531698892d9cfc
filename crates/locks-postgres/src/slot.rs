//! The slot of a held session: shared between the bookkeeping entries of the locks on
//! it and the health monitor's keepalive; whoever takes the session out owns it.

use std::sync::Arc;

use futures_util::lock::{Mutex as AsyncMutex, MutexGuard, MutexLockFuture};

use crate::connection::Session;

/// The session of a held lock. Shared between the bookkeeping entry and the health
/// monitor's keepalive; whoever takes it out owns the connection. `None` once taken.
pub(crate) type SessionSlot = Arc<Slot>;

/// The slot of a session that has just taken its first lock.
pub(crate) fn new_slot(session: Session) -> SessionSlot {
    Arc::new(Slot(AsyncMutex::new(Some(session))))
}

/// An async mutex around a held lock's session. `futures`' mutex, not tokio's: its
/// unlock is one atomic operation when nobody waits (tokio's takes its waiter list's
/// lock on every release), and a slot is nearly always free when it is taken (only a
/// keepalive in flight can hold it).
pub(crate) struct Slot(AsyncMutex<Option<Session>>);

/// The slot is held by someone else.
#[derive(Debug)]
pub(crate) struct Busy;

impl Slot {
    /// A slot with no session in it (the book's own tests: it never looks inside).
    #[cfg(test)]
    pub(crate) fn empty() -> SessionSlot {
        Arc::new(Self(AsyncMutex::new(None)))
    }

    /// Waits for the slot.
    pub(crate) fn lock(&self) -> MutexLockFuture<'_, Option<Session>> {
        self.0.lock()
    }

    /// The slot, if it is free now.
    pub(crate) fn try_lock(&self) -> Result<MutexGuard<'_, Option<Session>>, Busy> {
        self.0.try_lock().ok_or(Busy)
    }
}
