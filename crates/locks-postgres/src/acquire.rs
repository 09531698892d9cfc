//! Acquisition up to the bookkeeping, multiplexed or not: a pool checkout (or a place
//! on a shared connection), one `pg_try_advisory_lock`, and if the lock is busy a wait
//! in the server's queue (or the polling of the Python `eventsource` library), every
//! step inside the call's deadline. The wait is the same for one key and for the next
//! key of an `acquire_many`.

#[macro_use]
mod answer;
mod group;
mod member;

use answer::{Read, answered_after_setup, read_answer, tried};
pub(crate) use answer::{answered, try_lock};
pub(crate) use group::acquire_group;
use member::{acquire_member, try_member};

use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;

use locks_port::{AcquireOptions, LockAcquisitionError, LockMode, WaitStrategy};
use tokio_postgres::error::SqlState;
use tracing::Span;

use crate::bookkeeping::Holding;
use crate::checkout;
use crate::checkout::{Attempt, PoolWait};
use crate::connection::Session;
use crate::errors::{driver_error, with_timeout};
use crate::grant;
use crate::guard::PostgresLockGuard;
use crate::inner::Inner;
use crate::limit::{Deadline, Expired, Limit};
use crate::multiplex::Membership;
use crate::slot::new_slot;
use crate::sql::{Answer, Statement};

/// A granted lock before the bookkeeping: on a session of its own, or on a shared
/// connection.
pub(crate) enum Grant {
    Own(Session),
    Shared(Membership),
}

/// What one `pg_try_advisory_lock` found; either way the caller owns the session.
pub(crate) enum Tried {
    /// The lock is held by the session.
    Granted(Session),
    /// Someone else holds it; the session holds nothing.
    Busy(Session),
}

/// [`acquire_session_until`] written out where it is used (an expression with
/// `.await`s, for an `async` body returning a `Result` with a
/// [`LockAcquisitionError`]): the acquisition of a lock on a session of its own,
/// without a layer of future of its own inside [`acquire_grant`]. The checkout, the
/// first try and its answer are written out too ([`checkout::checked_out!`],
/// [`answered!`], [`tried`]): each layer of future costs the uncontended cycle its
/// moves and its polls.
macro_rules! session_until {
    ($inner:expr, $key:expr, $lock_id:expr, $options:expr, $deadline:expr) => {{
        let (inner, key, lock_id, options, deadline): (
            &Inner,
            &str,
            i64,
            AcquireOptions,
            Option<Deadline>,
        ) = ($inner, $key, $lock_id, $options, $deadline);
        let wait = deadline.map_or(PoolWait::Forever, PoolWait::Until);
        let session = checkout::checked_out!(inner, key, wait, deadline)?;
        let mode = options.mode();
        let polls = deadline.is_some() && options.wait_strategy() == WaitStrategy::Poll;
        // Every acquisition starts with one pg_try_advisory_lock: uncontended, that
        // is the only statement (and the cheapest). It cannot jump the server's
        // queue: a released lock is granted to the first waiter at release, and a
        // request that conflicts with a queued waiter waits behind it, so it is
        // never seen free while others wait. Except when this manager's own unlock
        // of the key is still in flight on another connection (a release in the
        // background): a try could reach the server first and find the key busy, so
        // the acquisition waits in the queue at once and is granted the moment the
        // unlock lands.
        let own_unlock_in_flight =
            inner.settings().release_in_background && !polls && inner.book().is_releasing(lock_id);
        let tried = if own_unlock_in_flight {
            tracing::debug!(
                key = inner.shown(key),
                lock_id,
                "this manager's unlock of the key is in flight: waiting in the queue for it"
            );
            Tried::Busy(session)
        } else {
            let statement = Statement::TryLock { lock_id, mode };
            let limit = step_limit(inner, deadline);
            let answer = answered!(inner, key, session, statement, limit, deadline)?;
            tried(key, deadline, answer)?
        };
        match tried {
            Tried::Granted(session) => Ok(session),
            Tried::Busy(session) => {
                wait_after_try(inner, key, lock_id, options, deadline, session).await
            }
        }
    }};
}

/// The acquisition up to the bookkeeping, multiplexed or not.
pub(crate) async fn acquire_grant(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    options: AcquireOptions,
) -> Result<Grant, LockAcquisitionError> {
    let deadline = options.timeout().map(Deadline::after);
    match inner.multiplexer() {
        // Boxed: the opt-in path stays out of the default path's future.
        Some(_) => Box::pin(acquire_member(inner, key, lock_id, options, deadline))
            .await
            .map(Grant::Shared),
        None => session_until!(inner, key, lock_id, options, deadline).map(Grant::Own),
    }
}

/// `try_acquire` up to the bookkeeping, multiplexed or not.
pub(crate) async fn try_grant(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
) -> Result<Option<Grant>, LockAcquisitionError> {
    match inner.multiplexer() {
        Some(_) => Ok(Box::pin(try_member(inner, key, lock_id, mode))
            .await?
            .map(Grant::Shared)),
        None => Ok(try_session(inner, key, lock_id, mode)
            .await?
            .map(Grant::Own)),
    }
}

/// What [`register_grant`] hands back: the guard at once, or the fencing token's
/// round trip (boxed) before it.
pub(crate) type Registering<'a> = Either<
    Ready<Result<PostgresLockGuard, LockAcquisitionError>>,
    Pin<Box<dyn Future<Output = Result<PostgresLockGuard, LockAcquisitionError>> + Send + 'a>>,
>;

/// Records a granted lock and hands out its guard: at once, or after taking its
/// fencing token when fencing is on. A plain function: without fencing the
/// bookkeeping is done here and the future is ready, with no state machine of its
/// own around the default path.
pub(crate) fn register_grant<'a>(
    inner: &'a Arc<Inner>,
    key: Arc<str>,
    lock_id: i64,
    mode: LockMode,
    grant: Grant,
    span: &'a Span,
) -> Registering<'a> {
    let (slot, holding, notifier) = match grant {
        Grant::Own(mut session) => {
            let notifier = session.take_spare_notifier();
            (new_slot(session), Holding::Alone, notifier)
        }
        Grant::Shared(member) => (Arc::clone(member.slot()), Holding::Shared(member), None),
    };
    if inner.settings().fencing {
        let fencing = grant::register_fenced(inner, key, lock_id, mode, slot, holding, span);
        return Either::Right(Box::pin(fencing));
    }
    let grant = (key, lock_id, mode, slot, holding);
    let guard = grant::record(inner, grant, notifier, None, span);
    Either::Left(std::future::ready(Ok(guard)))
}

/// The limit of one statement's answer in a call with `deadline`: the deadline plus
/// the margin, or (an unbounded call) the answer timeout.
pub(crate) fn step_limit(inner: &Inner, deadline: Option<Deadline>) -> Limit {
    let settings = inner.settings();
    Deadline::limit(deadline, settings.deadline_margin, settings.answer_timeout)
}

/// The whole acquisition on a session of its own, up to the bookkeeping, within
/// `deadline` (already running; `None` for an unbounded call).
pub(crate) async fn acquire_session_until(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    options: AcquireOptions,
    deadline: Option<Deadline>,
) -> Attempt {
    session_until!(inner, key, lock_id, options, deadline)
}

/// The wait for a lock found busy (or about to be freed by this manager), on
/// `session`, which holds nothing of it.
async fn wait_after_try(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    options: AcquireOptions,
    deadline: Option<Deadline>,
    session: Session,
) -> Attempt {
    let mode = options.mode();
    tell_of_own_hold(
        inner,
        key,
        lock_id,
        mode,
        "waits until that guard is released",
    );
    match (deadline, options.wait_strategy()) {
        // The waits are boxed: kept out of the uncontended path's future, which
        // is moved on every call (a large future costs a copy per move).
        (Some(deadline), WaitStrategy::Poll) => {
            Box::pin(poll(
                inner,
                key,
                lock_id,
                mode,
                session,
                deadline,
                options.retry_interval(),
            ))
            .await
        }
        // Without a timeout every strategy waits in the queue, as in the Python
        // library.
        _ => {
            let waiting = wait_in_queue(inner, key, lock_id, mode, session, deadline, false);
            Box::pin(waiting).await
        }
    }
}

/// `try_acquire`: a checkout that never waits for a slot and one try.
pub(crate) async fn try_session(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
) -> Result<Option<Session>, LockAcquisitionError> {
    let session = checkout::checkout(inner, key, PoolWait::No, None).await?;
    match try_lock(inner, key, lock_id, mode, session, None).await? {
        Tried::Granted(session) => Ok(Some(session)),
        Tried::Busy(session) => {
            session.into_pool();
            Ok(None)
        }
    }
}

/// `error`, saying so when it is a timeout and this manager holds `key` itself in a
/// mode that excludes `mode` (another of its guards): the caller's own hold, not another
/// process, kept the lock busy. Asks the book only, on the failure path.
pub(crate) fn said_if_held_here(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
    error: LockAcquisitionError,
) -> LockAcquisitionError {
    if !error.is_timeout() {
        return error;
    }
    let held = inner.book().holding_against(key, lock_id, mode);
    match held {
        Some((held_mode, since)) => {
            let holder_id = inner.holder_id().map(String::as_str);
            error.held_by_this_manager(held_mode, since, holder_id)
        }
        None => error,
    }
}

/// A debug event when an acquisition of `key` in `mode` finds the key busy and this
/// manager holds it itself; `then` says what the acquisition does about it. Only on
/// the busy path, and only when the event would be recorded: one look in the book, no
/// round trip, no allocation.
pub(crate) fn tell_of_own_hold(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
    then: &'static str,
) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let held = inner.book().holding_against(key, lock_id, mode);
    if let Some((held_mode, _since)) = held {
        tracing::debug!(
            key = inner.shown(key),
            lock_id,
            mode = mode.as_str(),
            held_mode = held_mode.as_str(),
            holder_id = inner.holder_id().map(String::as_str),
            then,
            "the key is busy because this manager holds it itself"
        );
    }
}

/// After a wait ended in an error on a live connection, makes sure the session
/// does not hold the lock (it can be granted just as the wait is cancelled). The
/// session, when that is shown; else it is closed.
///
/// A session that holds nothing else (every wait but an `acquire_many`'s) frees every
/// advisory lock it holds, which never reads `pg_locks`: after a timed-out wait the
/// server's whole lock table is not copied, under every lock partition, at any number of
/// locks held on the server. One that holds the first locks of an `acquire_many`
/// (`holds_others`: settled only when `lock_timeout` fired before the deadline, a wait
/// of ~24.8 days) checks `pg_locks` for this lock alone and unlocks it only if held.
async fn settle_after_failed_wait(
    inner: &Inner,
    lock_id: i64,
    mode: LockMode,
    holds_others: bool,
    mut session: Session,
) -> Option<Session> {
    let check = if holds_others {
        Statement::UnlockIfHeld { lock_id, mode }
    } else {
        Statement::UnlockAll
    };
    let limit = Limit::Waiting(inner.settings().answer_timeout);
    match check.run(&mut session, limit).await {
        Ok(Ok(Answer::Bool(was_held))) => {
            if holds_others && was_held {
                tracing::debug!(
                    lock_id,
                    "the lock was granted as the wait ended; released it"
                );
            }
            Some(session)
        }
        Ok(
            Ok(Answer::Locked | Answer::FirstBusy(_) | Answer::WrongSession | Answer::NoRow)
            | Err(_),
        )
        | Err(Expired) => {
            session.close();
            None
        }
    }
}

/// Waits in the server's queue: one `pg_advisory_lock` bounded by `lock_timeout`.
/// `holds_others`: the session holds the first locks of an `acquire_many`, so it is
/// never given back to the pool, only closed on failure (which frees them all).
pub(crate) async fn wait_in_queue(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
    mut session: Session,
    deadline: Option<Deadline>,
    holds_others: bool,
) -> Attempt {
    let give_back = |session: Session| {
        if holds_others {
            session.close();
        } else {
            session.into_pool();
        }
    };
    loop {
        let margin = inner.settings().deadline_margin;
        let Some((statement, limit)) = Statement::wait(deadline, lock_id, mode, margin) else {
            // No time left to wait; the first try has been made, so the session
            // does not hold this lock.
            give_back(session);
            let timeout = deadline.map_or(Duration::ZERO, |deadline| deadline.timeout);
            return Err(LockAcquisitionError::timed_out(key, timeout));
        };
        let outcome;
        (session, outcome) = answered(inner, key, session, statement, limit, deadline).await?;
        let error = match outcome {
            Ok(_) => return Ok(session),
            Err(error) => error,
        };
        let timed_out = error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE);
        // lock_timeout can fire before the deadline: it is capped at ~24.8 days.
        let early = timed_out && deadline.is_some_and(|deadline| !deadline.passed());
        if error.is_closed() || (holds_others && !early) {
            session.close();
        } else if let Some(settled) =
            settle_after_failed_wait(inner, lock_id, mode, holds_others, session).await
        {
            if early {
                session = settled;
                continue;
            }
            give_back(settled);
        }
        return Err(match deadline {
            Some(deadline) if timed_out => LockAcquisitionError::timed_out(key, deadline.timeout),
            _ => with_timeout(driver_error(key, error), deadline),
        });
    }
}

/// The strategy of the Python library, after the first try: `pg_try_advisory_lock`
/// every `retry_interval` on one session until the deadline.
async fn poll(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
    mut session: Session,
    deadline: Deadline,
    retry_interval: Duration,
) -> Attempt {
    // A session idle for a lease's `idle_session_timeout` would be ended between tries.
    let retry_interval = retry_interval.max(Duration::from_millis(1)).min(
        inner
            .idle_session_limit()
            .map_or(Duration::MAX, |bound| bound / 2),
    );
    loop {
        if deadline.passed() {
            session.into_pool();
            return Err(LockAcquisitionError::timed_out(key, deadline.timeout));
        }
        tokio::time::sleep(retry_interval.min(deadline.remaining())).await;
        session = match try_lock(inner, key, lock_id, mode, session, Some(deadline)).await? {
            Tried::Granted(session) => return Ok(session),
            Tried::Busy(session) => session,
        };
    }
}
