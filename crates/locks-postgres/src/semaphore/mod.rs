//! Counting semaphores on advisory locks alone (ADR 0018): a turnstile per name that
//! waiters queue on in the server's FIFO queue, and N slot locks, all on `(class, slot)`
//! pairs of the two-`integer` key space, which never meets a lock id.
//!
//! One acquisition, on a connection of its own:
//! 1. one statement ([`sql::ENTER`]): take the marker of N shared, look for markers of
//!    another N (a `Configuration` error), try the turnstile and, holding it, take the
//!    first free slot and leave the turnstile;
//! 2. when the turnstile was busy, wait in its queue (bounded by the call's deadline, as a
//!    lock's wait) and scan the slots in the same statement once granted;
//! 3. when every slot is busy, wait on one slot (round robin) for a round, scan again
//!    after it, and double the round from [`FIRST_ROUND`] up to [`LONGEST_ROUND`].
//!
//! A permit freed on the slot being waited on is granted by the server at once; one
//! freed on another slot is found at the end of the round. See the ADR for the bound.

mod holders;
mod permit;
mod sql;

use std::sync::Arc;
use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, LockAcquisitionError, PermitDerivation, PermitInfo,
    SINCE_EPOCH_UNIX, Semaphore, check_permits, marker_slot, permits_disagree, permits_of_marker,
};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tracing::Instrument;

pub use holders::semaphore_holders;
pub use permit::PostgresPermit;

use crate::checkout::PoolWait;
use crate::connection::Session;
use crate::errors::{MOVED_BETWEEN_SESSIONS, driver_error, refused, with_timeout};
use crate::limit::{Deadline, Limit};
use crate::manager::{Inner, PostgresLockManager};
use crate::sql::Statement;
use crate::telemetry::{acquire_span, finish_acquire_span, started};

/// The first round a turnstile holder waits on one slot before it scans them all again.
pub(crate) const FIRST_ROUND: Duration = Duration::from_millis(1);
/// The longest round: an idle turnstile holder sends two statements a second (a wait
/// and a scan every [`LONGEST_ROUND`]); every other waiter sends none.
pub(crate) const LONGEST_ROUND: Duration = Duration::from_secs(1);

/// What a statement of one acquisition may end in.
enum Step<T> {
    Done(T),
    /// `lock_timeout` ended the wait (55P03).
    TimedOut,
}

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

    /// Runs `sql` (prepared once per connection) within `limit` and reads its first
    /// column: `None` on another server session (see [`row`](Self::row)).
    async fn run<T: for<'r> tokio_postgres::types::FromSql<'r>>(
        &self,
        session: &Session,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        limit: Limit,
    ) -> Result<Step<Option<T>>, LockAcquisitionError> {
        match self.row(session, sql, params, limit).await? {
            Some(row) => self.get(&row, 0).map(Step::Done),
            None => Ok(Step::TimedOut),
        }
    }

    /// Runs a statement that never waits; `None` on another server session.
    async fn quick_answer<T: for<'r> tokio_postgres::types::FromSql<'r>>(
        &self,
        session: &Session,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<T>, LockAcquisitionError> {
        match self.run(session, sql, params, self.quick()).await? {
            Step::Done(answer) => Ok(answer),
            Step::TimedOut => Err(self.no_answer()),
        }
    }

    /// Runs `sql` within `limit` and hands back its one row; `None` when `lock_timeout`
    /// ended a wait (55P03). A statement in flight when the future is dropped is
    /// cancelled on the server.
    async fn row(
        &self,
        session: &Session,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        limit: Limit,
    ) -> Result<Option<tokio_postgres::Row>, LockAcquisitionError> {
        let object = session.object();
        let cancel =
            permit::CancelOnDrop::new(self.inner.connections().canceller(), object.cancel_token());
        let answer = limit
            .run(async {
                let statement = object.prepare_cached(sql).await?;
                object.query_one(&statement, params).await
            })
            .await;
        cancel.disarm();
        match answer {
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
    /// other N in use are an error), then, if the turnstile is free, a slot. Answers
    /// whether the turnstile is still held (every slot busy) and the slot taken.
    async fn enter(
        &self,
        mut session: Session,
    ) -> Result<(Session, bool, Option<u32>), LockAcquisitionError> {
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
                let (set_up, answer) = self
                    .inner
                    .answered(self.name, session, Statement::Ping, limit, self.deadline)
                    .await?;
                answer.map_err(|error| self.error(error))?;
                session = set_up;
            }
            let fresh = session.is_fresh();
            let params: [&(dyn ToSql + Sync); 5] = [
                &session.marker(),
                &self.class,
                &marker,
                &permits,
                &since_now(),
            ];
            let Some(row) = self
                .row(&session, sql::ENTER, &params, self.quick())
                .await?
            else {
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
            let gate: Option<bool> = self.get(&row, 2)?;
            let slot: Option<i32> = self.get(&row, 3)?;
            let slot = slot.and_then(|slot| u32::try_from(slot).ok());
            return Ok((session, gate == Some(true) && slot.is_none(), slot));
        }
        session.close();
        Err(refused(self.name, MOVED_BETWEEN_SESSIONS, self.deadline))
    }

    /// Holding the turnstile: the first free slot, leaving the turnstile.
    async fn scan(&self, session: &Session) -> Result<Option<u32>, LockAcquisitionError> {
        let permits = i32::try_from(self.permits).unwrap_or(i32::MAX);
        let slot: Option<i32> = self
            .quick_answer(
                session,
                sql::SCAN,
                &[&session.marker(), &self.class, &permits, &since_now()],
            )
            .await?;
        Ok(slot.and_then(|slot| u32::try_from(slot).ok()))
    }

    /// Holding the turnstile after a scan found every slot busy: waits on one slot for a
    /// round, scans, and again, until granted or the deadline.
    async fn wait_for_slot(&self, session: &Session) -> Result<Option<u32>, LockAcquisitionError> {
        let mut round = FIRST_ROUND;
        let mut next = 0_u32;
        loop {
            let lock_timeout_ms = match self.deadline {
                None => round_ms(round),
                Some(deadline) => match deadline.lock_timeout_ms() {
                    None => return Ok(None),
                    Some(left) => left.min(round_ms(round)),
                },
            };
            let slot = next % self.permits;
            let slot_arg = i32::try_from(slot).unwrap_or(0);
            let timeout_text = lock_timeout_ms.to_string();
            let params: [&(dyn ToSql + Sync); 5] = [
                &session.marker(),
                &self.class,
                &slot_arg,
                &since_now(),
                &timeout_text,
            ];
            match self
                .run::<bool>(
                    session,
                    sql::WAIT_SLOT,
                    &params,
                    self.waiting(lock_timeout_ms),
                )
                .await?
            {
                Step::Done(Some(_)) => return Ok(Some(slot)),
                Step::Done(None) => {
                    return Err(with_timeout(
                        LockAcquisitionError::new(
                            self.name,
                            AcquisitionErrorKind::Configuration,
                            MOVED_BETWEEN_SESSIONS,
                        ),
                        self.deadline,
                    ));
                }
                Step::TimedOut => {
                    next = next.wrapping_add(1);
                    round = round.saturating_mul(2).min(LONGEST_ROUND);
                }
            }
            if let Some(slot) = self.scan(session).await? {
                return Ok(Some(slot));
            }
        }
    }

    /// Waits in the turnstile's queue until the deadline, then scans in the same
    /// statement ([`sql::WAIT_GATE_THEN_SCAN`]). `None`: the deadline passed (nothing
    /// taken); `Some((true, slot))`: the turnstile is still held (every slot busy).
    async fn wait_gate(
        &self,
        session: &Session,
    ) -> Result<Option<(bool, Option<u32>)>, LockAcquisitionError> {
        let lock_timeout_ms = match self.deadline {
            None => 0,
            Some(deadline) => match deadline.lock_timeout_ms() {
                None => return Ok(None),
                Some(ms) => ms,
            },
        };
        let permits = i32::try_from(self.permits).unwrap_or(i32::MAX);
        let timeout_text = lock_timeout_ms.to_string();
        let params: [&(dyn ToSql + Sync); 5] = [
            &session.marker(),
            &self.class,
            &timeout_text,
            &permits,
            &since_now(),
        ];
        let Some(row) = self
            .row(
                session,
                sql::WAIT_GATE_THEN_SCAN,
                &params,
                self.waiting(lock_timeout_ms),
            )
            .await?
        else {
            return Ok(None);
        };
        let gated: Option<bool> = self.get(&row, 0)?;
        if gated.is_none() {
            return Err(refused(self.name, MOVED_BETWEEN_SESSIONS, self.deadline));
        }
        let slot: Option<i32> = self.get(&row, 1)?;
        let slot = slot.and_then(|slot| u32::try_from(slot).ok());
        Ok(Some((slot.is_none(), slot)))
    }

    /// The whole acquisition: `Ok(None)` when no permit could be had in time (or at
    /// once, for a try).
    async fn acquire(&self, wait: bool) -> Result<Option<(Session, u32)>, LockAcquisitionError> {
        let pool_wait = match (wait, self.deadline) {
            (false, _) => PoolWait::No,
            (true, None) => PoolWait::Forever,
            (true, Some(deadline)) => PoolWait::Until(deadline),
        };
        let session = self
            .inner
            .checkout(self.name, pool_wait, self.deadline)
            .await?;
        let (session, mut gated, mut granted) = self.enter(session).await?;
        if granted.is_none() && !gated && wait {
            match self.wait_gate(&session).await? {
                Some((still_gated, slot)) => (gated, granted) = (still_gated, slot),
                None => gated = false,
            }
        }
        if granted.is_none() && gated && wait {
            granted = self.wait_for_slot(&session).await?;
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

fn round_ms(round: Duration) -> u32 {
    u32::try_from(round.as_millis()).unwrap_or(u32::MAX).max(1)
}

/// Frees whatever the session holds and gives it back to the pool; closes it when that
/// cannot be confirmed.
async fn leave(session: Session, call: &Call<'_>) {
    match call
        .quick_answer::<bool>(&session, sql::LEAVE, &[&session.marker()])
        .await
    {
        Ok(Some(true)) => session.into_pool(),
        _ => session.close(),
    }
}

impl PostgresLockManager {
    /// The class of the semaphore `name` (for `pg_locks`: its permits are `(class, slot)`
    /// advisory locks with `objsubid = 2`).
    #[must_use]
    pub fn semaphore_class(&self, name: &str) -> i32 {
        PermitDerivation::CURRENT.class(name)
    }

    async fn permit(
        &self,
        name: &str,
        permits: u32,
        deadline: Option<Deadline>,
        wait: bool,
    ) -> Result<Option<PostgresPermit>, LockAcquisitionError> {
        let inner = &self.inner;
        let class = PermitDerivation::CURRENT.class(name);
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
        let granted = match self
            .granted_permit(name, permits, deadline, wait)
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
        &self,
        name: &str,
        permits: u32,
        deadline: Option<Deadline>,
        wait: bool,
    ) -> Result<Option<PostgresPermit>, LockAcquisitionError> {
        let permits = check_permits(name, permits)?;
        let inner = &self.inner;
        let call = Call {
            inner,
            name,
            class: PermitDerivation::CURRENT.class(name),
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
            let token = inner
                .next_fencing_token(name, token_id, &mut session)
                .await?;
            info = info.with_fencing_token(token);
        }
        Ok(Some(PostgresPermit::new(
            Arc::clone(inner),
            session,
            info,
            call.class,
        )))
    }
}

impl Semaphore for PostgresLockManager {
    type Permit = PostgresPermit;

    /// Takes one of `permits` permits of `name` (see the module documentation and ADR
    /// 0018), waiting as `options` say: the same deadline rules as a lock's wait.
    ///
    /// Each waiter and each permit keeps a pool connection of its own: size the pool for
    /// them as for locks. Multiplexing does not apply to permits.
    ///
    /// # Errors
    /// As [`acquire`](locks_port::DistributedLock::acquire), plus `Configuration` for a
    /// bad `permits` or one that differs from the one other processes use.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call cancels its wait on the server and closes its
    /// connection, which frees the turnstile, marker or slot it held.
    async fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        options: impl Into<AcquireOptions> + Send,
    ) -> Result<PostgresPermit, LockAcquisitionError> {
        let options = options.into();
        let deadline = options.timeout().map(Deadline::after);
        // A wait that ends without a permit is a timeout error already (from `permit`).
        self.permit(name, permits, deadline, true)
            .await
            .and_then(|granted| {
                granted.ok_or_else(|| {
                    LockAcquisitionError::timed_out(name, options.timeout().unwrap_or_default())
                })
            })
            .map_err(LockAcquisitionError::for_permit)
    }

    /// Takes a permit if one is free and nobody waits (or scans) for one.
    ///
    /// # Cancel safety
    /// As [`acquire_permit`](Self::acquire_permit).
    async fn try_acquire_permit(
        &self,
        name: &str,
        permits: u32,
    ) -> Result<Option<PostgresPermit>, LockAcquisitionError> {
        self.permit(name, permits, None, false)
            .await
            .map_err(LockAcquisitionError::for_permit)
    }

    async fn permit_holders(
        &self,
        name: &str,
    ) -> Result<locks_port::PermitHolders, LockAcquisitionError> {
        holders::permit_holders(self, name).await
    }
}
