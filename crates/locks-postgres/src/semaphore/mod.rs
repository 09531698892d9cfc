//! Counting semaphores on advisory locks alone (ADR 0018): a turnstile per name that
//! waiters queue on in the server's FIFO queue, and N slot locks, all on `(class, slot)`
//! pairs of the two-`integer` key space, which never meets a lock id.
//!
//! One acquisition, on a connection of its own:
//! 1. one statement ([`sql::ENTER`]): take the marker of N shared, look for markers of
//!    another N (a `Configuration` error), try the turnstile and, holding it, take the
//!    first free slot; leave the turnstile either way;
//! 2. when no permit was had, one more statement ([`sql::wait`]) that runs on the server
//!    until a permit or the deadline: wait in the turnstile's queue; holding it, look at
//!    every slot each [`sql::POLL_MS`] to [`sql::SLOWEST_POLL_MS`] ms, take the first free
//!    one and leave the turnstile in the same step.
//!
//! So the longest waiter gets a permit freed on any slot within one pause and the
//! server's answer, and a waiter whose process is stopped or cut off never holds the
//! turnstile while nothing runs its wait: the server grants it the permit (which its
//! connection then holds, as a lock granted to a stopped process), and the next waiter
//! goes on. See ADR 0022 for the bounds and their cost.

mod encoding;
mod holders;
mod permit;
mod sql;

use std::sync::Arc;
use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, LockAcquisitionError, PermitDerivation, PermitInfo,
    check_permits, permits_disagree,
};
use tokio::time::Instant;
use tokio_postgres::SimpleQueryMessage;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tracing::Instrument;

use encoding::{SINCE_EPOCH_UNIX, marker_slot, permits_of_marker};
pub use holders::semaphore_holders;
pub(crate) use holders::{permit_held, permit_holders};
pub use permit::PostgresPermit;

use crate::acquire;
use crate::checkout;
use crate::checkout::PoolWait;
use crate::connection::Session;
use crate::errors::{MOVED_BETWEEN_SESSIONS, driver_error, refused, with_timeout};
use crate::fencing;
use crate::inner::Inner;
use crate::limit::{Deadline, Limit};
use crate::query::Query;
use crate::sql::Statement;
use crate::telemetry::{acquire_span, finish_acquire_span, started};

/// One acquisition's facts.
struct Call<'a> {
    inner: &'a Inner,
    name: &'a str,
    class: i32,
    permits: u32,
    deadline: Option<Deadline>,
}

impl Call<'_> {
    fn error(&self, error: tokio_postgres::Error) -> LockAcquisitionError {
        with_timeout(driver_error(self.name, error), self.deadline)
    }

    fn no_answer(&self) -> LockAcquisitionError {
        let error = LockAcquisitionError::new(
            self.name,
            AcquisitionErrorKind::ConnectionLost,
            "the server did not answer in time",
        );
        with_timeout(error, self.deadline)
    }

    /// The limit of a statement that does not wait for a lock.
    fn quick(&self) -> Limit {
        Limit::Waiting(self.inner.settings().answer_timeout)
    }

    /// The limit of a wait bounded by `lock_timeout` ms (0: none).
    fn waiting(&self, lock_timeout_ms: u32) -> Limit {
        match lock_timeout_ms {
            0 => Limit::None,
            ms => Limit::Waiting(
                Duration::from_millis(u64::from(ms))
                    .saturating_add(self.inner.settings().deadline_margin),
            ),
        }
    }

    /// Runs `query` (which never waits) on the session's one path, within the answer
    /// timeout, and hands back its one row; `None` when `lock_timeout` ended it (55P03).
    /// A statement in flight when the future is dropped or the limit passes is cancelled
    /// on the server when the session is dropped.
    async fn row(
        &self,
        session: &mut Session,
        query: &'static Query,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, LockAcquisitionError> {
        match session.query_within(query, params, self.quick()).await {
            Err(_expired) => Err(self.no_answer()),
            Ok(Ok(row)) => Ok(Some(row)),
            Ok(Err(error)) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
            Ok(Err(error)) => Err(self.error(error)),
        }
    }

    fn get<T: for<'r> tokio_postgres::types::FromSql<'r>>(
        &self,
        row: &tokio_postgres::Row,
        index: usize,
    ) -> Result<T, LockAcquisitionError> {
        row.try_get(index).map_err(|error| self.error(error))
    }

    /// The first statement on a set-up session ([`sql::ENTER`]): the marker of N (the
    /// other N in use are an error), then, if the turnstile is free, a slot. Answers the
    /// slot taken; the turnstile is never left held.
    async fn enter(
        &self,
        mut session: Session,
    ) -> Result<(Session, Option<u32>), LockAcquisitionError> {
        let marker = marker_slot(self.permits);
        let permits = i32::try_from(self.permits).unwrap_or(i32::MAX);
        for attempt in 0..2 {
            if !session.is_set_up() || attempt > 0 {
                // The set-up, pipelined with a ping (see `Inner::answered`).
                let limit = Deadline::limit(
                    self.deadline,
                    self.inner.settings().deadline_margin,
                    self.inner.settings().answer_timeout,
                );
                let (set_up, answer) = acquire::answered(
                    self.inner,
                    self.name,
                    session,
                    Statement::Ping,
                    limit,
                    self.deadline,
                )
                .await?;
                answer.map_err(|error| self.error(error))?;
                session = set_up;
            }
            let fresh = session.is_fresh();
            let params: [&(dyn ToSql + Sync); 4] = [&self.class, &marker, &permits, &since_now()];
            let Some(row) = self.row(&mut session, &sql::ENTER, &params).await? else {
                return Err(self.no_answer());
            };
            let marked: Option<bool> = self.get(&row, 0)?;
            if marked.is_none() {
                if fresh && attempt == 0 {
                    session.mark_set_up(false);
                    continue;
                }
                session.close();
                return Err(refused(self.name, MOVED_BETWEEN_SESSIONS, self.deadline));
            }
            let others: Option<Vec<i64>> = self.get(&row, 1)?;
            let mut others: Vec<u32> = others
                .unwrap_or_default()
                .into_iter()
                .filter_map(|objid| i32::try_from(objid - (1_i64 << 32)).ok())
                .filter_map(permits_of_marker)
                .collect();
            if !others.is_empty() {
                others.sort_unstable();
                let error = permits_disagree(self.name, self.permits, &others);
                leave(session, self).await;
                return Err(with_timeout(error, self.deadline));
            }
            let slot: Option<i32> = self.get(&row, 3)?;
            return Ok((session, slot.and_then(|slot| u32::try_from(slot).ok())));
        }
        session.close();
        Err(refused(self.name, MOVED_BETWEEN_SESSIONS, self.deadline))
    }

    /// Waits for a permit in one server-side statement ([`sql::wait`]): in the
    /// turnstile's queue, then, holding it, looking at every slot until one is free or
    /// the deadline passes. `None`: the deadline passed (nothing taken but the marker).
    async fn wait_for_permit(
        &self,
        session: &mut Session,
    ) -> Result<Option<u32>, LockAcquisitionError> {
        let lock_timeout_ms = match self.deadline {
            None => 0,
            Some(deadline) => match deadline.lock_timeout_ms() {
                None => return Ok(None),
                Some(ms) => ms,
            },
        };
        let Some(sql) = sql::wait(session.marker(), self.class, self.permits, lock_timeout_ms)
        else {
            return Err(refused(self.name, MOVED_BETWEEN_SESSIONS, self.deadline));
        };
        // Dropped or expired mid-wait, the session cancels the wait and closes.
        let answer = session
            .simple_query_within(&sql, self.waiting(lock_timeout_ms))
            .await;
        let messages = match answer {
            Err(_expired) => return Err(self.no_answer()),
            Ok(Err(error)) => return Err(self.error(error)),
            Ok(Ok(messages)) => messages,
        };
        let answer = messages.iter().find_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
            _ => None,
        });
        let Some(Some(answer)) = answer else {
            return Err(refused(self.name, MOVED_BETWEEN_SESSIONS, self.deadline));
        };
        let mut words = answer.split(' ');
        let slot = words.next().and_then(|slot| slot.parse::<u32>().ok());
        if slot.is_some()
            && let Some(idle) = words.next().and_then(|idle| idle.parse::<f64>().ok())
        {
            self.inner
                .metrics()
                .permit_idle_while_waiting(self.class, idle);
        }
        Ok(slot)
    }

    /// The whole acquisition: `Ok(None)` when no permit could be had in time (or at
    /// once, for a try).
    async fn acquire(&self, wait: bool) -> Result<Option<(Session, u32)>, LockAcquisitionError> {
        let pool_wait = match (wait, self.deadline) {
            (false, _) => PoolWait::No,
            (true, None) => PoolWait::Forever,
            (true, Some(deadline)) => PoolWait::Until(deadline),
        };
        let session = checkout::checkout(self.inner, self.name, pool_wait, self.deadline).await?;
        let (mut session, mut granted) = self.enter(session).await?;
        if granted.is_none() && wait {
            granted = self.wait_for_permit(&mut session).await?;
            // The server's wait is capped at about 24.8 days (`lock_timeout_ms`): past
            // it, time is left before a longer deadline, and the wait goes on, as a
            // lock's does (`acquire::wait_in_queue`). After an uncapped wait none is left.
            while granted.is_none()
                && (self.deadline).is_some_and(|deadline| deadline.lock_timeout_ms().is_some())
            {
                granted = self.wait_for_permit(&mut session).await?;
            }
        }
        match granted {
            Some(slot) => Ok(Some((session, slot))),
            None => {
                leave(session, self).await;
                Ok(None)
            }
        }
    }
}

/// Seconds since 2020-01-01 UTC, for the "since" lock of a grant.
fn since_now() -> i32 {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    i32::try_from(now - SINCE_EPOCH_UNIX).unwrap_or(i32::MAX)
}

/// Frees whatever the session holds and gives it back to the pool; closes it when that
/// cannot be confirmed.
async fn leave(mut session: Session, call: &Call<'_>) {
    if left(&mut session, call.quick()).await {
        session.into_pool();
    } else {
        session.close();
    }
}

/// Frees whatever the session holds ([`sql::LEAVE`]) within `limit`: whether the server
/// confirmed it (an acquisition that gives up, and a permit's release, both end so).
async fn left(session: &mut Session, limit: Limit) -> bool {
    let answer = session.query_within(&sql::LEAVE, &[], limit).await;
    matches!(answer, Ok(Ok(row)) if matches!(row.try_get(0), Ok(Some(true))))
}

/// The class of the semaphore `name` ([`PostgresLockManager::semaphore_class`]).
pub(crate) fn class_of(name: &str) -> i32 {
    PermitDerivation::CURRENT.class(name)
}

async fn permit(
    inner: &Arc<Inner>,
    name: &str,
    permits: u32,
    deadline: Option<Deadline>,
    wait: bool,
) -> Result<Option<PostgresPermit>, LockAcquisitionError> {
    let class = class_of(name);
    // The lock's acquire span (`lock.id` is the semaphore's class), and its events.
    let span = acquire_span(
        inner.settings().span_level,
        inner.shown(name),
        i64::from(class),
        if wait {
            "pg_advisory_lock(int, int)"
        } else {
            "pg_try_advisory_lock(int, int)"
        },
        deadline.map(|deadline| deadline.timeout),
    );
    let started = started(&span);
    let metered = inner.metrics().started();
    let called = Instant::now();
    let granted = match granted_permit(inner, name, class, permits, deadline, wait)
        .instrument(span.clone())
        .await
    {
        Ok(None) if wait => Err(LockAcquisitionError::timed_out(
            name,
            deadline.map_or_else(|| called.elapsed(), |deadline| deadline.timeout),
        )),
        granted => granted,
    };
    finish_acquire_span(&span, started, granted.as_ref().map(Option::is_some));
    inner
        .metrics()
        .permit_acquisition(class, metered, granted.as_ref().map(Option::is_some));
    granted
}

async fn granted_permit(
    inner: &Arc<Inner>,
    name: &str,
    class: i32,
    permits: u32,
    deadline: Option<Deadline>,
    wait: bool,
) -> Result<Option<PostgresPermit>, LockAcquisitionError> {
    let permits = check_permits(name, permits)?;
    let call = Call {
        inner,
        name,
        class,
        permits,
        deadline,
    };
    let Some((mut session, slot)) = call.acquire(wait).await? else {
        return Ok(None);
    };
    let mut info = PermitInfo::acquired_now(name, permits, slot, inner.holder_id().cloned());
    if inner.settings().fencing {
        // Tokens of a semaphore are kept under a negative id, apart from every lock id.
        let token_id = -1 - i64::from(call.class);
        let token = fencing::next_fencing_token(inner, name, token_id, &mut session).await?;
        info = info.with_fencing_token(token);
    }
    Ok(Some(PostgresPermit::new(
        Arc::clone(inner),
        session,
        info,
        call.class,
    )))
}

/// [`Semaphore::acquire_permit`](locks_port::Semaphore::acquire_permit) of a manager.
pub(crate) async fn acquire_permit(
    inner: &Arc<Inner>,
    name: &str,
    permits: u32,
    options: impl Into<AcquireOptions> + Send,
) -> Result<PostgresPermit, LockAcquisitionError> {
    let options = options.into();
    let deadline = options.timeout().map(Deadline::after);
    // A wait that ends without a permit is a timeout error already (from `permit`).
    permit(inner, name, permits, deadline, true)
        .await
        .and_then(|granted| {
            granted.ok_or_else(|| {
                LockAcquisitionError::timed_out(name, options.timeout().unwrap_or_default())
            })
        })
        .map_err(LockAcquisitionError::for_permit)
}

/// [`Semaphore::try_acquire_permit`](locks_port::Semaphore::try_acquire_permit) of a manager.
pub(crate) async fn try_acquire_permit(
    inner: &Arc<Inner>,
    name: &str,
    permits: u32,
) -> Result<Option<PostgresPermit>, LockAcquisitionError> {
    permit(inner, name, permits, None, false)
        .await
        .map_err(LockAcquisitionError::for_permit)
}
