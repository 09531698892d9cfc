//! Acquisition up to the bookkeeping: a pool checkout, one `pg_try_advisory_lock`, and
//! if the lock is busy a wait in the server's queue (or the original's polling), every
//! step inside the call's deadline.

use std::time::Duration;

use deadpool_postgres::{Object, PoolError, TimeoutType, Timeouts};
use locks_port::{
    AcquireOptions, AcquisitionErrorKind, LockAcquisitionError, LockMode, WaitStrategy,
    timeout_reason,
};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;

use crate::classify::{driver_error, pool_error};
use crate::connection::{Answer, Session, SetUp, SetupValues};
use crate::limit::{Expired, Limit};
use crate::manager::Inner;
use crate::sql::Statement;

/// The deadline of a bounded call: when the call started and its timeout (kept apart:
/// the uncontended path never needs the sum, only the contended one does).
#[derive(Clone, Copy)]
pub(crate) struct Deadline {
    started: Instant,
    pub(crate) timeout: Duration,
}

impl Deadline {
    /// `timeout` from now.
    pub(crate) fn after(timeout: Duration) -> Self {
        Self {
            started: Instant::now(),
            timeout,
        }
    }

    /// The deadline, saturating (a `Duration::MAX` timeout is centuries away).
    pub(crate) fn at(self) -> Instant {
        crate::limit::after(self.started, self.timeout)
    }

    pub(crate) fn remaining(self) -> Duration {
        self.at().saturating_duration_since(Instant::now())
    }

    /// The `lock_timeout` of a wait that must end by this deadline, in whole ms
    /// rounded up, capped at `i32::MAX` ms (about 24.8 days: the server's limit);
    /// `None` when no time is left.
    pub(crate) fn lock_timeout_ms(self) -> Option<u32> {
        let ms = self.remaining().as_micros().div_ceil(1000);
        if ms == 0 {
            return None;
        }
        Some(u32::try_from(ms).map_or(i32::MAX.unsigned_abs(), |ms| {
            ms.min(i32::MAX.unsigned_abs())
        }))
    }

    /// The wait's `Lock` statement and the limit of its answer: the deadline plus the
    /// margin, or none for an unbounded wait (it waits as long as it takes; a
    /// connection that ends meanwhile fails the statement). `None` when no time is
    /// left.
    pub(crate) fn wait_statement(
        deadline: Option<Self>,
        lock_id: i64,
        mode: LockMode,
        margin: Duration,
    ) -> Option<(Statement, Limit)> {
        let (lock_timeout_ms, limit) = match deadline {
            None => (0, Limit::None),
            Some(bounded) => (
                bounded.lock_timeout_ms()?,
                Deadline::limit(deadline, margin, Duration::ZERO),
            ),
        };
        let statement = Statement::Lock {
            lock_id,
            mode,
            lock_timeout_ms,
        };
        Some((statement, limit))
    }

    pub(crate) fn passed(self) -> bool {
        Instant::now() >= self.at()
    }

    /// The limit of a step of a call with this deadline (`None`: an unbounded call):
    /// the deadline plus `margin`, or `otherwise` from when the step has to wait.
    pub(crate) fn limit(deadline: Option<Self>, margin: Duration, otherwise: Duration) -> Limit {
        match deadline {
            Some(deadline) => {
                Limit::From(deadline.started, deadline.timeout.saturating_add(margin))
            }
            None => Limit::For(otherwise),
        }
    }
}

/// How long a checkout may wait for a free pool slot.
#[derive(Clone, Copy)]
pub(crate) enum PoolWait {
    /// As long as it takes (an acquire without timeout).
    Forever,
    /// Until the acquisition's deadline.
    Until(Deadline),
    /// Not at all (`try_acquire` never waits).
    No,
}

/// What one `pg_try_advisory_lock` found; either way the caller owns the session.
pub(crate) enum Tried {
    /// The lock is held by the session.
    Granted(Session),
    /// Someone else holds it; the session holds nothing.
    Busy(Session),
}

/// Records the call's timeout on an error, when it had one.
pub(crate) fn with_timeout(
    error: LockAcquisitionError,
    deadline: Option<Deadline>,
) -> LockAcquisitionError {
    match deadline {
        Some(deadline) => error.with_timeout(deadline.timeout),
        None => error,
    }
}

/// Why a standby is refused.
const STANDBY: &str = "Database error: the server is a read-only standby (in recovery); \
     advisory locks there exclude nothing on the primary (use target_session_attrs=read-write)";

/// Why a connection whose statements reach different server sessions is refused.
pub(crate) const MOVED_BETWEEN_SESSIONS: &str = "the statements of one connection ran on \
     different server sessions, so a session advisory lock would exclude nothing: session locks \
     need a direct connection or a session-pooling proxy (PgBouncer pool_mode=session); behind \
     transaction pooling, use TransactionLocks";

/// Closes `session` and fails the call with a [`AcquisitionErrorKind::Configuration`]
/// error.
pub(crate) fn refuse(
    key: &str,
    session: Session,
    deadline: Option<Deadline>,
    reason: &'static str,
) -> LockAcquisitionError {
    drop(session);
    let error = LockAcquisitionError::new(key, AcquisitionErrorKind::Configuration, reason);
    with_timeout(error, deadline)
}

/// How an acquisition attempt ends before the bookkeeping.
pub(crate) type Attempt = Result<Session, LockAcquisitionError>;

impl Inner {
    /// The whole acquisition up to the bookkeeping, within `deadline` (already
    /// running; `None` for an unbounded call).
    pub(crate) async fn acquire_session_until(
        &self,
        key: &str,
        lock_id: i64,
        options: AcquireOptions,
        deadline: Option<Deadline>,
    ) -> Attempt {
        let mode = options.mode();
        let wait = deadline.map_or(PoolWait::Forever, PoolWait::Until);
        let session = self.checkout(key, wait, deadline).await?;
        // Every acquisition starts with one pg_try_advisory_lock: uncontended, that is
        // the only statement (and the cheapest). It cannot jump the server's queue: a
        // released lock is granted to the first waiter at release, and a request that
        // conflicts with a queued waiter waits behind it, so it is never seen free
        // while others wait.
        let session = match self.try_lock(key, lock_id, mode, session, deadline).await? {
            Tried::Granted(session) => return Ok(session),
            Tried::Busy(session) => session,
        };
        match (deadline, options.wait_strategy()) {
            // The waits are boxed: kept out of the uncontended path's future, which
            // is moved on every call (a large future costs a copy per move).
            (Some(deadline), WaitStrategy::Poll) => {
                Box::pin(self.poll(
                    key,
                    lock_id,
                    mode,
                    session,
                    deadline,
                    options.retry_interval(),
                ))
                .await
            }
            // Without a timeout every strategy waits in the queue, as in the original.
            _ => Box::pin(self.wait_in_queue(key, lock_id, mode, session, deadline)).await,
        }
    }

    /// `try_acquire`: a checkout that never waits for a slot and one try.
    pub(crate) async fn try_session(
        &self,
        key: &str,
        lock_id: i64,
        mode: LockMode,
    ) -> Result<Option<Session>, LockAcquisitionError> {
        let session = self.checkout(key, PoolWait::No, None).await?;
        match self.try_lock(key, lock_id, mode, session, None).await? {
            Tried::Granted(session) => Ok(Some(session)),
            Tried::Busy(session) => {
                session.into_pool();
                Ok(None)
            }
        }
    }

    /// Checks a connection out. Waiting for a free slot and opening a new connection
    /// both count against the deadline (without one, or with a zero timeout, opening is
    /// bounded by the connect timeout). The pool's own timeouts are not used, so a pool built
    /// without a runtime works too.
    pub(crate) async fn checkout(
        &self,
        key: &str,
        wait: PoolWait,
        deadline: Option<Deadline>,
    ) -> Attempt {
        if let Err(error) = &self.lease {
            let error = LockAcquisitionError::new(
                key,
                AcquisitionErrorKind::Configuration,
                format!("the manager's lease cannot hold: {error}"),
            );
            return Err(with_timeout(error, deadline));
        }
        let settings = &self.settings;
        // Opening a connection is held to the caller's deadline itself: the margin is
        // for a live session's answer, which decides whether a lock was granted. A zero
        // timeout is a try (it waits for nobody) and opens as `try_acquire` does.
        let opening = deadline.filter(|deadline| !deadline.timeout.is_zero());
        let connecting = Deadline::limit(opening, Duration::ZERO, settings.connect_timeout);
        let no_wait = Timeouts {
            wait: Some(Duration::ZERO),
            create: None,
            recycle: None,
        };
        // Not boxed: the pool's future (it may open a connection) is large, but copying
        // it into the limit costs less than allocating it on every checkout.
        let checked_out = match connecting.run(self.pool.timeout_get(&no_wait)).await {
            // An idle connection: the common case, made into a session at once.
            Ok(Ok(object)) => return Ok(Session::new(object, &self.connections)),
            Err(Expired) => return Err(self.unreachable(key, deadline)),
            Ok(Err(PoolError::Timeout(TimeoutType::Wait))) => match wait {
                PoolWait::No => {
                    return Err(self.pool_exhausted(key, "no pool connection was free", None));
                }
                PoolWait::Forever => Box::pin(self.wait_for_slot()).await,
                PoolWait::Until(deadline) => {
                    let limit = Limit::From(deadline.started, deadline.timeout);
                    match limit.run(Box::pin(self.wait_for_slot())).await.ok() {
                        Some(result) => result,
                        None => {
                            let reason = format!(
                                "{} waiting for a pool connection",
                                timeout_reason(deadline.timeout)
                            );
                            return Err(self.pool_exhausted(key, &reason, Some(deadline)));
                        }
                    }
                }
            },
            Ok(Err(error)) => Err(error),
        };
        match checked_out {
            Ok(object) => Ok(Session::new(object, &self.connections)),
            Err(error) => Err(with_timeout(pool_error(key, error), deadline)),
        }
    }

    /// Waits for a free pool slot for as long as it takes; a connection opened for it
    /// is bounded by the connect timeout where the pool has a runtime for timeouts.
    async fn wait_for_slot(&self) -> Result<Object, PoolError> {
        let bounded = Timeouts {
            wait: None,
            create: Some(self.settings.connect_timeout),
            recycle: Some(self.settings.answer_timeout),
        };
        match self.pool.timeout_get(&bounded).await {
            Err(PoolError::NoRuntimeSpecified) => self.pool.timeout_get(&Timeouts::default()).await,
            other => other,
        }
    }

    fn unreachable(&self, key: &str, deadline: Option<Deadline>) -> LockAcquisitionError {
        let waited = deadline.map_or(self.settings.connect_timeout, |deadline| deadline.timeout);
        let error = LockAcquisitionError::new(
            key,
            AcquisitionErrorKind::Unreachable,
            format!(
                "{} opening a connection (the server did not answer)",
                timeout_reason(waited)
            ),
        );
        with_timeout(error, deadline)
    }

    fn pool_exhausted(
        &self,
        key: &str,
        what: &str,
        deadline: Option<Deadline>,
    ) -> LockAcquisitionError {
        let reason = format!(
            "{what} (all {} in use; each held lock keeps one)",
            self.pool.status().max_size
        );
        let error = LockAcquisitionError::new(key, AcquisitionErrorKind::PoolUnavailable, reason);
        with_timeout(error, deadline)
    }

    /// Runs `statement` within `limit`. A connection not set up yet is set up first,
    /// pipelined with the statement (see [`crate::sql::SESSION_SETUP`]). A statement
    /// that reached a server session not marked as the connection's own did nothing:
    /// it is run once more behind a fresh set-up (a pool's recycling may have reset the
    /// session's settings), and if it misses again, or the set-up finds the session
    /// marked by another connection, the statements are being moved between server
    /// sessions (a transaction-pooling proxy) and the call fails with
    /// [`AcquisitionErrorKind::Configuration`]. On expiry the session is dropped: the
    /// statement cancelled, the connection closed, which undoes whatever it did.
    pub(crate) async fn answered(
        &self,
        key: &str,
        mut session: Session,
        statement: Statement,
        limit: Limit,
        deadline: Option<Deadline>,
    ) -> Result<(Session, Result<Answer, tokio_postgres::Error>), LockAcquisitionError> {
        if session.is_set_up() {
            let fresh = session.is_fresh();
            // Pinned where made (the statement's future is large), and gone after.
            let answer = {
                let running = std::pin::pin!(session.run_within(statement, limit));
                running.await.ok()
            };
            match answer {
                None => return Err(self.no_answer(key, session, deadline)),
                // It did nothing. Straight after checkout the pool's recycling may
                // have reset the session: once more, behind a fresh set-up.
                Some(Ok(Answer::WrongSession)) if fresh => session.mark_set_up(false),
                Some(Ok(Answer::WrongSession)) => {
                    return Err(refuse(key, session, deadline, MOVED_BETWEEN_SESSIONS));
                }
                Some(answer) => return Ok((session, answer)),
            }
        }
        // Once per connection: boxed, out of the common path's future.
        let setup = Box::pin(session.run_after_setup(self.setup_values(), statement, limit));
        let Some((setup, answer)) = setup.await.ok() else {
            return Err(self.no_answer(key, session, deadline));
        };
        match setup {
            Ok(SetUp::Done) if !matches!(answer, Ok(Answer::WrongSession)) => {
                session.mark_set_up(true);
                Ok((session, answer))
            }
            Ok(SetUp::Standby) => Err(refuse(key, session, deadline, STANDBY)),
            Ok(SetUp::Done | SetUp::Foreign) => {
                Err(refuse(key, session, deadline, MOVED_BETWEEN_SESSIONS))
            }
            Err(error) => {
                drop(session);
                Err(with_timeout(driver_error(key, error), deadline))
            }
        }
    }

    /// What the set-up gives each of the manager's sessions.
    pub(crate) fn setup_values(&self) -> SetupValues<'_> {
        SetupValues {
            application_name: self.application_name.as_deref(),
            timers: self.server_timers.as_ref(),
        }
    }

    /// A statement's answer did not come within its limit: the session is dropped
    /// (statement cancelled, connection closed).
    fn no_answer(
        &self,
        key: &str,
        session: Session,
        deadline: Option<Deadline>,
    ) -> LockAcquisitionError {
        drop(session);
        let waited = deadline.map_or(self.settings.answer_timeout, |deadline| deadline.timeout);
        let error = LockAcquisitionError::new(
            key,
            AcquisitionErrorKind::ConnectionLost,
            format!("{} (the server did not answer)", timeout_reason(waited)),
        );
        with_timeout(error, deadline)
    }

    /// One `pg_try_advisory_lock`. On an error the session is closed (whatever the
    /// statement did, that undoes it).
    pub(crate) async fn try_lock(
        &self,
        key: &str,
        lock_id: i64,
        mode: LockMode,
        session: Session,
        deadline: Option<Deadline>,
    ) -> Result<Tried, LockAcquisitionError> {
        let statement = Statement::TryLock { lock_id, mode };
        let limit = Deadline::limit(
            deadline,
            self.settings.deadline_margin,
            self.settings.answer_timeout,
        );
        match self
            .answered(key, session, statement, limit, deadline)
            .await?
        {
            (session, Ok(Answer::Bool(true))) => Ok(Tried::Granted(session)),
            (session, Ok(_)) => Ok(Tried::Busy(session)),
            (session, Err(error)) => {
                session.close();
                Err(with_timeout(driver_error(key, error), deadline))
            }
        }
    }

    /// After a wait ended in an error on a live connection, makes sure the session
    /// does not hold the lock (it can be granted just as the wait is cancelled), then
    /// gives the connection back; if that cannot be shown in time, closes it.
    async fn settle_after_failed_wait(&self, lock_id: i64, mode: LockMode, mut session: Session) {
        let check = Statement::UnlockIfHeld { lock_id, mode };
        let answer = session
            .run_within(check, Limit::For(self.settings.answer_timeout))
            .await
            .ok();
        match answer {
            Some(Ok(Answer::Bool(was_held))) => {
                if was_held {
                    tracing::debug!(
                        lock_id,
                        "the lock was granted as the wait ended; released it"
                    );
                }
                session.into_pool();
            }
            Some(Ok(Answer::Locked | Answer::WrongSession) | Err(_)) | None => session.close(),
        }
    }

    /// Waits in the server's queue: one `pg_advisory_lock` bounded by `lock_timeout`.
    async fn wait_in_queue(
        &self,
        key: &str,
        lock_id: i64,
        mode: LockMode,
        mut session: Session,
        deadline: Option<Deadline>,
    ) -> Attempt {
        loop {
            let margin = self.settings.deadline_margin;
            let Some((statement, limit)) =
                Deadline::wait_statement(deadline, lock_id, mode, margin)
            else {
                // No time left to wait; the first try has been made. The session
                // holds nothing.
                session.into_pool();
                let timeout = deadline.map_or(Duration::ZERO, |deadline| deadline.timeout);
                return Err(LockAcquisitionError::timed_out(key, timeout));
            };
            let outcome;
            (session, outcome) = self
                .answered(key, session, statement, limit, deadline)
                .await?;
            let error = match outcome {
                Ok(_) => return Ok(session),
                Err(error) => error,
            };
            if error.is_closed() {
                session.close();
                return Err(with_timeout(driver_error(key, error), deadline));
            }
            self.settle_after_failed_wait(lock_id, mode, session).await;
            let timed_out = error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE);
            match deadline {
                Some(deadline) if timed_out => {
                    if deadline.passed() {
                        return Err(LockAcquisitionError::timed_out(key, deadline.timeout));
                    }
                    // lock_timeout fired early (it is capped at ~24.8 days): wait again.
                    session = self
                        .checkout(key, PoolWait::Until(deadline), Some(deadline))
                        .await?;
                }
                _ => return Err(with_timeout(driver_error(key, error), deadline)),
            }
        }
    }

    /// The original's strategy, after the first try: `pg_try_advisory_lock` every
    /// `retry_interval` on one session until the deadline.
    async fn poll(
        &self,
        key: &str,
        lock_id: i64,
        mode: LockMode,
        mut session: Session,
        deadline: Deadline,
        retry_interval: Duration,
    ) -> Attempt {
        let retry_interval = retry_interval.max(Duration::from_millis(1));
        loop {
            if deadline.passed() {
                session.into_pool();
                return Err(LockAcquisitionError::timed_out(key, deadline.timeout));
            }
            tokio::time::sleep(retry_interval.min(deadline.remaining())).await;
            session = match self
                .try_lock(key, lock_id, mode, session, Some(deadline))
                .await?
            {
                Tried::Granted(session) => return Ok(session),
                Tried::Busy(session) => session,
            };
        }
    }
}
