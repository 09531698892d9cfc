//! The PostgreSQL lock manager.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_postgres::{Pool, PoolError, TimeoutType};
use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, KeyDerivation, LockAcquisitionError,
    LockInfo, LockNotHeldError, LockRegistry, ReleaseOutcome, WaitStrategy, timeout_reason,
};
use time::OffsetDateTime;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tracing::{Instrument, Span};

use crate::classify::{driver_kind, pool_kind, sqlstate};
use crate::connection::{Answer, Session};
use crate::guard::PostgresLockGuard;
use crate::sql::Statement;
use crate::telemetry::{acquire_span, duration_ms, record_failure, release_span};

/// How long after its own `lock_timeout` a bounded wait still waits for the server's
/// answer before it gives up on the connection (a server that stopped answering).
const SERVER_ANSWER_GRACE: Duration = Duration::from_secs(2);

/// Whether lock keys appear in spans and log events.
///
/// Keys often carry tenant ids. With [`KeyVisibility::Hidden`] spans and events carry
/// only the derived lock id, which is enough to find the lock in `pg_locks`. Error
/// messages returned to the caller still name the key (they are the caller's own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyVisibility {
    /// Keys are recorded as `lock.key` (the default).
    #[default]
    Shown,
    /// Keys are left out of spans and events.
    Hidden,
}

/// String-keyed distributed locks on PostgreSQL session-level advisory locks.
///
/// Each held lock keeps one connection checked out of the pool for as long as it is
/// held, because advisory locks belong to the session that took them. Cloning is
/// cheap and shares the bookkeeping: build one per process and share it.
///
/// See the [crate documentation](crate) for sizing, cancel safety and operations.
#[derive(Clone)]
pub struct PostgresLockManager {
    pub(crate) inner: Arc<Inner>,
}

/// Builds a [`PostgresLockManager`] with options.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct PostgresLockManagerBuilder {
    pool: Pool,
    holder_id: Option<String>,
    key_visibility: KeyVisibility,
    derivation: KeyDerivation,
}

pub(crate) struct Inner {
    pool: Pool,
    holder_id: Option<String>,
    key_visibility: KeyVisibility,
    derivation: KeyDerivation,
    held: Mutex<HashMap<String, Held>>,
    next_token: AtomicU64,
}

/// The bookkeeping entry of one held lock: the session that holds it.
pub(crate) struct Held {
    token: u64,
    lock_id: i64,
    session: Session,
}

impl PostgresLockManager {
    /// A manager over `pool` with no holder id, keys shown, derivation
    /// [`KeyDerivation::CURRENT`]. Does no I/O.
    #[must_use]
    pub fn new(pool: Pool) -> Self {
        Self::builder(pool).build()
    }

    /// A builder for a manager over `pool`.
    pub fn builder(pool: Pool) -> PostgresLockManagerBuilder {
        PostgresLockManagerBuilder {
            pool,
            holder_id: None,
            key_visibility: KeyVisibility::default(),
            derivation: KeyDerivation::CURRENT,
        }
    }

    /// The label copied into every [`LockInfo`] this manager hands out.
    #[must_use]
    pub fn holder_id(&self) -> Option<&str> {
        self.inner.holder_id.as_deref()
    }

    /// The pool the manager checks connections out of.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The lock id this manager derives for `key`.
    #[must_use]
    pub fn lock_id(&self, key: &str) -> i64 {
        self.inner.derivation.lock_id(key)
    }
}

impl PostgresLockManagerBuilder {
    /// A label for this process or instance, copied into [`LockInfo::holder_id`].
    /// Any text is fine; it never reaches SQL.
    pub fn holder_id(mut self, holder_id: impl Into<String>) -> Self {
        self.holder_id = Some(holder_id.into());
        self
    }

    /// Whether keys appear in spans and events (see [`KeyVisibility`]).
    pub fn key_visibility(mut self, key_visibility: KeyVisibility) -> Self {
        self.key_visibility = key_visibility;
        self
    }

    /// The key derivation. Every process contending for the same keys must use the
    /// same one.
    pub fn key_derivation(mut self, derivation: KeyDerivation) -> Self {
        self.derivation = derivation;
        self
    }

    /// Builds the manager. Does no I/O.
    #[must_use]
    pub fn build(self) -> PostgresLockManager {
        PostgresLockManager {
            inner: Arc::new(Inner {
                pool: self.pool,
                holder_id: self.holder_id,
                key_visibility: self.key_visibility,
                derivation: self.derivation,
                held: Mutex::new(HashMap::new()),
                next_token: AtomicU64::new(1),
            }),
        }
    }
}

impl fmt::Debug for PostgresLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockManager")
            .field("holder_id", &self.inner.holder_id)
            .field("key_visibility", &self.inner.key_visibility)
            .field("derivation", &self.inner.derivation)
            .field("held_lock_count", &self.inner.held().len())
            .field("pool", &self.inner.pool.status())
            .finish()
    }
}

/// How long a checkout may wait for a free pool slot.
#[derive(Clone, Copy)]
enum PoolWait {
    /// As long as it takes (an acquire without timeout).
    Forever,
    /// Until the acquisition's deadline.
    Until(Instant, Duration),
    /// Not at all (`try_acquire` never waits).
    No,
}

impl PoolWait {
    /// The timeout of the call, for its errors.
    fn timeout(self) -> Option<Duration> {
        match self {
            Self::Until(_, timeout) => Some(timeout),
            Self::Forever | Self::No => None,
        }
    }
}

/// What one `pg_try_advisory_lock` found; either way the caller owns the session.
enum Tried {
    /// The lock is held by the session.
    Granted(Session),
    /// Someone else holds it; the session holds nothing.
    Busy(Session),
}

/// Records the call's timeout on an error, when it had one.
fn with_timeout(error: LockAcquisitionError, timeout: Option<Duration>) -> LockAcquisitionError {
    match timeout {
        Some(timeout) => error.with_timeout(timeout),
        None => error,
    }
}

/// How an acquisition attempt ends before the bookkeeping.
type Attempt = Result<Session, LockAcquisitionError>;

impl Inner {
    fn held(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        // The map stays consistent even if a holder panicked: every change is one call.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key as spans and events may show it.
    fn shown<'k>(&self, key: &'k str) -> Option<&'k str> {
        match self.key_visibility {
            KeyVisibility::Shown => Some(key),
            KeyVisibility::Hidden => None,
        }
    }

    /// Takes the entry of `key` out of the bookkeeping; with a token, only if it is
    /// that acquisition's entry.
    pub(crate) fn take(&self, key: &str, token: Option<u64>) -> Option<Held> {
        let mut held = self.held();
        match (held.get(key), token) {
            (Some(entry), Some(token)) if entry.token != token => None,
            (Some(_), _) => held.remove(key),
            (None, _) => None,
        }
    }

    /// Records a granted lock and hands out its guard.
    fn register(self: &Arc<Self>, key: &str, lock_id: i64, session: Session) -> PostgresLockGuard {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let info = LockInfo::new(
            key,
            lock_id,
            OffsetDateTime::now_utc(),
            self.holder_id.clone(),
        );
        let previous = self.held().insert(
            key.to_owned(),
            Held {
                token,
                lock_id,
                session,
            },
        );
        if let Some(previous) = previous {
            // Two sessions of one manager were both granted one advisory lock: the
            // sessions are not real (a transaction-pooling proxy). Do not orphan it.
            tracing::error!(
                key = self.shown(key),
                lock_id,
                "two sessions were granted one advisory lock; session locks need a direct \
                 connection or session pooling (closing the older session)"
            );
            previous.session.close();
        }
        tracing::debug!(
            key = self.shown(key),
            lock_id,
            holder_id = self.holder_id.as_deref(),
            "lock acquired"
        );
        PostgresLockGuard::new(Arc::clone(self), info, token)
    }

    /// Unlocks a lock taken out of the bookkeeping. Never fails: when the unlock fails
    /// or the session did not hold the lock, the session is closed instead of being
    /// given back, which frees whatever it held.
    pub(crate) async fn unlock(&self, key: &str, held: Held) -> ReleaseOutcome {
        let span = release_span(self.shown(key), held.lock_id);
        let lock_id = held.lock_id;
        let mut session = held.session;
        async {
            let current = Span::current();
            match session.run(Statement::Unlock { lock_id }).await {
                Ok(Answer::Bool(true)) => {
                    session.into_pool();
                    current.record("lock.released", true);
                    tracing::debug!(key = self.shown(key), lock_id, "lock released");
                    ReleaseOutcome::Unlocked
                }
                Ok(_) => {
                    session.close();
                    current.record("lock.released", false);
                    record_failure(&current, AcquisitionErrorKind::Backend, None);
                    tracing::warn!(
                        key = self.shown(key),
                        lock_id,
                        "Error releasing advisory lock: the session no longer held it; \
                         closed the session"
                    );
                    ReleaseOutcome::SessionClosed
                }
                Err(error) => {
                    session.close();
                    current.record("lock.released", false);
                    record_failure(&current, driver_kind(&error), sqlstate(&error));
                    tracing::warn!(
                        key = self.shown(key),
                        lock_id,
                        error = %error,
                        sqlstate = sqlstate(&error),
                        "Error releasing advisory lock; closed the session, which frees it"
                    );
                    ReleaseOutcome::SessionClosed
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Checks a connection out. Waiting for a free slot counts against the deadline;
    /// opening a new connection when the pool has room is bounded by the pool's own
    /// timeouts, so a zero timeout still makes its one attempt on a cold pool.
    async fn checkout(&self, key: &str, wait: PoolWait) -> Attempt {
        let mut no_wait = self.pool.timeouts();
        no_wait.wait = Some(Duration::ZERO);
        let checked_out = match self.pool.timeout_get(&no_wait).await {
            Err(PoolError::Timeout(TimeoutType::Wait)) => match wait {
                PoolWait::Forever => self.pool.get().await,
                PoolWait::No => {
                    return Err(self.pool_exhausted(key, "no pool connection was free", None));
                }
                PoolWait::Until(deadline, timeout) => {
                    match tokio::time::timeout_at(deadline, self.pool.get()).await {
                        Ok(result) => result,
                        Err(_elapsed) => {
                            let reason = format!(
                                "{} waiting for a pool connection",
                                timeout_reason(timeout)
                            );
                            return Err(self.pool_exhausted(key, &reason, Some(timeout)));
                        }
                    }
                }
            },
            other => other,
        };
        checked_out.map(Session::new).map_err(|error| {
            let kind = pool_kind(&error);
            with_timeout(
                LockAcquisitionError::database(key, kind, error),
                wait.timeout(),
            )
        })
    }

    fn pool_exhausted(
        &self,
        key: &str,
        what: &str,
        timeout: Option<Duration>,
    ) -> LockAcquisitionError {
        let reason = format!(
            "{what} (all {} in use; each held lock keeps one)",
            self.pool.status().max_size
        );
        let error = LockAcquisitionError::new(key, AcquisitionErrorKind::PoolUnavailable, reason);
        with_timeout(error, timeout)
    }

    /// Runs `statement`; for a bounded acquisition, gives up on a server that has not
    /// answered `SERVER_ANSWER_GRACE` after the deadline (the session is then dropped:
    /// the statement cancelled, the connection closed).
    async fn answered(
        &self,
        key: &str,
        mut session: Session,
        statement: Statement,
        deadline: Option<(Instant, Duration)>,
    ) -> Result<(Session, Result<Answer, tokio_postgres::Error>), LockAcquisitionError> {
        let Some((deadline, timeout)) = deadline else {
            let outcome = session.run(statement).await;
            return Ok((session, outcome));
        };
        let limit = deadline.saturating_duration_since(Instant::now()) + SERVER_ANSWER_GRACE;
        match tokio::time::timeout(limit, session.run(statement)).await {
            Ok(outcome) => Ok((session, outcome)),
            Err(_elapsed) => {
                drop(session);
                Err(LockAcquisitionError::new(
                    key,
                    AcquisitionErrorKind::ConnectionLost,
                    format!("{} (the server did not answer)", timeout_reason(timeout)),
                )
                .with_timeout(timeout))
            }
        }
    }

    /// One `pg_try_advisory_lock`, bounded as [`answered`](Self::answered). On an error
    /// the session is closed (whatever the statement did, that undoes it).
    async fn try_lock(
        &self,
        key: &str,
        lock_id: i64,
        session: Session,
        deadline: Option<(Instant, Duration)>,
    ) -> Result<Tried, LockAcquisitionError> {
        let statement = Statement::TryLock { lock_id };
        match self.answered(key, session, statement, deadline).await? {
            (session, Ok(Answer::Bool(true))) => Ok(Tried::Granted(session)),
            (session, Ok(_)) => Ok(Tried::Busy(session)),
            (session, Err(error)) => {
                session.close();
                let error = LockAcquisitionError::database(key, driver_kind(&error), error);
                Err(with_timeout(error, deadline.map(|(_, timeout)| timeout)))
            }
        }
    }

    /// After a wait ended in an error on a live connection, makes sure the session
    /// does not hold the lock (it can be granted just as the wait is cancelled), then
    /// gives the connection back; if that cannot be shown, closes it.
    async fn settle_after_failed_wait(&self, lock_id: i64, mut session: Session) {
        match session.run(Statement::UnlockIfHeld { lock_id }).await {
            Ok(Answer::Bool(was_held)) => {
                if was_held {
                    tracing::debug!(
                        lock_id,
                        "the lock was granted as the wait ended; released it"
                    );
                }
                session.into_pool();
            }
            Ok(Answer::Locked) | Err(_) => session.close(),
        }
    }

    /// The whole acquisition up to the bookkeeping.
    async fn acquire_session(&self, key: &str, lock_id: i64, options: AcquireOptions) -> Attempt {
        let started = Instant::now();
        let deadline = options
            .timeout()
            .map(|timeout| (started + timeout, timeout));
        let wait = deadline.map_or(PoolWait::Forever, |(deadline, timeout)| {
            PoolWait::Until(deadline, timeout)
        });
        let session = self.checkout(key, wait).await?;
        // Every acquisition starts with one pg_try_advisory_lock: uncontended, that is
        // the only statement (and the cheapest). It cannot jump the server's queue: a
        // released lock is granted to the first waiter at release, so it is never seen
        // free while others wait.
        let session = match self.try_lock(key, lock_id, session, deadline).await? {
            Tried::Granted(session) => return Ok(session),
            Tried::Busy(session) => session,
        };
        let Some((deadline, timeout)) = deadline else {
            return self.wait_in_queue(key, lock_id, session, None).await;
        };
        match options.wait_strategy() {
            WaitStrategy::Poll => {
                self.poll(
                    key,
                    lock_id,
                    session,
                    deadline,
                    timeout,
                    options.retry_interval(),
                )
                .await
            }
            _ => {
                self.wait_in_queue(key, lock_id, session, Some((deadline, timeout)))
                    .await
            }
        }
    }

    /// Waits in the server's queue: one `pg_advisory_lock` bounded by `lock_timeout`.
    async fn wait_in_queue(
        &self,
        key: &str,
        lock_id: i64,
        mut session: Session,
        deadline: Option<(Instant, Duration)>,
    ) -> Attempt {
        loop {
            let lock_timeout_ms = match deadline {
                None => 0,
                Some((deadline, timeout)) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    let ms = remaining.as_micros().div_ceil(1000);
                    if ms == 0 {
                        // No time left to wait; the first try has been made. The
                        // session holds nothing.
                        session.into_pool();
                        return Err(LockAcquisitionError::timed_out(key, timeout));
                    }
                    // lock_timeout takes at most i32::MAX ms (about 24.8 days).
                    u32::try_from(ms).map_or(i32::MAX.unsigned_abs(), |ms| {
                        ms.min(i32::MAX.unsigned_abs())
                    })
                }
            };
            let statement = Statement::Lock {
                lock_id,
                lock_timeout_ms,
            };
            let outcome;
            (session, outcome) = self.answered(key, session, statement, deadline).await?;
            let error = match outcome {
                Ok(_) => return Ok(session),
                Err(error) => error,
            };
            if error.is_closed() {
                session.close();
                return Err(self.wait_error(key, deadline, error));
            }
            self.settle_after_failed_wait(lock_id, session).await;
            let timed_out = error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE);
            match deadline {
                Some((deadline, timeout)) if timed_out => {
                    if Instant::now() >= deadline {
                        return Err(LockAcquisitionError::timed_out(key, timeout));
                    }
                    // lock_timeout fired early (it is capped at ~24.8 days): wait again.
                    session = self
                        .checkout(key, PoolWait::Until(deadline, timeout))
                        .await?;
                }
                _ => return Err(self.wait_error(key, deadline, error)),
            }
        }
    }

    fn wait_error(
        &self,
        key: &str,
        deadline: Option<(Instant, Duration)>,
        error: tokio_postgres::Error,
    ) -> LockAcquisitionError {
        let error = LockAcquisitionError::database(key, driver_kind(&error), error);
        with_timeout(error, deadline.map(|(_, timeout)| timeout))
    }

    /// The original's strategy, after the first try: `pg_try_advisory_lock` every
    /// `retry_interval` on one session until the deadline.
    async fn poll(
        &self,
        key: &str,
        lock_id: i64,
        mut session: Session,
        deadline: Instant,
        timeout: Duration,
        retry_interval: Duration,
    ) -> Attempt {
        loop {
            let now = Instant::now();
            if now >= deadline {
                session.into_pool();
                return Err(LockAcquisitionError::timed_out(key, timeout));
            }
            tokio::time::sleep(retry_interval.min(deadline - now)).await;
            session = match self
                .try_lock(key, lock_id, session, Some((deadline, timeout)))
                .await?
            {
                Tried::Granted(session) => return Ok(session),
                Tried::Busy(session) => session,
            };
        }
    }
}

impl DistributedLock for PostgresLockManager {
    type Guard = PostgresLockGuard;

    /// Takes the lock, waiting in the server's queue (or polling, if asked).
    ///
    /// First one `pg_try_advisory_lock`; if the lock is busy, the wait is one
    /// `pg_advisory_lock` (under a statement-local `lock_timeout` when there is a
    /// timeout): the lock passes to the first waiter the moment it is released.
    /// Waiting for a pool connection counts inside the same timeout. After a timed-out
    /// wait the session is checked (the server can grant the lock as the timeout
    /// fires) and any such grant is undone before the connection goes back.
    ///
    /// # Errors
    /// [`LockAcquisitionError`] with kind `Timeout` (lock busy), `PoolUnavailable`
    /// (no connection in time), `ConnectionLost`, `Cancelled` or `Backend`; database
    /// failures have the reason `Database error: …` and the driver's error as source.
    ///
    /// # Cancel safety
    /// Cancel safe. Dropped while waiting for a connection: nothing was taken. Dropped
    /// while the server is waiting for the lock: the connection is detached from the
    /// pool, a cancel request ends the server-side wait, and the connection is closed,
    /// so the lock can never be granted to a pooled connection later.
    async fn acquire(
        &self,
        key: &str,
        options: AcquireOptions,
    ) -> Result<PostgresLockGuard, LockAcquisitionError> {
        let inner = &self.inner;
        let lock_id = inner.derivation.lock_id(key);
        let operation = match (options.timeout(), options.wait_strategy()) {
            (Some(_), WaitStrategy::Poll) => "pg_try_advisory_lock",
            _ => "pg_advisory_lock",
        };
        let span = acquire_span(inner.shown(key), lock_id, operation, options.timeout());
        let started = Instant::now();
        let attempt = inner
            .acquire_session(key, lock_id, options)
            .instrument(span.clone())
            .await;
        span.record("lock.wait_ms", duration_ms(started.elapsed()));
        match attempt {
            Ok(session) => {
                span.record("lock.acquired", true);
                let _entered = span.enter();
                Ok(inner.register(key, lock_id, session))
            }
            Err(error) => {
                span.record("lock.acquired", false);
                record_acquisition_failure(&span, &error);
                tracing::debug!(parent: &span, key = inner.shown(key), lock_id, reason = error.reason(), "lock not acquired");
                Err(error)
            }
        }
    }

    /// One `pg_try_advisory_lock`; `Ok(None)` when the lock is held elsewhere.
    ///
    /// It never waits: not for the lock, and not for a pool connection either — when
    /// every connection is in use it fails at once with kind `PoolUnavailable`.
    ///
    /// # Errors
    /// A database failure as [`LockAcquisitionError`] (reason `Database error: …`,
    /// the driver's error as source) — never contention.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    async fn try_acquire(
        &self,
        key: &str,
    ) -> Result<Option<PostgresLockGuard>, LockAcquisitionError> {
        let inner = &self.inner;
        let lock_id = inner.derivation.lock_id(key);
        let span = acquire_span(inner.shown(key), lock_id, "pg_try_advisory_lock", None);
        let started = Instant::now();
        let attempt = async {
            let session = inner.checkout(key, PoolWait::No).await?;
            match inner.try_lock(key, lock_id, session, None).await? {
                Tried::Granted(session) => Ok(Some(session)),
                Tried::Busy(session) => {
                    session.into_pool();
                    Ok(None)
                }
            }
        }
        .instrument(span.clone())
        .await;
        span.record("lock.wait_ms", duration_ms(started.elapsed()));
        match attempt {
            Ok(Some(session)) => {
                span.record("lock.acquired", true);
                let _entered = span.enter();
                Ok(Some(inner.register(key, lock_id, session)))
            }
            Ok(None) => {
                span.record("lock.acquired", false);
                Ok(None)
            }
            Err(error) => {
                span.record("lock.acquired", false);
                record_acquisition_failure(&span, &error);
                tracing::error!(parent: &span, key = inner.shown(key), lock_id, error = %error, "try_acquire failed");
                Err(error)
            }
        }
    }

    /// Releases this manager's lock on `key`.
    ///
    /// # Errors
    /// [`LockNotHeldError`] only. A failing unlock is logged at WARNING and the
    /// session is closed, which frees the lock on the server.
    ///
    /// # Cancel safety
    /// The entry leaves the bookkeeping before the first await; if the future is
    /// dropped, the session is closed instead of unlocked.
    async fn release(&self, key: &str) -> Result<(), LockNotHeldError> {
        let held = self
            .inner
            .take(key, None)
            .ok_or_else(|| LockNotHeldError::new(key))?;
        self.inner.unlock(key, held).await;
        Ok(())
    }

    fn is_held(&self, key: &str) -> bool {
        self.inner.held().contains_key(key)
    }
}

impl LockRegistry for PostgresLockManager {
    /// Releases every lock this manager holds; returns how many.
    ///
    /// # Cancel safety
    /// All entries leave the bookkeeping before the first await; if the future is
    /// dropped, the sessions not yet unlocked are closed, which frees their locks.
    async fn release_all(&self) -> usize {
        let drained: Vec<(String, Held)> = self.inner.held().drain().collect();
        let count = drained.len();
        for (key, held) in drained {
            self.inner.unlock(&key, held).await;
        }
        count
    }

    fn held_lock_count(&self) -> usize {
        self.inner.held().len()
    }
}

fn record_acquisition_failure(span: &Span, error: &LockAcquisitionError) {
    let sqlstate = std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<tokio_postgres::Error>())
        .and_then(sqlstate)
        .or_else(|| error.is_timeout().then_some("55P03"));
    record_failure(span, error.kind(), sqlstate);
}
