//! A grant booked: the fencing token taken when the manager hands them out, the entry
//! recorded in the book, the guard handed out. The book gives back what a grant
//! displaced (a second exclusive grant of one lock id, which only a transaction-pooling
//! proxy can make happen); the monitor is told here, by the caller of the book.

use std::sync::Arc;

use locks_port::{AcquisitionErrorKind, LockAcquisitionError, LockMode, LossNotifier};
use tracing::{Instrument, Span};

use crate::bookkeeping::{Granted, Held, Holding};
use crate::fencing;
use crate::guard::PostgresLockGuard;
use crate::inner::Inner;
use crate::slot::SessionSlot;

/// Takes the fencing token of a granted lock (on the session in `slot`), then
/// records it as [`record`](record) does. On failure the session is closed,
/// which frees the lock.
pub(crate) async fn register_fenced(
    inner: &Arc<Inner>,
    shared_key: Arc<str>,
    lock_id: i64,
    mode: LockMode,
    slot: SessionSlot,
    holding: Holding,
    span: &Span,
) -> Result<PostgresLockGuard, LockAcquisitionError> {
    let key: &str = &shared_key;
    let fencing_token = {
        let mut session = slot.lock().await;
        let Some(session) = session.as_mut() else {
            return Err(LockAcquisitionError::new(
                key,
                AcquisitionErrorKind::ConnectionLost,
                "Database error: the connection ended before the fencing token",
            ));
        };
        let taking =
            fencing::next_fencing_token(inner, key, lock_id, session).instrument(span.clone());
        Box::pin(taking).await?
    };
    let grant = (shared_key, lock_id, mode, slot, holding);
    Ok(record(inner, grant, None, Some(fencing_token), span))
}

/// Records a granted lock (its key, lock id and mode, on the session in a slot,
/// owned as the [`Holding`] says) and hands out its guard; its loss notifier is
/// `spare` renewed (the connection's last lock's, kept with it), or a new one. No I/O.
pub(crate) fn record(
    inner: &Arc<Inner>,
    (shared_key, lock_id, mode, slot, holding): (Arc<str>, i64, LockMode, SessionSlot, Holding),
    spare: Option<LossNotifier>,
    fencing_token: Option<i64>,
    span: &Span,
) -> PostgresLockGuard {
    let granted = Granted::now();
    let mut info = granted
        .info(Arc::clone(&shared_key), lock_id, inner.holder_id().cloned())
        .with_mode(mode);
    if let Some(fencing_token) = fencing_token {
        info = info.with_fencing_token(fencing_token);
    }
    let ticket = inner.next_ticket();
    let notifier = spare.map_or_else(LossNotifier::new, LossNotifier::renewed);
    let lost = notifier.signal();
    tracing::debug!(
        parent: span,
        key = inner.shown(&shared_key),
        lock_id,
        mode = mode.as_str(),
        holder_id = inner.holder_id().map(String::as_str),
        "lock acquired"
    );
    let entry = Held::new(shared_key, ticket, &info, granted, slot, notifier, holding);
    // One entry: what it displaces comes back inline (no list to gather into).
    let displaced = inner.book().insert(entry);
    lose_displaced_and_watch(inner, displaced, span);
    PostgresLockGuard::new(Arc::clone(inner), info, ticket, lost)
}

/// Adds the entries of a grant to the bookkeeping and makes sure the health
/// monitor runs.
pub(crate) fn book_entries(
    inner: &Arc<Inner>,
    entries: impl IntoIterator<Item = Held>,
    span: &Span,
) {
    let mut displaced = Vec::new();
    {
        let mut book = inner.book();
        for entry in entries {
            displaced.extend(book.insert(entry));
        }
    }
    lose_displaced_and_watch(inner, displaced, span);
}

/// Tells the monitor of the entries a grant displaced, and makes sure it runs.
fn lose_displaced_and_watch(
    inner: &Arc<Inner>,
    displaced: impl IntoIterator<Item = Held>,
    span: &Span,
) {
    for previous in displaced {
        inner.lose_displaced(previous, span);
    }
    inner.ensure_monitor();
}
