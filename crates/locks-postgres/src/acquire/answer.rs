//! One lock statement's answer on a session of its own ([`answered`]): the set-up
//! pipelined before it when the connection is new (or was reset), what a set-up
//! session's answer means, and the `pg_try_advisory_lock` read from it
//! ([`try_lock`]). The macro `answered!` is the same, written out in place for the
//! acquisition's first try (see `session_until!` in `acquire.rs`).

use locks_port::{LockAcquisitionError, LockMode};

use super::{Tried, step_limit};
use crate::connection::{Session, SetUp};
use crate::errors::{
    MOVED_BETWEEN_SESSIONS, STANDBY, driver_error, no_answer, no_row, refused, with_timeout,
};
use crate::inner::Inner;
use crate::limit::{Deadline, Limit};
use crate::sql::{Answer, Statement};

/// [`answered`] written out where it is used (an expression with `.await`s, for an
/// `async` body): the uncontended acquisition's try, without a layer of future of
/// its own. As `cached_or_prepared!` in `connection.rs`.
macro_rules! answered {
    ($inner:expr, $key:expr, $session:expr, $statement:expr, $limit:expr, $deadline:expr) => {{
        let (inner, key, statement, limit, deadline) =
            ($inner, $key, $statement, $limit, $deadline);
        let mut session: Session = $session;
        let read = if session.is_set_up() {
            let fresh = session.is_fresh();
            // Pinned where made (the statement's future is large), and gone after.
            let answer = {
                let running = std::pin::pin!(statement.run(&mut session, limit));
                running.await.ok()
            };
            read_answer(inner, key, session, fresh, answer, deadline)
        } else {
            Ok(Read::SetUpFirst(session))
        };
        match read {
            Ok(Read::Answered(session, answer)) => Ok((session, answer)),
            // Once per connection: boxed, out of the common path's future.
            Ok(Read::SetUpFirst(session)) => {
                Box::pin(answered_after_setup(
                    inner, key, session, statement, limit, deadline,
                ))
                .await
            }
            Err(error) => Err(error),
        }
    }};
}

/// Runs `statement` within `limit`. A connection not set up yet is set up first,
/// pipelined with the statement (see [`crate::sql::SESSION_SETUP`]). A statement
/// that reached a server session not marked as the connection's own did nothing:
/// it is run once more behind a fresh set-up (a pool's recycling may have reset the
/// session's settings), and if it misses again, or the set-up finds the session
/// marked by another connection, the statements are being moved between server
/// sessions (a transaction-pooling proxy) and the call fails with
/// [`Configuration`](locks_port::AcquisitionErrorKind::Configuration). On expiry
/// the session is dropped: the statement cancelled, the connection closed, which
/// undoes whatever it did; so it is when the statement answered no row. The answer
/// is never [`Answer::WrongSession`] nor [`Answer::NoRow`].
pub(crate) async fn answered(
    inner: &Inner,
    key: &str,
    session: Session,
    statement: Statement<'_>,
    limit: Limit,
    deadline: Option<Deadline>,
) -> Result<(Session, Result<Answer, tokio_postgres::Error>), LockAcquisitionError> {
    answered!(inner, key, session, statement, limit, deadline)
}

/// What a set-up session's answer to a statement means.
pub(super) enum Read {
    /// The session and the statement's answer (never [`Answer::WrongSession`] nor
    /// [`Answer::NoRow`]).
    Answered(Session, Result<Answer, tokio_postgres::Error>),
    /// The session is not set up (or the pool's recycling reset it): the statement
    /// runs again behind a fresh set-up.
    SetUpFirst(Session),
}

/// Reads a set-up session's `answer` (`None`: none within the limit), `fresh` if no
/// statement had run on it since its checkout. On failure the session is closed.
pub(super) fn read_answer(
    inner: &Inner,
    key: &str,
    mut session: Session,
    fresh: bool,
    answer: Option<Result<Answer, tokio_postgres::Error>>,
    deadline: Option<Deadline>,
) -> Result<Read, LockAcquisitionError> {
    match answer {
        None => {
            drop(session);
            let answer_timeout = inner.settings().answer_timeout;
            Err(no_answer(key, deadline, answer_timeout))
        }
        // It did nothing. Straight after checkout the pool's recycling may
        // have reset the session: once more, behind a fresh set-up.
        Some(Ok(Answer::WrongSession)) if fresh => {
            session.mark_set_up(false);
            Ok(Read::SetUpFirst(session))
        }
        Some(Ok(Answer::WrongSession)) => {
            drop(session);
            Err(refused(key, MOVED_BETWEEN_SESSIONS, deadline))
        }
        Some(Ok(Answer::NoRow)) => {
            drop(session);
            Err(no_row(key, deadline))
        }
        Some(answer) => Ok(Read::Answered(session, answer)),
    }
}

/// [`answered`] on a session to set up first: the set-up pipelined with the
/// statement.
pub(super) async fn answered_after_setup(
    inner: &Inner,
    key: &str,
    mut session: Session,
    statement: Statement<'_>,
    limit: Limit,
    deadline: Option<Deadline>,
) -> Result<(Session, Result<Answer, tokio_postgres::Error>), LockAcquisitionError> {
    let setup = statement.run_after_setup(&mut session, inner.setup_values(), limit);
    let Some((setup, answer)) = setup.await.ok() else {
        drop(session);
        let answer_timeout = inner.settings().answer_timeout;
        return Err(no_answer(key, deadline, answer_timeout));
    };
    let refusal = match setup {
        Ok(SetUp::Done) if !matches!(answer, Ok(Answer::WrongSession)) => {
            session.mark_set_up(true);
            return Ok((session, answer));
        }
        Ok(SetUp::Standby) => refused(key, STANDBY, deadline),
        Ok(SetUp::Done | SetUp::Foreign) => refused(key, MOVED_BETWEEN_SESSIONS, deadline),
        Err(error) => with_timeout(driver_error(key, error), deadline),
    };
    drop(session);
    Err(refusal)
}

/// One `pg_try_advisory_lock`. On an error the session is closed (whatever the
/// statement did, that undoes it).
pub(crate) async fn try_lock(
    inner: &Inner,
    key: &str,
    lock_id: i64,
    mode: LockMode,
    session: Session,
    deadline: Option<Deadline>,
) -> Result<Tried, LockAcquisitionError> {
    let statement = Statement::TryLock { lock_id, mode };
    let limit = step_limit(inner, deadline);
    let answer = answered(inner, key, session, statement, limit, deadline).await?;
    tried(key, deadline, answer)
}

/// What a `pg_try_advisory_lock` answered (see [`answered`]). On an error the
/// session is closed (whatever the statement did, that undoes it).
pub(super) fn tried(
    key: &str,
    deadline: Option<Deadline>,
    answer: (Session, Result<Answer, tokio_postgres::Error>),
) -> Result<Tried, LockAcquisitionError> {
    match answer {
        (session, Ok(Answer::Bool(true))) => Ok(Tried::Granted(session)),
        (session, Ok(_)) => Ok(Tried::Busy(session)),
        (session, Err(error)) => {
            session.close();
            Err(with_timeout(driver_error(key, error), deadline))
        }
    }
}
