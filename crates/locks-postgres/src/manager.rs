//! The PostgreSQL lock manager: its public type, the state its clones share
//! ([`Inner`], fields private behind a few methods) and the port's traits on it. The
//! work is in rooms of its own, each with its `impl Inner` block where it needs one:
//!
//! - [`builder`](crate::builder): the builder, its settings, key visibility;
//!   [`lease`](crate::lease): the lease's bounds and server timers;
//! - [`acquire`](crate::acquire): try, the wait in the server's queue, the choice of a
//!   shared connection, and a group's tries; [`checkout`](crate::checkout): the pool
//!   checkout; [`many`](crate::many): `acquire_many` and its guard;
//! - [`limit`](crate::limit): a call's deadline and each step's limit;
//!   [`watchdog`](crate::watchdog): the thread that holds statements to them;
//! - [`connection`](crate::connection): a checked-out connection, its set-up and
//!   prepared statements; [`sql`](crate::sql): every statement;
//! - [`bookkeeping`](crate::bookkeeping): what is held, registering a grant;
//!   [`release`](crate::release): the unlock; [`guard`](crate::guard): the guard;
//! - [`health`](crate::health): the lost-lock monitor and keepalives;
//! - [`multiplex`](crate::multiplex): the shared connections (opt-in);
//!   [`semaphore`](crate::semaphore): counting semaphores; [`leader`](crate::leader):
//!   leader election; [`metrics`](crate::metrics): the OpenTelemetry instruments;
//! - [`fencing`](crate::fencing): fencing tokens; [`xact`](crate::xact):
//!   transaction-scoped locks; [`inspect`](crate::inspect): who holds and waits;
//! - [`errors`](crate::errors): errors in the server's words, and the adapter's own;
//!   [`telemetry`](crate::telemetry): spans and events.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_postgres::Pool;
use locks_port::{
    AcquireOptions, DistributedLock, KeyDerivation, LockAcquisitionError, LockMode,
    LockNotHeldError, LockRegistry,
};
use tracing::Instrument;

use crate::bookkeeping::Book;
use crate::builder::{KeyVisibility, PostgresLockManagerBuilder, Settings, published_holder_id};
use crate::connection::{Connections, SetupValues};
use crate::guard::PostgresLockGuard;
use crate::health::Health;
use crate::lease::{Lease, LeaseError};
use crate::lock_ids::LockIds;
use crate::metrics::Metrics;
use crate::multiplex::Multiplexer;
use crate::telemetry::{finish_acquire_span, manager_acquire_span, started};

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

/// What the manager's clones share. Its fields are private: the rooms of the adapter
/// reach them through the methods below (and add their own `impl Inner` blocks).
pub(crate) struct Inner {
    pool: Pool,
    holder_id: Option<String>,
    key_visibility: KeyVisibility,
    /// The key derivation, and the ids of recently used keys.
    lock_ids: LockIds,
    settings: Settings,
    /// The lease in force, or why the one asked for cannot hold.
    lease: Result<Option<Lease>, LeaseError>,
    /// The lease's server timers as the set-up binds them.
    server_timers: Option<[String; 5]>,
    /// `locks:<holder id>`, set on every connection the manager uses when it has a
    /// holder id (else the connection's own `application_name` is left alone).
    application_name: Option<String>,
    book: Mutex<Book>,
    /// What is known of the pool's idle connections (set up, prepared statements).
    connections: Arc<Connections>,
    /// The number of the next bookkeeping ticket (one per acquisition).
    next_ticket: AtomicU64,
    /// The lost-lock monitor's state and the per-reason counts of lost locks.
    health: Health,
    /// The shared connections, when multiplexing is on.
    multiplexer: Option<Multiplexer>,
    /// The instruments (the book holds them too, for the locks-held count).
    metrics: Arc<Metrics>,
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
            canceller: None,
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
        self.inner.lock_ids().lock_id(key)
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
            .key_derivation(self.inner.lock_ids().derivation())
            .key_visibility(self.inner.key_visibility)
    }

    /// The lease in force and its bounds (`None` when built with `lease(None)`, or
    /// when the lease asked for cannot hold: then every acquisition fails and says why).
    #[must_use]
    pub fn lease(&self) -> Option<Lease> {
        self.inner.lease().ok().flatten().copied()
    }
}

impl fmt::Debug for PostgresLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockManager")
            .field("holder_id", &self.inner.holder_id)
            .field("key_visibility", &self.inner.key_visibility)
            .field("derivation", &self.inner.lock_ids().derivation())
            .field("settings", &self.inner.settings)
            .field("held_lock_count", &self.inner.book().len())
            .field("pool", &self.inner.pool.status())
            .finish()
    }
}

impl Inner {
    /// The shared state of a manager built by `builder`. Does no I/O.
    pub(crate) fn new(builder: PostgresLockManagerBuilder) -> Self {
        let (settings, lease) = builder.settings.with_lease();
        let server_timers = match &lease {
            Ok(Some(lease)) => Some(lease.server.as_settings()),
            _ => None,
        };
        let canceller = builder
            .canceller
            .unwrap_or_else(|| crate::connect::canceller_of(&builder.pool));
        let connections = Arc::new(Connections::new(builder.pool.status().max_size, canceller));
        let metrics = Arc::new(Metrics::new(
            settings.metrics,
            builder.meter.as_ref(),
            settings.metrics_lock_id,
        ));
        Self {
            application_name: builder.holder_id.as_deref().map(published_holder_id),
            pool: builder.pool,
            holder_id: builder.holder_id,
            key_visibility: builder.key_visibility,
            lock_ids: LockIds::new(builder.derivation),
            settings,
            lease,
            server_timers,
            book: Mutex::new(Book::new(Arc::clone(&metrics))),
            connections,
            next_ticket: AtomicU64::new(1),
            health: Health::default(),
            multiplexer: Multiplexer::new(settings.locks_per_connection, settings.answer_timeout),
            metrics,
        }
    }

    /// What the manager holds.
    pub(crate) fn book(&self) -> MutexGuard<'_, Book> {
        // The book stays consistent even if a holder panicked: every change is one call.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(crate) fn holder_id(&self) -> Option<&String> {
        self.holder_id.as_ref()
    }

    pub(crate) fn lock_ids(&self) -> &LockIds {
        &self.lock_ids
    }

    pub(crate) fn connections(&self) -> &Arc<Connections> {
        &self.connections
    }

    /// The manager's instruments.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The shared connections, when multiplexing is on.
    pub(crate) fn multiplexer(&self) -> Option<&Multiplexer> {
        self.multiplexer.as_ref()
    }

    /// The lease in force, or why the one asked for cannot hold.
    pub(crate) fn lease(&self) -> Result<Option<&Lease>, &LeaseError> {
        self.lease.as_ref().map(Option::as_ref)
    }

    /// A new bookkeeping ticket: the number that tells one acquisition's entry from
    /// another's of the same lock id.
    pub(crate) fn next_ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::Relaxed)
    }

    /// The lost-lock monitor's state (see [`crate::health`]).
    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// What the set-up gives each of the manager's sessions.
    pub(crate) fn setup_values(&self) -> SetupValues<'_> {
        SetupValues {
            application_name: self.application_name.as_deref(),
            timers: self.server_timers.as_ref(),
        }
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
        locks_port::check_key(key)?;
        let options = options.into();
        let inner = &self.inner;
        let (lock_id, shared_key) = inner.lock_ids().lookup(key);
        let span = manager_acquire_span(
            inner.settings().span_level,
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
        locks_port::check_key(key)?;
        let inner = &self.inner;
        let (lock_id, shared_key) = inner.lock_ids().lookup(key);
        let options = AcquireOptions::new().with_mode(mode);
        let span = manager_acquire_span(
            inner.settings().span_level,
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
            .take_all_of(key, self.inner.lock_ids().lock_id(key));
        if taken.is_empty() {
            return Err(LockNotHeldError::new(key));
        }
        for held in taken {
            self.inner.unlock(held).await;
        }
        Ok(())
    }

    fn is_held(&self, key: &str) -> bool {
        let lock_id = self.inner.lock_ids().lock_id(key);
        self.inner.book().contains(key, lock_id)
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
        self.inner.release_all().await
    }

    fn held_lock_count(&self) -> usize {
        self.inner.book().len()
    }
}
