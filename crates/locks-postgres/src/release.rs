//! The release of held locks: the unlock statement on the lock's session (one lock, or
//! what is left of a group in one statement), giving the session back when it holds
//! nothing more and closing it when the unlock failed, on the caller's task or on one
//! of its own for a dropped guard; and `release_all`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_util::lock::MutexGuard;

use locks_port::{AcquisitionErrorKind, ReleaseOutcome};
use smallvec::SmallVec;
use tracing::{Instrument, Span};

use crate::bookkeeping::{Entries, Held};
use crate::connection::Session;
use crate::errors::{MOVED_BETWEEN_SESSIONS, describe, driver_kind, sqlstate};
use crate::inner::Inner;
use crate::limit::Expired;
use crate::sql::{Answer, Answered, Statement};
use crate::telemetry::{record_failure, record_released, release_span};

/// Takes every entry out and unlocks it; how many there were. A shared connection
/// whose every lock is among them gets one `pg_advisory_unlock_all()`.
pub(crate) async fn release_all(inner: &Arc<Inner>) -> usize {
    let drained = inner.take_all();
    let count = drained.len();
    let drained = match inner.multiplexer() {
        Some(multiplexer) => multiplexer.unlock_whole_hosts(drained, Held::place).await,
        None => drained,
    };
    for held in drained {
        unlock_to_the_end(inner, held).await;
    }
    count
}

/// Unlocks, on a task of their own, locks a dropped guard took out of the
/// bookkeeping (one lock, or what is left of a group); with no runtime at hand their
/// sessions are closed instead, which frees them on the server just the same. (If
/// the runtime drops the task before it runs, the sessions inside are closed by
/// their own drop.)
pub(crate) fn unlock_later(inner: &Arc<Inner>, taken: Entries) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let inner = Arc::clone(inner);
            runtime.spawn(async move { unlock_together(&inner, taken).await });
        }
        Err(_) => drop(taken),
    }
}

/// Unlocks locks taken out of the bookkeeping that share one session (one lock, or
/// what is left of a group) in one round trip; `Unlocked` for none. Never fails:
/// otherwise as [`unlock`](unlock).
pub(crate) async fn unlock_together(inner: &Inner, mut taken: Entries) -> ReleaseOutcome {
    if taken.len() <= 1 {
        return match taken.pop() {
            Some(held) => unlock(inner, held).await,
            None => ReleaseOutcome::Unlocked,
        };
    }
    let first = &taken[0];
    debug_assert!(
        taken
            .iter()
            .all(|held| Arc::ptr_eq(held.slot(), first.slot()))
    );
    let span = release_span(
        inner.settings().span_level,
        inner.shown(first.key()),
        first.lock_id(),
        first.mode(),
    );
    let lock_ids: SmallVec<[i64; 8]> = taken.iter().map(|held| held.lock_id()).collect();
    let statement = Statement::UnlockEach {
        lock_ids: &lock_ids,
        mode: first.mode(),
    };
    let recorder = span.clone();
    let unlocking = unlock_on_session(inner, &mut taken, statement, &recorder);
    Box::pin(unlocking).instrument(span).await
}

/// Unlocks a lock taken out of the bookkeeping. Never fails: when the unlock fails
/// or the session did not hold the lock, the session is closed instead of being
/// given back, which frees whatever it held.
pub(crate) async fn unlock(inner: &Inner, held: Held) -> ReleaseOutcome {
    unlock_held!(inner, held)
}

/// [`unlock`] for a caller's future that may be dropped part-way (`release(key)`,
/// `release_all`, a guard's `release`). A lock on a shared connection's place
/// ([`multiplex`](crate::PostgresLockManagerBuilder::multiplex)) is unlocked to the
/// end: dropped with its unlock in flight, the unlock goes on on a task of its own and
/// its answer frees the place, so nothing has to ask `pg_locks` (a copy of the server's
/// whole lock table, `docs/capacity.md`) whether it ran. Any other lock is unlocked in
/// place (dropped part-way, its session is closed, which frees it).
pub(crate) async fn unlock_to_the_end(inner: &Arc<Inner>, mut held: Held) -> ReleaseOutcome {
    if held.place().is_none() {
        return unlock_held!(inner.as_ref(), held);
    }
    let inner = Arc::clone(inner);
    ToTheEnd(Some(Box::pin(async move { unlock(&inner, held).await }))).await
}

/// A future that, dropped before it is done, finishes on a task of its own (inside a
/// Tokio runtime; without one it is dropped where it is).
struct ToTheEnd<F: Future<Output = ReleaseOutcome> + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future<Output = ReleaseOutcome> + Send + 'static> Future for ToTheEnd<F> {
    type Output = ReleaseOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ReleaseOutcome> {
        let Some(running) = self.0.as_mut() else {
            return Poll::Ready(ReleaseOutcome::AlreadyReleased);
        };
        let outcome = ready!(running.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(outcome)
    }
}

impl<F: Future<Output = ReleaseOutcome> + Send + 'static> Drop for ToTheEnd<F> {
    fn drop(&mut self) {
        if let (Some(running), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(running);
        }
    }
}

/// [`unlock`] written out where it is used (an expression with `.await`, for an
/// `async` body): a guard's release, without a layer of future of its own around
/// it. As `cached_or_prepared!` in `connection.rs`.
macro_rules! unlock_held {
    ($inner:expr, $held:expr) => {{
        let (inner, mut held): (&$crate::inner::Inner, $crate::bookkeeping::Held) = ($inner, $held);
        let span = $crate::telemetry::release_span(
            inner.settings().span_level,
            inner.shown(held.key()),
            held.lock_id(),
            held.mode(),
        );
        // The span's own handle, to record the outcome on (cheaper than looking up
        // the current span).
        let recorder = span.clone();
        let statement = $crate::sql::Statement::Unlock {
            lock_id: held.lock_id(),
            mode: held.mode(),
        };
        // As the acquisition: a span no subscriber records is not entered (and the
        // unlock is written out here, without a future of its own).
        if span.is_disabled() {
            $crate::release::on_session!(
                inner,
                std::slice::from_mut(&mut held),
                statement,
                &recorder
            )
        } else {
            let unlocking = std::pin::pin!($crate::release::unlock_on_session(
                inner,
                std::slice::from_mut(&mut held),
                statement,
                &recorder
            ));
            tracing::Instrument::instrument(unlocking, span).await
        }
    }};
}
pub(crate) use unlock_held;

/// Runs the unlock `statement` of `held` (locks of one session), then gives the
/// session back when it holds nothing more, or closes it when the unlock failed.
pub(crate) async fn unlock_on_session(
    inner: &Inner,
    held: &mut [Held],
    statement: Statement<'_>,
    recorder: &Span,
) -> ReleaseOutcome {
    on_session!(inner, held, statement, recorder)
}

/// [`unlock_on_session`] written out where it is used (an expression with `.await`,
/// for an `async` body): a guard's release, without a layer of future of its own.
/// After the answer, [`settle`] decides.
macro_rules! on_session {
    ($inner:expr, $held:expr, $statement:expr, $recorder:expr) => {{
        let (inner, held, statement, recorder): (
            &$crate::inner::Inner,
            &mut [$crate::bookkeeping::Held],
            $crate::sql::Statement<'_>,
            &tracing::Span,
        ) = ($inner, $held, $statement, $recorder);
        match held.first() {
            None => locks_port::ReleaseOutcome::Unlocked,
            Some(first) => {
                // Waits for a keepalive in flight (bounded by the answer timeout, plus
                // the stall patience when set); free, as it nearly always is, the slot
                // is taken without the lock's future.
                let slot = std::sync::Arc::clone(first.slot());
                let mut slot = match slot.try_lock() {
                    Ok(slot) => slot,
                    Err(_) => slot.lock().await,
                };
                match slot.as_mut() {
                    // The health monitor took it: the lock was lost meanwhile.
                    None => {
                        $crate::telemetry::record_released(recorder, false);
                        locks_port::ReleaseOutcome::AlreadyReleased
                    }
                    Some(session) => {
                        for held in held.iter_mut() {
                            held.unlocking();
                        }
                        // Pinned where made (the statement's future is large), and
                        // gone after.
                        let answer = {
                            let limit =
                                $crate::limit::Limit::Waiting(inner.settings().answer_timeout);
                            let running = std::pin::pin!(statement.run(session, limit));
                            running.await
                        };
                        $crate::release::settle(inner, held, slot, &answer, recorder)
                    }
                }
            }
        }
    }};
}
pub(crate) use on_session;

/// What an unlock's `answer` leaves: the session (in `slot`) given back when it
/// holds nothing more, or closed when the unlock failed.
pub(crate) fn settle(
    inner: &Inner,
    held: &mut [Held],
    mut slot: MutexGuard<'_, Option<Session>>,
    answer: &Answered,
    recorder: &Span,
) -> ReleaseOutcome {
    let unlocked = matches!(answer, Ok(Ok(Answer::Bool(true))));
    // The session of a group, or a shared connection's, holds the others' locks
    // until the last unlock: then it stays in the slot.
    let mut last = false;
    for held in held.iter_mut() {
        last |= held.leave_session();
    }
    if unlocked {
        record_released(recorder, true);
        let first = &held[0];
        tracing::debug!(
            key = inner.shown(first.key()),
            lock_id = first.lock_id(),
            "lock released"
        );
    }
    if unlocked && !last {
        return ReleaseOutcome::Unlocked;
    }
    let Some(session) = slot.take() else {
        return ReleaseOutcome::AlreadyReleased;
    };
    drop(slot);
    if unlocked {
        crate::slot::keep(held[0].slot(), held[0].notifier(), session);
        return ReleaseOutcome::Unlocked;
    }
    // Every path but a confirmed unlock closes the session, which frees whatever
    // it held.
    let (kind, code) = failed_unlock(inner, &held[0], answer);
    session.close();
    record_released(recorder, false);
    record_failure(recorder, kind, code);
    ReleaseOutcome::SessionClosed
}

/// Says why an unlock failed (the session is closed next); its kind and SQLSTATE.
fn failed_unlock<'a>(
    inner: &Inner,
    held: &Held,
    answer: &'a Answered,
) -> (AcquisitionErrorKind, Option<&'a str>) {
    let (key, lock_id) = (inner.shown(held.key()), held.lock_id());
    match answer {
        Ok(Ok(Answer::WrongSession)) => {
            tracing::error!(
                key,
                lock_id,
                reason = MOVED_BETWEEN_SESSIONS,
                "Error releasing advisory lock: the unlock reached another server \
                 session and did nothing; closed the connection, but the server \
                 session that took the lock may still hold it"
            );
            (AcquisitionErrorKind::Configuration, None)
        }
        Ok(Ok(Answer::NoRow)) => {
            tracing::warn!(
                key,
                lock_id,
                "Error releasing advisory lock: the unlock answered no row; closed the \
                 session, which frees it"
            );
            (AcquisitionErrorKind::Backend, None)
        }
        Ok(Ok(_)) => {
            tracing::warn!(
                key,
                lock_id,
                "Error releasing advisory lock: the session no longer held it; \
                 closed the session"
            );
            (AcquisitionErrorKind::Backend, None)
        }
        Ok(Err(error)) => {
            tracing::warn!(
                key,
                lock_id,
                error = %describe(error),
                sqlstate = sqlstate(error),
                "Error releasing advisory lock; closed the session, which frees it"
            );
            inner.judge_failed_release(held, error);
            (driver_kind(error), sqlstate(error))
        }
        Err(Expired) => {
            tracing::warn!(
                key,
                lock_id,
                "Error releasing advisory lock: the server did not answer; closed \
                 the session, which frees it"
            );
            (AcquisitionErrorKind::ConnectionLost, None)
        }
    }
}
