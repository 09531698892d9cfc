//! The PostgreSQL lock manager: its public type and the port's traits on it; its
//! builder and settings are in [`builder`](crate::builder). The work is in rooms of its
//! own: [`acquire`](crate::acquire) (checkout, try, wait),
//! [`bookkeeping`](crate::bookkeeping) (what is held, release),
//! [`health`](crate::health) (the lost-lock monitor) and [`fencing`](crate::fencing).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_postgres::Pool;
use locks_port::{
    AcquireOptions, DistributedLock, KeyDerivation, LockAcquisitionError, LockMode,
    LockNotHeldError, LockRegistry,
};
use tracing::Instrument;

use crate::bookkeeping::Book;
use crate::builder::{PostgresLockManagerBuilder, Settings, published_holder_id};
use crate::connection::Connections;
use crate::guard::PostgresLockGuard;
use crate::health::LostCounts;
use crate::lease::{Lease, LeaseError};
use crate::lock_ids::LockIds;
use crate::metrics::Metrics;
use crate::multiplex::Multiplexer;
use crate::telemetry::{finish_acquire_span, manager_acquire_span, started};

/// Whether lock keys appear in spans and log events.
///
/// Keys often carry tenant ids. With [`KeyVisibility::Hidden`] no span, event or log
/// record of the manager carries key text, on any path (success or failure): only the
/// derived lock id, which is enough to find the lock in `pg_locks`. Error values
/// returned to the caller still name the key (they are the caller's own); log them
/// with care.
///
/// ```
/// use locks_postgres::{KeyVisibility, PostgresLockManager};
///
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 4)?;
/// let locks = PostgresLockManager::builder(pool)
///     .key_visibility(KeyVisibility::Hidden)
///     .build();
/// # drop(locks);
/// # Ok::<(), locks_postgres::PoolConfigError>(())
/// ```
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
/// held, because advisory locks belong to the session that took them (unless
/// [`multiplex`](PostgresLockManagerBuilder::multiplex) lets locks share connections).
/// Cloning is cheap and shares the bookkeeping: build one per process and share it.
///
/// The lock API is the port's traits ([`DistributedLock`], [`LockRegistry`]); bring
/// them into scope with `use locks_postgres::prelude::*;`.
///
/// ```no_run
/// use std::time::Duration;
/// use locks_postgres::prelude::*;
/// use locks_postgres::PostgresLockManager;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 16)?;
/// let locks = PostgresLockManager::builder(pool).holder_id("worker-1").build();
///
/// let guard = locks.acquire("tenant:42", Duration::from_secs(2)).await?;
/// tokio::select! {
///     () = do_the_work() => {}
///     reason = guard.lost() => eprintln!("lock lost ({reason}); stopping"),
/// }
/// guard.release().await;
/// # Ok(())
/// # }
/// # async fn do_the_work() {}
/// ```
///
/// See the [crate documentation](crate) for sizing, health, deadlines and operations.
#[derive(Clone)]
pub struct PostgresLockManager {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) holder_id: Option<String>,
    pub(crate) key_visibility: KeyVisibility,
    /// The key derivation, and the ids of recently used keys.
    pub(crate) lock_ids: LockIds,
    pub(crate) settings: Settings,
    /// The lease in force, or why the one asked for cannot hold.
    pub(crate) lease: Result<Option<Lease>, LeaseError>,
    /// The lease's server timers as the set-up binds them.
    pub(crate) server_timers: Option<[String; 5]>,
    /// `locks:<holder id>`, set on every connection the manager uses when it has a
    /// holder id (else the connection's own `application_name` is left alone).
    pub(crate) application_name: Option<String>,
    held: Mutex<Book>,
    /// What is known of the pool's idle connections (set up, prepared statements).
    pub(crate) connections: Arc<Connections>,
    pub(crate) next_token: AtomicU64,
    pub(crate) monitor_running: AtomicBool,
    pub(crate) lost: LostCounts,
    /// The shared connections, when multiplexing is on.
    pub(crate) multiplexer: Option<Multiplexer>,
    /// The instruments (the bookkeeping holds them too, for the locks-held count).
    pub(crate) metrics: Arc<Metrics>,
}

impl PostgresLockManager {
    /// A manager over `pool` with no holder id, keys shown, derivation
    /// [`KeyDerivation::CURRENT`] and the default health settings. Does no I/O.
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
            settings: Settings::DEFAULT,
            meter: None,
        }
    }

    /// The label copied into every [`LockInfo`](locks_port::LockInfo) this manager
    /// hands out, and published as `application_name = 'locks:<holder id>'`.
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
    ///
    /// ```
    /// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 1)?;
    /// let locks = locks_postgres::PostgresLockManager::new(pool);
    /// assert_eq!(locks.lock_id("cutover:tenant-123"), 7696161359070260854);
    /// # Ok::<(), locks_postgres::PoolConfigError>(())
    /// ```
    #[must_use]
    pub fn lock_id(&self, key: &str) -> i64 {
        self.inner.lock_ids.lock_id(key)
    }

    /// Transaction-scoped locks keyed as this manager keys its session locks (same
    /// derivation, same key visibility), for use inside your own transactions.
    ///
    /// ```
    /// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 1)?;
    /// let locks = locks_postgres::PostgresLockManager::new(pool);
    /// let in_transactions = locks.transaction_locks();
    /// assert_eq!(in_transactions.lock_id("k"), locks.lock_id("k"));
    /// # Ok::<(), locks_postgres::PoolConfigError>(())
    /// ```
    #[must_use]
    pub fn transaction_locks(&self) -> crate::TransactionLocks {
        crate::TransactionLocks::new()
            .key_derivation(self.inner.lock_ids.derivation())
            .key_visibility(self.inner.key_visibility)
    }

    /// The lease in force and its bounds (`None` when built with `lease(None)`, or
    /// when the lease asked for cannot hold: then every acquisition fails and says why).
    #[must_use]
    pub fn lease(&self) -> Option<Lease> {
        self.inner.lease.as_ref().ok().copied().flatten()
    }

    /// How many locks this manager has lost since it was built, by reason: the figure
    /// to alert on (also counted in the `eventsource.lock.lost` span's
    /// `lock.lost_reason` attribute). Releases through the manager are not counted.
    #[must_use]
    pub fn lost_lock_counts(&self) -> crate::LostLockCounts {
        self.inner.lost.snapshot()
    }
}

impl PostgresLockManagerBuilder {
    /// Builds the manager, or says why its [`lease`](Self::lease) cannot hold with the
    /// other settings. Does no I/O.
    ///
    /// # Errors
    /// A [`LeaseError`] naming the settings that break the lease's order.
    pub fn try_build(self) -> Result<PostgresLockManager, LeaseError> {
        let manager = self.build();
        match &manager.inner.lease {
            Ok(_) => Ok(manager),
            Err(error) => Err(error.clone()),
        }
    }

    /// Builds the manager. Does no I/O. A [`lease`](Self::lease) that cannot hold makes
    /// every acquisition fail with a
    /// [`Configuration`](locks_port::AcquisitionErrorKind::Configuration) error that says
    /// why; [`try_build`](Self::try_build) reports it at once.
    #[must_use]
    pub fn build(self) -> PostgresLockManager {
        let (settings, lease) = self.settings.with_lease();
        let server_timers = match &lease {
            Ok(Some(lease)) => Some(lease.server.as_settings()),
            _ => None,
        };
        let application_name = self.holder_id.as_deref().map(published_holder_id);
        let connections = Arc::new(Connections::new(self.pool.status().max_size));
        let metrics = Arc::new(Metrics::new(
            settings.metrics,
            self.meter.as_ref(),
            settings.metrics_lock_id,
        ));
        PostgresLockManager {
            inner: Arc::new(Inner {
                pool: self.pool,
                holder_id: self.holder_id,
                key_visibility: self.key_visibility,
                lock_ids: LockIds::new(self.derivation),
                settings,
                lease,
                server_timers,
                application_name,
                held: Mutex::new(Book::new(Arc::clone(&metrics))),
                connections,
                next_token: AtomicU64::new(1),
                monitor_running: AtomicBool::new(false),
                lost: LostCounts::default(),
                multiplexer: Multiplexer::new(
                    settings.locks_per_connection,
                    settings.answer_timeout,
                ),
                metrics,
            }),
        }
    }
}

impl fmt::Debug for PostgresLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockManager")
            .field("holder_id", &self.inner.holder_id)
            .field("key_visibility", &self.inner.key_visibility)
            .field("derivation", &self.inner.lock_ids.derivation())
            .field("settings", &self.inner.settings)
            .field("held_lock_count", &self.inner.held().len())
            .field("pool", &self.inner.pool.status())
            .finish()
    }
}

impl Inner {
    pub(crate) fn held(&self) -> MutexGuard<'_, Book> {
        // The map stays consistent even if a holder panicked: every change is one call.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key as spans and events may show it.
    pub(crate) fn shown<'k>(&self, key: &'k str) -> Option<&'k str> {
        match self.key_visibility {
            KeyVisibility::Shown => Some(key),
            KeyVisibility::Hidden => None,
        }
    }
}

impl DistributedLock for PostgresLockManager {
    type Guard = PostgresLockGuard;

    /// Takes the lock, waiting in the server's queue (or polling, if asked).
    ///
    /// First one `pg_try_advisory_lock` (`_shared` for a shared lock); if the lock is
    /// busy, the wait is one `pg_advisory_lock` (under a statement-local
    /// `lock_timeout` when there is a timeout): the lock passes to the first waiter the
    /// moment it is released. A bounded call returns within its timeout plus 2 s
    /// whatever the server does: waiting for a pool slot, opening a connection and
    /// every answer count inside it, and the 2 s are only ever spent waiting for the
    /// answer of a live session (which decides whether the lock was granted): a pool
    /// slot or a new connection that does not come in time fails at the timeout. After a timed-out wait the session is checked
    /// (the server can grant the lock as the timeout fires) and any such grant is
    /// undone before the connection goes back to the pool.
    ///
    /// # Errors
    /// [`LockAcquisitionError`] with kind `Timeout` (lock busy), `PoolUnavailable`
    /// (no pool slot in time), `Unreachable`, `Configuration`, `ConnectionLost`,
    /// `Deadlock`, `Cancelled` or `Backend`; database failures have the reason
    /// `Database error: <the server's message> (<SQLSTATE>)` and the driver's error as
    /// source.
    ///
    /// # Cancel safety
    /// Cancel safe. Dropped while waiting for a connection: nothing was taken. Dropped
    /// while the server is waiting for the lock: the connection is detached from the
    /// pool, a cancel request ends the server-side wait, and the connection is closed,
    /// so the lock can never be granted to a pooled connection later. With
    /// [`multiplex`](PostgresLockManagerBuilder::multiplex), dropped during its try on a
    /// shared connection: that connection stays (its other locks with it) and a task
    /// undoes the lock there if the try took it.
    async fn acquire(
        &self,
        key: &str,
        options: impl Into<AcquireOptions> + Send,
    ) -> Result<PostgresLockGuard, LockAcquisitionError> {
        let options = options.into();
        let inner = &self.inner;
        let (lock_id, shared_key) = inner.lock_ids.lookup(key);
        let span = manager_acquire_span(
            inner.settings.span_level,
            inner.shown(key),
            lock_id,
            &options,
        );
        let started = started(&span);
        let began = inner.metrics.started();
        // Pinned where it is made and awaited through the pin: the acquisition's
        // future is large, and wrapping it by value would copy it twice per call.
        let acquiring = std::pin::pin!(inner.acquire_grant(key, lock_id, options));
        let attempt = acquiring.instrument(span.clone()).await;
        let attempt = match attempt {
            Ok(grant) => {
                inner
                    .register_grant(shared_key, lock_id, options.mode(), grant, &span)
                    .await
            }
            Err(error) => Err(error),
        };
        finish_acquire_span(&span, started, attempt.as_ref().map(|_| true));
        let outcome = attempt.as_ref().map(|_| true);
        inner
            .metrics
            .acquisition(options.mode(), lock_id, began, outcome);
        attempt
    }

    /// One `pg_try_advisory_lock` (`_shared` in [`LockMode::Shared`]); `Ok(None)` when
    /// the lock is held elsewhere.
    ///
    /// It never waits for the lock, and not for a pool slot either — when every
    /// connection is in use it fails at once with kind `PoolUnavailable`. Opening a
    /// new connection is bounded by the connect timeout (5 s by default) and the
    /// statement's answer by the answer timeout (5 s by default).
    ///
    /// # Errors
    /// A database failure as [`LockAcquisitionError`] (reason `Database error: …`,
    /// the driver's error as source) — never contention.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    async fn try_acquire_with(
        &self,
        key: &str,
        mode: LockMode,
    ) -> Result<Option<PostgresLockGuard>, LockAcquisitionError> {
        let inner = &self.inner;
        let (lock_id, shared_key) = inner.lock_ids.lookup(key);
        let options = AcquireOptions::new().with_mode(mode);
        let span = manager_acquire_span(
            inner.settings.span_level,
            inner.shown(key),
            lock_id,
            &options.with_timeout(Duration::ZERO),
        );
        let started = started(&span);
        let began = inner.metrics.started();
        let trying = std::pin::pin!(inner.try_grant(key, lock_id, mode));
        let attempt = trying.instrument(span.clone()).await;
        let attempt = match attempt {
            Ok(Some(grant)) => inner
                .register_grant(shared_key, lock_id, mode, grant, &span)
                .await
                .map(Some),
            Ok(None) => Ok(None),
            Err(error) => Err(error),
        };
        finish_acquire_span(&span, started, attempt.as_ref().map(Option::is_some));
        let outcome = attempt.as_ref().map(Option::is_some);
        inner.metrics.acquisition(mode, lock_id, began, outcome);
        attempt
    }

    /// Releases this manager's lock on `key`. A guard still holding it is told
    /// ([`LostReason::Released`](locks_port::LostReason::Released)).
    ///
    /// # Errors
    /// [`LockNotHeldError`] only. A failing unlock is logged at WARNING and the
    /// session is closed, which frees the lock on the server.
    ///
    /// # Cancel safety
    /// The entry leaves the bookkeeping before the first await; if the future is
    /// dropped, the session is closed instead of unlocked (a shared connection of
    /// [`multiplex`](PostgresLockManagerBuilder::multiplex) instead gets the unlock from
    /// a task, so its other locks stay).
    async fn release(&self, key: &str) -> Result<(), LockNotHeldError> {
        let taken = self
            .inner
            .take_all_of(key, self.inner.lock_ids.lock_id(key));
        if taken.is_empty() {
            return Err(LockNotHeldError::new(key));
        }
        for held in taken {
            self.inner.unlock(held).await;
        }
        Ok(())
    }

    fn is_held(&self, key: &str) -> bool {
        let lock_id = self.inner.lock_ids.lock_id(key);
        self.inner.held().contains(key, lock_id)
    }
}

impl LockRegistry for PostgresLockManager {
    /// Releases every lock this manager holds; returns how many. Every guard still in
    /// use is told ([`LostReason::Released`](locks_port::LostReason::Released)), so
    /// tasks inside their critical sections learn that a shutdown took their lock.
    ///
    /// # Cancel safety
    /// All entries leave the bookkeeping before the first await; if the future is
    /// dropped, the sessions not yet unlocked are closed, which frees their locks (on a
    /// shared connection not yet freed, a task unlocks them instead).
    async fn release_all(&self) -> usize {
        let drained = self.inner.take_all();
        let count = drained.len();
        let drained = self.inner.unlock_whole_connections(drained).await;
        for held in drained {
            self.inner.unlock(held).await;
        }
        count
    }

    fn held_lock_count(&self) -> usize {
        self.inner.held().len()
    }
}
