//! A group of keys on one session (`acquire_many`): the tries of every key in one
//! statement, the wait for a busy one alone, never holding a later key while waiting.

use locks_port::{AcquireOptions, AcquisitionErrorKind, LockAcquisitionError, LockMode};

use super::{
    Tried, answered, said_if_held_here, step_limit, tell_of_own_hold, try_lock, wait_in_queue,
};
use crate::checkout::{self, PoolWait};
use crate::connection::Session;
use crate::errors::{driver_error, with_timeout};
use crate::inner::Inner;
use crate::limit::Deadline;
use crate::sql::{Answer, Statement};

/// Takes every lock of `lock_ids` (in the global order; `keys` are theirs, to name
/// in errors) on one session; on any failure the session is closed, which frees
/// what it took. Uncontended, that is one checkout and one round trip: the tries of
/// every key go in one statement. When a key is busy the session keeps the keys
/// before it, the statement itself frees those after it (never held while waiting
/// out of order), and the wait for it is the single key's wait; then the tries of
/// the rest go in one statement again.
pub(crate) async fn acquire_group(
    inner: &Inner,
    keys: &[&str],
    lock_ids: &[i64],
    options: AcquireOptions,
) -> Result<Session, LockAcquisitionError> {
    let deadline = options.timeout().map(Deadline::after);
    let mode = options.mode();
    let first = keys.first().copied().unwrap_or("");
    let wait = deadline.map_or(PoolWait::Forever, PoolWait::Until);
    let mut session = checkout::checkout(inner, first, wait, deadline).await?;
    let mut next = 0;
    while next < lock_ids.len() {
        let (rest_keys, rest) = (&keys[next..], &lock_ids[next..]);
        let tried = rest.len();
        let first_busy;
        (session, first_busy) = try_each(inner, rest_keys, rest, mode, session, deadline).await?;
        let Some(busy) = first_busy else {
            next += tried;
            continue;
        };
        let at = next + busy;
        tell_of_own_hold(
            inner,
            keys[at],
            lock_ids[at],
            mode,
            "waits until that guard is released",
        );
        let waiting = wait_in_queue(
            inner,
            keys[at],
            lock_ids[at],
            mode,
            session,
            deadline,
            at > 0,
        );
        session = Box::pin(waiting)
            .await
            .map_err(|error| said_if_held_here(inner, keys[at], lock_ids[at], mode, error))?;
        next = at + 1;
    }
    Ok(session)
}

/// The tries of every lock of `lock_ids` in one round trip (see
/// [`Statement::TryLockEach`]); the index of the first busy one, if any. On an
/// error the session is closed, which frees whatever it held.
async fn try_each(
    inner: &Inner,
    keys: &[&str],
    lock_ids: &[i64],
    mode: LockMode,
    session: Session,
    deadline: Option<Deadline>,
) -> Result<(Session, Option<usize>), LockAcquisitionError> {
    if lock_ids.len() == 1 {
        return try_first(inner, keys[0], lock_ids[0], mode, session, deadline).await;
    }
    let statement = Statement::TryLockEach { lock_ids, mode };
    let limit = step_limit(inner, deadline);
    match answered(inner, keys[0], session, statement, limit, deadline).await? {
        (session, Ok(Answer::FirstBusy(first_busy))) => Ok((session, first_busy)),
        (session, Ok(answer)) => {
            session.close();
            let reason = format!("Database error: unexpected answer {answer:?}");
            Err(with_timeout(
                LockAcquisitionError::new(keys[0], AcquisitionErrorKind::Backend, reason),
                deadline,
            ))
        }
        (session, Err(error)) => {
            session.close();
            Err(with_timeout(driver_error(keys[0], error), deadline))
        }
    }
}

/// The try of the first of the locks left (`acquire_many` one key at a time: a
/// group of one, or the setting that measures the old way).
async fn try_first(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
    session: Session,
    deadline: Option<Deadline>,
) -> Result<(Session, Option<usize>), LockAcquisitionError> {
    Ok(
        match try_lock(inner, key, lock_id, mode, session, deadline).await? {
            Tried::Granted(session) => (session, None),
            Tried::Busy(session) => (session, Some(0)),
        },
    )
}
