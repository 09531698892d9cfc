//! A held lock's mode changed on its own session without letting go: the downgrade
//! ([`LockGuard::downgrade`](locks_port::LockGuard::downgrade)), exclusive to shared,
//! and the try-upgrade ([`LockGuard::try_upgrade`](locks_port::LockGuard::try_upgrade)),
//! shared to exclusive when that can be done at once. Each is one statement that takes
//! the lock in the new mode beside the old hold, then frees the old hold. Neither ever
//! waits in the server's queue: the downgrade's shared request goes ahead of every
//! waiter (they all wait for its own exclusive hold), and the upgrade is a try, refused
//! while another session holds the key, so two readers that both try cannot deadlock.
//! With a writer queued for the key (waiting for this session's shared hold), PostgreSQL
//! 13 to 16 refuse the try (a new request is checked against the waiters first) and 17
//! and later grant it ahead of the writer (a no-wait request may now go ahead of a
//! waiter that waits for its requester, as a waiting one always could).
//!
//! The bookkeeping says shared before a downgrade is sent: from the moment the server
//! frees the exclusive hold, another session of this manager may be granted the key
//! shared, and its entry must find this one shared (an exclusive entry beside it would
//! be taken for two sessions granted one lock). It says exclusive only once an upgrade
//! is confirmed: until then no other session can be granted the key, whatever the
//! answer. A multiplexed lock's place on its shared connection follows the entry, so
//! that a place dropped without leaving checks for the hold the session has (a shared
//! connection holds a lock id at most once, so the session's view is the lock's).
//!
//! Any answer but a confirmed change (or, for the upgrade, a confirmed "not now"), and
//! a future dropped once the statement may have been sent, close the session, which
//! frees the lock; the health room then loses every lock of that session at once, each
//! guard told (a connection the adapter closes itself wakes no monitor).

use std::sync::Arc;

use futures_util::lock::MutexGuard;
use locks_port::{
    AcquisitionErrorKind, LockAcquisitionError, LockError, LockInfo, LockLostError, LockMode,
    LostReason, LostSignal,
};
use tokio_postgres::types::ToSql;

use crate::bookkeeping::Ticket;
use crate::connection::Session;
use crate::errors::{MOVED_BETWEEN_SESSIONS, describe, driver_kind};
use crate::inner::Inner;
use crate::limit::{Expired, Limit};
use crate::query::Query;
use crate::slot::SessionSlot;

/// Takes the lock shared, then frees the exclusive hold: `true` when both happened,
/// NULL on a server session not the connection's own (nothing done there). `CASE`
/// orders the two calls (the operands of a plain `AND` may run in either order).
///
/// The shared request is the waiting form, `pg_advisory_lock_shared`, and it never
/// waits: every session queued for the key waits for this one's exclusive hold, and
/// PostgreSQL puts a request ahead of the waiters that wait for its own session and
/// grants it at once when no other session holds the lock. On PostgreSQL 13 to 16 the
/// `try` form would be refused as soon as a writer is queued (a no-wait request never
/// goes ahead of a waiter there), which is when a downgrade matters most. It returns `void`, which is
/// never NULL: the `IS NOT NULL` only orders it before the unlock.
static DOWNGRADE: Query = Query::new(
    "SELECT CASE WHEN current_setting('locks.session', true) = :marker \
     THEN CASE WHEN pg_advisory_lock_shared($1) IS NOT NULL THEN pg_advisory_unlock($1) \
     ELSE false END END",
);

/// Tries the lock exclusive beside the shared hold, then frees the shared hold:
/// 1 when both happened, 0 when the try was refused (nothing changed), -1 when the
/// exclusive lock was taken but the session held no shared one to free, NULL on a
/// server session not the connection's own (nothing done there).
static TRY_UPGRADE: Query = Query::new(
    "SELECT CASE WHEN current_setting('locks.session', true) = :marker \
     THEN CASE WHEN pg_try_advisory_lock($1) \
     THEN CASE WHEN pg_advisory_unlock_shared($1) THEN 1 ELSE -1 END \
     ELSE 0 END END",
);

/// The answer of a mode change's statement: its value (the inner `None`: NULL, the
/// statement reached another server session), `None` for no row, or why none came.
type ModeAnswer<T> = Result<Result<Option<Option<T>>, tokio_postgres::Error>, Expired>;

/// Downgrades the acquisition `ticket` (its guard's `info` and `lost` signal) to
/// shared; see [`LockGuard::downgrade`](locks_port::LockGuard::downgrade).
pub(crate) async fn downgrade(
    inner: &Inner,
    ticket: &Ticket,
    info: &mut LockInfo,
    lost: &LostSignal,
) -> Result<(), LockError> {
    let key = info.key().to_owned();
    let shared_slot = match inner.book().get_mut(ticket) {
        None => return Err(gone(&key, lost, LostReason::Released)),
        Some(held) if held.mode() == LockMode::Shared => return Ok(()),
        Some(held) => Arc::clone(held.slot()),
    };
    let mut slot = lock_session(inner, &shared_slot, &key, lost).await?;
    if !inner.book().set_mode(ticket, LockMode::Shared) {
        slot.answered();
        return Err(gone(&key, lost, LostReason::Released));
    }
    *info = info.clone().with_mode(LockMode::Shared);
    slot.detail = "the downgrade was dropped part-way";
    let answer = slot.run::<bool>(&DOWNGRADE, ticket.lock_id).await;
    let failure = match answer {
        Ok(Ok(Some(Some(true)))) => {
            slot.answered();
            let lock_id = ticket.lock_id;
            tracing::debug!(
                key = inner.shown(&key),
                lock_id,
                "lock downgraded to shared"
            );
            return Ok(());
        }
        Ok(Ok(Some(Some(false)))) => LockAcquisitionError::new(
            key.as_str(),
            AcquisitionErrorKind::Backend,
            "Database error: the session no longer held the lock exclusively",
        ),
        other => unanswered(&key, other, "downgrade"),
    };
    slot.detail = "the downgrade failed";
    Err(failed(inner, slot, ticket, &key, failure, "downgrade"))
}

/// Upgrades the acquisition `ticket` (its guard's `info` and `lost` signal) to
/// exclusive if that can be done at once; see
/// [`LockGuard::try_upgrade`](locks_port::LockGuard::try_upgrade).
pub(crate) async fn try_upgrade(
    inner: &Inner,
    ticket: &Ticket,
    info: &mut LockInfo,
    lost: &LostSignal,
) -> Result<bool, LockError> {
    let key = info.key().to_owned();
    let shared_slot = match inner.book().get_mut(ticket) {
        None => return Err(gone(&key, lost, LostReason::Released)),
        Some(held) if held.mode() == LockMode::Exclusive => return Ok(true),
        Some(held) => Arc::clone(held.slot()),
    };
    let mut slot = lock_session(inner, &shared_slot, &key, lost).await?;
    slot.detail = "the upgrade was dropped part-way";
    let answer = slot.run::<i32>(&TRY_UPGRADE, ticket.lock_id).await;
    let failure = match answer {
        Ok(Ok(Some(Some(0)))) => {
            slot.answered();
            return Ok(false);
        }
        Ok(Ok(Some(Some(1)))) => {
            if !inner.book().set_mode(ticket, LockMode::Exclusive) {
                // Taken out by `release(key)` or `release_all` meanwhile: its
                // unlock would look for the shared hold; closing frees the lock.
                slot.detail = "the lock was released during its upgrade";
                drop(slot);
                return Err(gone(&key, lost, LostReason::Released));
            }
            slot.answered();
            *info = info.clone().with_mode(LockMode::Exclusive);
            let lock_id = ticket.lock_id;
            tracing::debug!(
                key = inner.shown(&key),
                lock_id,
                "lock upgraded to exclusive"
            );
            return Ok(true);
        }
        Ok(Ok(Some(Some(_)))) => LockAcquisitionError::new(
            key.as_str(),
            AcquisitionErrorKind::Backend,
            "Database error: the session no longer held the lock shared",
        ),
        other => unanswered(&key, other, "upgrade"),
    };
    slot.detail = "the upgrade failed";
    Err(failed(inner, slot, ticket, &key, failure, "upgrade"))
}

/// Waits for the lock's session (a keepalive in flight on it; bounded by the answer
/// timeout, plus the stall patience when set, and a cancel here changes nothing): the slot, locked, its session to be
/// closed unless [`answered`](CloseUnlessAnswered::answered). Lost when the health
/// monitor took the session.
async fn lock_session<'s>(
    inner: &'s Inner,
    slot: &'s SessionSlot,
    key: &str,
    lost: &LostSignal,
) -> Result<CloseUnlessAnswered<'s>, LockError> {
    let locked = slot.lock().await;
    if locked.is_none() {
        return Err(gone(key, lost, LostReason::ConnectionClosed));
    }
    Ok(CloseUnlessAnswered {
        inner,
        slot,
        locked: Some(locked),
        detail: "the mode change was dropped part-way",
    })
}

/// Logs a failed mode change and closes its session (for the reason its `detail`
/// says), which frees the lock (and, on a shared connection, the others), their
/// guards told; the error to return.
fn failed(
    inner: &Inner,
    slot: CloseUnlessAnswered<'_>,
    ticket: &Ticket,
    key: &str,
    failure: LockAcquisitionError,
    what: &'static str,
) -> LockError {
    tracing::warn!(
        key = inner.shown(key),
        lock_id = ticket.lock_id,
        error = %failure,
        "advisory lock {what} failed; closed the session, which frees the lock"
    );
    drop(slot);
    failure.into()
}

/// The lock is no longer held: its signal's reason, or `otherwise`.
fn gone(key: &str, lost: &LostSignal, otherwise: LostReason) -> LockError {
    let reason = lost.reason().unwrap_or(otherwise);
    LockError::from(LockLostError::new(key, reason))
}

/// The error of a mode change that got no value: the statement reached another server
/// session, answered no row, failed (in the server's words) or was not answered in time.
fn unanswered<T>(key: &str, answer: ModeAnswer<T>, what: &str) -> LockAcquisitionError {
    let new = |kind, reason: &str| LockAcquisitionError::new(key, kind, reason);
    match answer {
        Ok(Ok(Some(None))) => new(
            AcquisitionErrorKind::Configuration,
            &format!("Database error: {MOVED_BETWEEN_SESSIONS}"),
        ),
        Ok(Ok(None)) => new(
            AcquisitionErrorKind::Backend,
            &format!("Database error: the {what} answered no row"),
        ),
        Ok(Err(error)) => {
            LockAcquisitionError::described(key, driver_kind(&error), describe(&error), error)
        }
        Err(Expired) => new(
            AcquisitionErrorKind::ConnectionLost,
            &format!("the server did not answer the {what} within the answer timeout"),
        ),
        Ok(Ok(Some(Some(_)))) => new(
            AcquisitionErrorKind::Backend,
            &format!("Database error: the {what} answered a value it never gives"),
        ),
    }
}

/// A locked session slot whose session is closed if this is dropped before
/// [`answered`](Self::answered) (the mode change failed, or its future was dropped
/// part-way), its locks lost at once for the reason `detail` gives.
struct CloseUnlessAnswered<'s> {
    inner: &'s Inner,
    slot: &'s SessionSlot,
    locked: Option<MutexGuard<'s, Option<Session>>>,
    detail: &'static str,
}

impl CloseUnlessAnswered<'_> {
    /// Runs a mode change's `query` on the locked session for `lock_id`, within the
    /// answer timeout; its one value.
    async fn run<T>(&mut self, query: &'static Query, lock_id: i64) -> ModeAnswer<T>
    where
        T: for<'r> tokio_postgres::types::FromSql<'r>,
    {
        let Some(session) = self.locked.as_mut().and_then(|locked| locked.as_mut()) else {
            unreachable!("the session was there when the slot was locked")
        };
        let limit = Limit::Waiting(self.inner.settings().answer_timeout);
        session
            .read_within(
                query,
                [&lock_id as &(dyn ToSql + Sync)],
                limit,
                |row| match row {
                    Some(row) => row.try_get::<_, Option<T>>(0).map(Some),
                    None => Ok(None),
                },
            )
            .await
    }

    /// The change was confirmed (or refused with nothing changed): the session stays,
    /// and the slot is free again.
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
