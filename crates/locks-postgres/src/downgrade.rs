//! A held exclusive lock turned shared on its own session without letting go
//! ([`LockGuard::downgrade`](locks_port::LockGuard::downgrade)): one statement takes the
//! lock shared beside the exclusive hold (a session's own locks never conflict with its
//! requests, so this is granted at once, never waited for), then frees the exclusive
//! hold. No writer gets in between; the readers queued first get in.
//!
//! The bookkeeping says shared before the statement is sent: from the moment the server
//! frees the exclusive hold, another session of this manager may be granted the key
//! shared, and its entry must find this one shared (an exclusive entry beside it would
//! be taken for two sessions granted one lock). A multiplexed lock's place on its shared
//! connection says so too, so that a place dropped without leaving checks for the
//! shared hold. Any answer but a confirmed downgrade, and a future dropped once the
//! bookkeeping changed, close the session, which frees the lock; the health room then
//! loses every lock of that session at once, each guard told (a connection the adapter
//! closes itself wakes no monitor).

use std::sync::Arc;

use futures_util::lock::MutexGuard;
use locks_port::{
    AcquisitionErrorKind, LockAcquisitionError, LockError, LockInfo, LockLostError, LockMode,
    LostReason, LostSignal,
};

use crate::bookkeeping::{SessionSlot, Ticket};
use crate::connection::Session;
use crate::errors::{MOVED_BETWEEN_SESSIONS, describe, driver_kind};
use crate::limit::{Expired, Limit};
use crate::manager::Inner;
use crate::sql::Query;

/// Takes the lock shared, then frees the exclusive hold: `true` when both happened,
/// NULL on a server session not the connection's own (nothing done there). `CASE`
/// orders the two calls (the operands of a plain `AND` may run in either order).
///
/// The shared request is the waiting form, `pg_advisory_lock_shared`, and it never
/// waits: every session queued for the key waits for this one's exclusive hold, and
/// PostgreSQL puts a request ahead of the waiters that wait for its own session and
/// grants it at once when no other session holds the lock. The `try` form would be
/// refused as soon as a writer is queued (it never goes ahead of a waiter whose mode
/// conflicts), which is when a downgrade matters most. It returns `void`, which is
/// never NULL: the `IS NOT NULL` only orders it before the unlock.
static DOWNGRADE: Query = Query::new(
    "SELECT CASE WHEN current_setting('locks.session', true) = :marker \
     THEN CASE WHEN pg_advisory_lock_shared($1) IS NOT NULL THEN pg_advisory_unlock($1) \
     ELSE false END END",
);

impl Inner {
    /// Downgrades the acquisition `ticket` (its guard's `info` and `lost` signal) to
    /// shared; see [`LockGuard::downgrade`](locks_port::LockGuard::downgrade).
    pub(crate) async fn downgrade(
        &self,
        ticket: &Ticket,
        info: &mut LockInfo,
        lost: &LostSignal,
    ) -> Result<(), LockError> {
        let key = info.key().to_owned();
        let gone = |otherwise: LostReason| {
            let reason = lost.reason().unwrap_or(otherwise);
            LockError::from(LockLostError::new(key.as_str(), reason))
        };
        let shared_slot = match self.book().get_mut(ticket) {
            None => return Err(gone(LostReason::Released)),
            Some(held) if held.mode() == LockMode::Shared => return Ok(()),
            Some(held) => Arc::clone(held.slot()),
        };
        // Waits for a keepalive in flight on the connection (bounded by the answer
        // timeout); a cancel here changes nothing.
        let locked = shared_slot.lock().await;
        if locked.is_none() {
            // The health monitor took the session: the lock is lost.
            return Err(gone(LostReason::ConnectionClosed));
        }
        if !self.book().set_mode(ticket, LockMode::Shared) {
            return Err(gone(LostReason::Released));
        }
        *info = info.clone().with_mode(LockMode::Shared);
        // From here the session is closed unless the answer is read: a future dropped
        // before then leaves the server's state unknown (the statement may be unsent,
        // or sent and not yet run), and closing it frees the lock whatever it held.
        let mut slot = CloseUnlessAnswered {
            inner: self,
            slot: &shared_slot,
            locked: Some(locked),
            detail: "the downgrade was dropped part-way",
        };
        let Some(session) = slot.session() else {
            unreachable!("the session was there when the slot was locked")
        };
        let limit = Limit::Waiting(self.settings().answer_timeout);
        let answer = session
            .read_within(&DOWNGRADE, &[&ticket.lock_id], limit, |row| match row {
                Some(row) => row.try_get::<_, Option<bool>>(0).map(Some),
                None => Ok(None),
            })
            .await;
        let lock_id = ticket.lock_id;
        let new = |kind, reason: &str| LockAcquisitionError::new(key.as_str(), kind, reason);
        let failure = match answer {
            Ok(Ok(Some(Some(true)))) => {
                slot.answered();
                tracing::debug!(key = self.shown(&key), lock_id, "lock downgraded to shared");
                return Ok(());
            }
            Ok(Ok(Some(None))) => new(
                AcquisitionErrorKind::Configuration,
                &format!("Database error: {MOVED_BETWEEN_SESSIONS}"),
            ),
            Ok(Ok(Some(Some(false)))) => new(
                AcquisitionErrorKind::Backend,
                "Database error: the session no longer held the lock exclusively",
            ),
            Ok(Ok(None)) => new(
                AcquisitionErrorKind::Backend,
                "Database error: the downgrade answered no row",
            ),
            Ok(Err(error)) => LockAcquisitionError::described(
                key.as_str(),
                driver_kind(&error),
                describe(&error),
                error,
            ),
            Err(Expired) => new(
                AcquisitionErrorKind::ConnectionLost,
                "the server did not answer the downgrade within the answer timeout",
            ),
        };
        // What the session holds is not known: dropping the slot unanswered closes it,
        // which frees the lock (and, on a shared connection, the others), and their
        // guards are told.
        tracing::warn!(
            key = self.shown(&key),
            lock_id,
            error = %failure,
            "advisory lock downgrade failed; closed the session, which frees the lock"
        );
        slot.detail = "the downgrade failed";
        drop(slot);
        Err(failure.into())
    }
}

/// A locked session slot whose session is closed if this is dropped before
/// [`answered`](Self::answered) (the downgrade failed, or its future was dropped
/// part-way), its locks lost at once for the reason `detail` gives.
struct CloseUnlessAnswered<'s> {
    inner: &'s Inner,
    slot: &'s SessionSlot,
    locked: Option<MutexGuard<'s, Option<Session>>>,
    detail: &'static str,
}

impl<'s> CloseUnlessAnswered<'s> {
    fn session(&mut self) -> Option<&mut Session> {
        self.locked.as_mut()?.as_mut()
    }

    /// The downgrade was confirmed: the session stays, and the slot is free again.
    fn answered(mut self) {
        self.locked = None;
    }
}

impl Drop for CloseUnlessAnswered<'_> {
    fn drop(&mut self) {
        let Some(mut locked) = self.locked.take() else {
            return;
        };
        let session = locked.take();
        drop(locked);
        if let Some(session) = session {
            session.close();
            self.inner.lose_closed_session(self.slot, self.detail);
        }
    }
}
