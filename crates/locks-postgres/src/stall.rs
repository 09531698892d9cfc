//! Patience with a stalled session: the keepalive's ping, and, when it gets no answer
//! within the answer timeout `A` and the manager has
//! [`stall_patience`](crate::PostgresLockManagerBuilder::stall_patience) `P`, the
//! looks, over another connection of the pool, at whether the server still has the
//! session's backend.
//!
//! Why a backend the server shows alive still holds the session's locks: a
//! session-level advisory lock ends only with its session or by a statement on that
//! session, and the only statement in flight there is the ping. So while
//! `pg_stat_activity` has a row with the session's pid and `backend_start` (recorded by
//! the set-up, `SESSION_SETUP`), nobody else can be granted its locks, and the monitor
//! waits on for the ping's answer, looking again every keepalive cadence. It never
//! reads `pg_locks`: observation must not take the lock manager's partition locks.
//!
//! Why the lease stays honest: whatever the looks say, the holder is told by `A + P`
//! after the ping was sent, so within `K + A + P + 2h` of its last answer; the lease
//! derives the server's timers from that bound (`lease.rs`), so the server frees the
//! lock of a vanished host the margin `M` after the holder was told, as without
//! patience. A host cut off from the server cannot look (the look fails), and is told
//! at once then.

use std::time::{Duration, SystemTime};

use locks_port::LostReason;
use tokio::time::Instant;

use crate::connection::{Backend, Session};
use crate::errors::describe;
use crate::inner::Inner;
use crate::limit::{Expired, Limit, after};
use crate::pool;
use crate::query::Query;
use crate::sql::{Answer, Statement};

/// Whether the server has the backend `$1` started at `$2`. Not `pg_locks`: looking
/// must not take the lock manager's partition locks.
static BACKEND_ALIVE: Query = Query::new(
    "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2)",
);

/// A keepalive given up on: why, in the loss's reason and detail.
#[derive(Debug)]
pub(crate) struct Silence {
    pub(crate) reason: LostReason,
    pub(crate) detail: String,
}

impl Silence {
    fn failed(detail: String) -> Self {
        Self {
            reason: LostReason::KeepaliveFailed,
            detail,
        }
    }
}

/// The ping's answer (or the error it met), or the silence it was given up on.
pub(crate) type Pinged = Result<Result<Answer, tokio_postgres::Error>, Silence>;

/// One keepalive ping on `session`: its answer within the answer timeout, or, with
/// stall patience, within the patience more while the server shows the session's
/// backend alive (see the module doc).
pub(crate) async fn ping(inner: &Inner, session: &mut Session) -> Pinged {
    let answer_timeout = inner.settings().answer_timeout;
    let (Some(patience), Some(backend)) = (inner.settings().stall_patience, session.backend())
    else {
        return Statement::Ping
            .run(session, Limit::Waiting(answer_timeout))
            .await
            .map_err(|Expired| {
                Silence::failed(format!(
                    "no answer to a keepalive within {answer_timeout:?}"
                ))
            });
    };
    let sent = Instant::now();
    let silent_for = answer_timeout.saturating_add(patience);
    let mut ping = std::pin::pin!(Statement::Ping.run(session, Limit::Since(sent, silent_for)));
    let given_up = |Expired| {
        Silence::failed(format!(
            "no answer to a keepalive within {answer_timeout:?} + stall patience \
             {patience:?}, though the server showed its backend (pid {}) alive",
            backend.pid
        ))
    };
    // Answered within the answer timeout: as without patience.
    if let Ok(answered) = tokio::time::timeout(answer_timeout, &mut ping).await {
        return answered.map_err(given_up);
    }
    tokio::select! {
        biased;
        answered = &mut ping => answered.map_err(given_up),
        silence = until_gone(inner, backend, after(sent, silent_for)) => Err(silence),
    }
}

/// Looks at `backend` every keepalive cadence until a look does not find it alive
/// (or fails), and says why; past `end` it waits for nothing more (the ping's own
/// limit ends it then).
async fn until_gone(inner: &Inner, backend: Backend, end: Instant) -> Silence {
    let answer_timeout = inner.settings().answer_timeout;
    let cadence = inner.settings().keepalive.unwrap_or(answer_timeout);
    loop {
        let looked = Instant::now();
        let bound = answer_timeout.min(end.saturating_duration_since(looked));
        if let Err(silence) = look_at(inner, backend, bound).await {
            return silence;
        }
        let next = after(looked, cadence).min(end);
        tokio::time::sleep_until(next).await;
        if next >= end {
            return std::future::pending().await;
        }
    }
}

/// One look, within `bound` (checkout and statement together), at whether the
/// server still has `backend`.
async fn look_at(inner: &Inner, backend: Backend, bound: Duration) -> Result<(), Silence> {
    let started = Instant::now();
    let object = match pool::for_one_read(inner.pool(), bound).await {
        Ok(object) => object,
        Err(error) if pool::is_busy(&error) => {
            return Err(Silence::failed(format!(
                "no answer to a keepalive within {:?}, and no pool connection was free \
                 within {bound:?} to look at its backend (pid {})",
                inner.settings().answer_timeout,
                backend.pid
            )));
        }
        Err(pool::PoolError::Backend(error)) => {
            return Err(look_failed(inner, backend, &describe(&error)));
        }
        Err(error) => return Err(look_failed(inner, backend, &error.to_string())),
    };
    let mut session = Session::new(object, inner.connections());
    let started_at: SystemTime = backend.started;
    let limit = Limit::Since(started, bound);
    match session
        .query_within(&BACKEND_ALIVE, &[&backend.pid, &started_at], limit)
        .await
    {
        Ok(Ok(row)) => match row.try_get::<_, bool>(0) {
            Ok(alive) => {
                session.into_pool();
                if alive {
                    Ok(())
                } else {
                    Err(Silence {
                        reason: LostReason::ConnectionClosed,
                        detail: format!(
                            "no answer to a keepalive within {:?}, and the server has \
                             its backend (pid {}) no more",
                            inner.settings().answer_timeout,
                            backend.pid
                        ),
                    })
                }
            }
            Err(error) => Err(look_failed(inner, backend, &describe(&error))),
        },
        Ok(Err(error)) => Err(look_failed(inner, backend, &describe(&error))),
        Err(Expired) => Err(look_failed(
            inner,
            backend,
            &format!("no answer within {bound:?}"),
        )),
    }
}

/// A look at `backend` that failed (`why`): the lock is given up.
fn look_failed(inner: &Inner, backend: Backend, why: &str) -> Silence {
    Silence::failed(format!(
        "no answer to a keepalive within {:?}, and the look at its backend (pid {}) \
         failed: {why}",
        inner.settings().answer_timeout,
        backend.pid
    ))
}
