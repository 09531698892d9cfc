//! The acquisition with multiplexing: a try on a shared connection with room, else the
//! whole acquisition on a connection of its own, which then becomes a host; a wait for
//! whichever frees first when neither is free.

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, LockAcquisitionError, LockMode, timeout_reason,
};

use super::{Tried, acquire_session_until, step_limit, try_lock, try_session, wait_after_try};
use crate::checkout::{self, PoolWait};
use crate::errors::{
    MOVED_BETWEEN_SESSIONS, driver_error, no_answer, no_row, pool_exhausted, refused, with_timeout,
};
use crate::inner::Inner;
use crate::limit::Deadline;
use crate::multiplex::{HostFailure, Membership, SharedTry};
use crate::pool;

/// `acquire` with multiplexing: a try on a shared connection, else the whole
/// acquisition on a connection of its own, which then becomes a host. With no
/// shared connection that has room and no pool connection free, it waits for
/// whichever frees first (room on a shared connection: another try), until the
/// deadline ([`PoolUnavailable`](AcquisitionErrorKind::PoolUnavailable) then).
pub(super) async fn acquire_member(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    options: AcquireOptions,
    deadline: Option<Deadline>,
) -> Result<Membership, LockAcquisitionError> {
    let mode = options.mode();
    let multiplexer = inner.multiplexer().expect("called only when multiplexing");
    let mut woken = false;
    loop {
        // Woken by room freed after the deadline: no try starts past it (a try that
        // outlives its limit closes the shared connection, with the others on it).
        if let Some(deadline) = deadline.filter(|deadline| woken && deadline.passed()) {
            let what = format!(
                "{} waiting for room on a shared connection or a pool connection",
                timeout_reason(deadline.timeout)
            );
            let size = pool::max_size(inner.pool());
            return Err(pool_exhausted(key, &what, size, Some(deadline)));
        }
        woken = true;
        // Enabled before looking for room, so that room freed meanwhile wakes it.
        let mut room = std::pin::pin!(multiplexer.room_freed());
        room.as_mut().enable();
        let limit = step_limit(inner, deadline);
        let pool_has_room = pool::has_room(inner.pool(), multiplexer.pool_waiters());
        let tried = multiplexer
            .try_on_host(lock_id, mode, limit, pool_has_room)
            .await;
        match tried.map_err(|failure| host_failure(inner, key, failure, deadline))? {
            SharedTry::Granted(member) => return Ok(member),
            SharedTry::Busy => {
                if let Some(deadline) = deadline.filter(|deadline| deadline.passed()) {
                    return Err(LockAcquisitionError::timed_out(key, deadline.timeout));
                }
                let session = acquire_session_until(inner, key, lock_id, options, deadline);
                return Ok(multiplexer.adopt(session.await?, lock_id, mode));
            }
            SharedTry::NoHost => {}
        }
        // A connection of its own: an idle one or a new one (counted as a host on its
        // way from now: see `Multiplexer::opening`), else whichever frees first, a
        // pool connection or room on a shared one (then another try).
        let mut opening = pool_has_room.then(|| multiplexer.opening());
        let session = match checkout::checkout(inner, key, PoolWait::No, deadline).await {
            Ok(session) => session,
            Err(error) if error.kind() == AcquisitionErrorKind::PoolUnavailable => {
                opening = None;
                let wait = deadline.map_or(PoolWait::Forever, PoolWait::Until);
                let _waiting = multiplexer.waiting_for_pool();
                tokio::select! {
                    biased;
                    session = checkout::checkout(inner, key, wait, deadline) => session?,
                    () = room => {
                        // Another look, after the scheduler's turn: a loop that found
                        // room notified at every look would otherwise never give its
                        // worker back (timers, the releases that free room).
                        tokio::task::yield_now().await;
                        continue;
                    }
                }
            }
            Err(error) => return Err(error),
        };
        let opening = opening.unwrap_or_else(|| multiplexer.opening());
        let session = match try_lock(inner, key, lock_id, mode, session, deadline).await? {
            Tried::Granted(session) => session,
            Tried::Busy(session) => {
                drop(opening);
                wait_after_try(inner, key, lock_id, options, deadline, session).await?
            }
        };
        return Ok(multiplexer.adopt(session, lock_id, mode));
    }
}

/// `try_acquire` with multiplexing: one try, on a shared connection if one has
/// room, else on a connection of its own (which then becomes a host).
pub(super) async fn try_member(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
) -> Result<Option<Membership>, LockAcquisitionError> {
    let multiplexer = inner.multiplexer().expect("called only when multiplexing");
    let limit = step_limit(inner, None);
    let pool_has_room = pool::has_room(inner.pool(), multiplexer.pool_waiters());
    let tried = multiplexer
        .try_on_host(lock_id, mode, limit, pool_has_room)
        .await;
    match tried.map_err(|failure| host_failure(inner, key, failure, None))? {
        SharedTry::Granted(member) => return Ok(Some(member)),
        SharedTry::Busy => return Ok(None),
        SharedTry::NoHost => {}
    }
    let refused = match try_session(inner, key, lock_id, mode).await {
        Ok(session) => return Ok(session.map(|session| multiplexer.adopt(session, lock_id, mode))),
        // The pool's last connection went meanwhile: a busy shared one will do.
        Err(error) if pool_has_room && error.kind() == AcquisitionErrorKind::PoolUnavailable => {
            error
        }
        Err(error) => return Err(error),
    };
    let tried = multiplexer.try_on_host(lock_id, mode, limit, false).await;
    match tried.map_err(|failure| host_failure(inner, key, failure, None))? {
        SharedTry::Granted(member) => Ok(Some(member)),
        SharedTry::Busy => Ok(None),
        SharedTry::NoHost => Err(refused),
    }
}

/// The error of a failed try on a shared connection.
fn host_failure(
    inner: &Inner,
    key: &str,
    failure: HostFailure,
    deadline: Option<Deadline>,
) -> LockAcquisitionError {
    match failure {
        HostFailure::MovedBetweenSessions => refused(key, MOVED_BETWEEN_SESSIONS, deadline),
        HostFailure::Failed(error) => with_timeout(driver_error(key, error), deadline),
        HostFailure::NoAnswer => no_answer(key, deadline, inner.settings().answer_timeout),
        HostFailure::NoRow => no_row(key, deadline),
    }
}
