//! Several keys at once: all or nothing, in one global order, within one deadline, on
//! one session.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use locks_port::{
    AcquireMany, AcquireOptions, LockAcquisitionError, LockGroup, LockInfo, LockMode, LossNotifier,
    LostReason, LostSignal, ReleaseOutcome,
};
use tokio::sync::Mutex as AsyncMutex;
use tokio_postgres::error::SqlState;
use tracing::Instrument;

use crate::acquire::{Deadline, MOVED_BETWEEN_SESSIONS, PoolWait, Tried, refuse, with_timeout};
use crate::bookkeeping::{Group, Held};
use crate::classify::driver_error;
use crate::connection::{Answer, Session};
use crate::manager::{Inner, PostgresLockManager};
use crate::telemetry::{finish_acquire_span, manager_acquire_span, started};

impl PostgresLockManager {
    /// Takes the locks of all `keys`, or none: in one global order (ascending lock id,
    /// keys with the same lock id merged), within one deadline (`options`' timeout), on
    /// one connection (a session can hold many advisory locks). Every process that takes
    /// several keys this way takes them in the same order, so two of them can never
    /// deadlock on each other.
    ///
    /// An empty `keys` is granted with a guard that holds nothing (it still takes and
    /// gives back one pool connection).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use locks_postgres::prelude::*;
    ///
    /// # async fn run(locks: PostgresLockManager) -> Result<(), LockAcquisitionError> {
    /// let transfer = locks
    ///     .acquire_many(&["account:17", "account:4"], Duration::from_secs(2))
    ///     .await?;
    /// assert_eq!(transfer.infos().len(), 2);
    /// // ... move money between the two accounts ...
    /// transfer.release().await;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](locks_port::DistributedLock::acquire), naming the key that could
    /// not be had (for a timeout, the first key still busy at the deadline). Nothing is
    /// held after an error: the session that took the first keys is closed, which frees
    /// them all at once.
    ///
    /// # Cancel safety
    /// Cancel safe as a whole: dropping the future at any point closes the session,
    /// which frees every key it took, and cancels a wait in progress.
    pub async fn acquire_many(
        &self,
        keys: &[&str],
        options: impl Into<AcquireOptions> + Send,
    ) -> Result<PostgresLocks, LockAcquisitionError> {
        let options = options.into();
        let inner = &self.inner;
        // One global order (the port's), with the lock ids from the manager's cache.
        let ordered = locks_port::lock_order_with(keys, |key| inner.lock_ids.lock_id(key));
        let first = ordered.values().next().copied().unwrap_or("");
        let span = manager_acquire_span(
            self.inner.settings.span_level,
            inner.shown(first),
            *ordered.keys().next().unwrap_or(&0),
            &options,
        );
        let started = started(&span);
        let began = inner.metrics.started();
        let attempt = async {
            let session = inner.acquire_group(&ordered, options).await?;
            inner
                .register_group(&ordered, options.mode(), session)
                .await
        }
        .instrument(span.clone())
        .await;
        finish_acquire_span(&span, started, attempt.as_ref().map(|_| true));
        let first_id = ordered.keys().next().copied().unwrap_or(0);
        let outcome = attempt.as_ref().map(|_| true);
        inner
            .metrics
            .acquisition(options.mode(), first_id, began, outcome);
        attempt
    }
}

impl Inner {
    /// Takes every lock of `ordered` on one session, in order; on any failure the
    /// session is dropped (closed), which frees what it took.
    async fn acquire_group(
        &self,
        ordered: &BTreeMap<i64, &str>,
        options: AcquireOptions,
    ) -> Result<Session, LockAcquisitionError> {
        let deadline = options.timeout().map(Deadline::after);
        let mode = options.mode();
        let first = ordered.values().next().copied().unwrap_or("");
        let wait = deadline.map_or(PoolWait::Forever, PoolWait::Until);
        let mut session = self.checkout(first, wait, deadline).await?;
        for (&lock_id, &key) in ordered {
            session = match self.try_lock(key, lock_id, mode, session, deadline).await? {
                Tried::Granted(session) => session,
                Tried::Busy(session) => {
                    self.wait_holding(key, lock_id, mode, session, deadline)
                        .await?
                }
            };
        }
        Ok(session)
    }

    /// Waits for one more lock on a session that may hold others: one
    /// `pg_advisory_lock` under the remaining time. On any failure the session is
    /// closed (never pooled: it holds the group's first locks).
    async fn wait_holding(
        &self,
        key: &str,
        lock_id: i64,
        mode: LockMode,
        session: Session,
        deadline: Option<Deadline>,
    ) -> Result<Session, LockAcquisitionError> {
        let margin = self.settings.deadline_margin;
        let Some((statement, limit)) = Deadline::wait_statement(deadline, lock_id, mode, margin)
        else {
            drop(session);
            let timeout = deadline.map_or(Duration::ZERO, |deadline| deadline.timeout);
            return Err(LockAcquisitionError::timed_out(key, timeout));
        };
        let (session, outcome) = self
            .answered(key, session, statement, limit, deadline)
            .await?;
        match outcome {
            Ok(Answer::Locked | Answer::Bool(_)) => Ok(session),
            // `answered` refuses a moved session itself; kept for completeness.
            Ok(Answer::WrongSession) => Err(refuse(key, session, deadline, MOVED_BETWEEN_SESSIONS)),
            Err(error) => {
                drop(session);
                match deadline {
                    Some(deadline) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                        Err(LockAcquisitionError::timed_out(key, deadline.timeout))
                    }
                    _ => Err(with_timeout(driver_error(key, error), deadline)),
                }
            }
        }
    }

    /// Records a group: one entry per key, one shared session and one shared signal;
    /// with fencing on, first takes a token per key (one round trip; on failure the
    /// session is closed, which frees them all).
    async fn register_group(
        self: &Arc<Self>,
        ordered: &BTreeMap<i64, &str>,
        mode: LockMode,
        mut session: Session,
    ) -> Result<PostgresLocks, LockAcquisitionError> {
        let lock_ids: Box<[i64]> = ordered.keys().copied().collect();
        let tokens = if self.settings.fencing && !lock_ids.is_empty() {
            let first = ordered.values().next().copied().unwrap_or("");
            Some(Box::pin(self.next_fencing_tokens(first, &lock_ids, &mut session)).await?)
        } else {
            None
        };
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let notifier = LossNotifier::new();
        let slot = Arc::new(AsyncMutex::new(Some(session)));
        let group = Arc::new(Group {
            left: AtomicUsize::new(ordered.len()),
            lock_ids,
        });
        let mut infos = Vec::with_capacity(ordered.len());
        {
            let mut book = self.held();
            for (&lock_id, &key) in ordered {
                let shared_key: Arc<str> = Arc::from(key);
                let mut info = LockInfo::acquired_now(
                    Arc::clone(&shared_key),
                    lock_id,
                    self.holder_id.clone(),
                )
                .with_mode(mode);
                if let Some(fencing) = tokens.as_ref().and_then(|tokens| tokens.get(&lock_id)) {
                    info = info.with_fencing_token(*fencing);
                }
                infos.push(info);
                let displaced = book.insert(Held {
                    key: shared_key,
                    token,
                    lock_id,
                    mode,
                    slot: Arc::clone(&slot),
                    notifier: notifier.clone(),
                    last_answer: None,
                    pinging: false,
                    group: Some(Arc::clone(&group)),
                    host: None,
                });
                for previous in displaced {
                    self.lose(
                        previous,
                        LostReason::ConnectionClosed,
                        "a second grant displaced it",
                    );
                }
            }
        }
        self.ensure_monitor();
        Ok(PostgresLocks {
            inner: Arc::clone(self),
            infos,
            token,
            lost: notifier.signal(),
            armed: true,
        })
    }
}

/// For code generic over the manager: the inherent [`PostgresLockManager::acquire_many`].
impl AcquireMany for PostgresLockManager {
    type Locks = PostgresLocks;

    async fn acquire_many(
        &self,
        keys: &[&str],
        options: impl Into<AcquireOptions> + Send,
    ) -> Result<PostgresLocks, LockAcquisitionError> {
        Self::acquire_many(self, keys, options).await
    }
}

/// The inherent methods, for code generic over the manager.
impl LockGroup for PostgresLocks {
    fn infos(&self) -> &[LockInfo] {
        Self::infos(self)
    }

    fn lost(&self) -> LostSignal {
        Self::lost(self)
    }

    async fn release(self) -> ReleaseOutcome {
        Self::release(self).await
    }
}

/// The locks of one [`acquire_many`](PostgresLockManager::acquire_many), held on one
/// session and released together.
///
/// Dropping it releases them all (spawned onto the runtime, or by closing the session
/// when there is none). [`lost`](Self::lost) fires when any of them is no longer held.
#[must_use = "dropping the guard releases the locks at once"]
pub struct PostgresLocks {
    inner: Arc<Inner>,
    infos: Vec<LockInfo>,
    token: u64,
    lost: LostSignal,
    armed: bool,
}

impl PostgresLocks {
    /// The locks, in the order they were taken (ascending lock id).
    #[must_use]
    pub fn infos(&self) -> &[LockInfo] {
        &self.infos
    }

    /// Fires when any of the locks is no longer held (see
    /// [`LockGuard::lost`](locks_port::LockGuard::lost)).
    #[must_use]
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Whether any of the locks is no longer held.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Releases every lock now: `Unlocked` when each was unlocked, else the first other
    /// outcome (a lock lost or released meanwhile, a session closed instead).
    ///
    /// # Cancel safety
    /// The entries leave the bookkeeping before the first await; if the future is
    /// dropped, the shared session is closed, which frees what is left.
    pub async fn release(mut self) -> ReleaseOutcome {
        self.armed = false;
        let taken = self.take();
        let mut outcome = ReleaseOutcome::Unlocked;
        let expected = self.infos.len();
        let found = taken.len();
        for held in taken {
            let result = self.inner.unlock(held).await;
            if outcome == ReleaseOutcome::Unlocked {
                outcome = result;
            }
        }
        if found < expected && outcome == ReleaseOutcome::Unlocked {
            outcome = match self.lost.reason() {
                Some(reason) if reason != LostReason::Released => ReleaseOutcome::Lost(reason),
                _ => ReleaseOutcome::AlreadyReleased,
            };
        }
        outcome
    }

    fn take(&self) -> Vec<Held> {
        self.infos
            .iter()
            .filter_map(|info| self.inner.take_one(info.lock_id(), self.token))
            .collect()
    }
}

impl Drop for PostgresLocks {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let taken = self.take();
        if taken.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let inner = Arc::clone(&self.inner);
                runtime.spawn(async move {
                    for held in taken {
                        inner.unlock(held).await;
                    }
                });
            }
            Err(_) => drop(taken),
        }
    }
}

impl fmt::Debug for PostgresLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLocks")
            .field("infos", &self.infos)
            .field("lost", &self.lost.reason())
            .finish_non_exhaustive()
    }
}
