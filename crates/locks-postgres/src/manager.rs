//! The PostgreSQL lock manager: its public type, its whole public API (inherent methods
//! and the port's traits) and nothing else. Each method is the API's one place: its
//! documentation, then a call into the room that does the work (as tokio-postgres keeps
//! `Client` in one file and its operations in their own modules). The state the clones
//! share is [`Inner`] ([`inner`](crate::inner)).
//!
//! The rooms stand in floors (`docs/architecture.md`, "Floors"; `tests/modules.rs`
//! fails on an import from a higher floor), lowest first:
//!
//! - the ground: [`lease`](crate::lease), [`limit`](crate::limit) (a call's deadline
//!   and each step's limit), [`watchdog`](crate::watchdog) (the thread that holds
//!   statements to them), [`errors`](crate::errors), [`telemetry`](crate::telemetry),
//!   [`settings`](crate::settings) (the timings, key visibility),
//!   [`metrics`](crate::metrics), [`lock_ids`](crate::lock_ids),
//!   [`query`](crate::query) (a prepared statement, the set-up),
//!   [`pool`](crate::pool) (the one room that names the pool's library, with
//!   [`connect`](crate::pool::connect), its connector and cancel path),
//!   [`connection`](crate::connection) (a checked-out connection, its set-up and
//!   prepared statements), [`sql`](crate::sql) (the lock statements),
//!   [`slot`](crate::slot) (a held session's slot);
//! - the book and the monitor: [`multiplex`](crate::multiplex) (the shared
//!   connections), [`bookkeeping`](crate::bookkeeping) (what is held),
//!   [`health`](crate::health) (the monitor's state), [`inner`](crate::inner),
//!   [`monitor`](crate::monitor) (the lost-lock monitor and keepalives);
//! - the strategies: [`release`](crate::release) (the unlock),
//!   [`mode_change`](crate::mode_change) (the downgrade, the try-upgrade),
//!   [`guard`](crate::guard), [`xact`](crate::xact) (transaction-scoped locks),
//!   [`fencing`](crate::fencing), [`grant`](crate::grant) (a grant booked),
//!   [`checkout`](crate::checkout), [`acquire`](crate::acquire) (try, the wait in the
//!   server's queue, a shared connection, a group's tries), [`many`](crate::many),
//!   [`inspect`](crate::inspect), [`semaphore`](crate::semaphore),
//!   [`lock_table`](crate::lock_table), [`board`](crate::board);
//! - the API: [`builder`](crate::builder), and this file.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use locks_port::{
    AcquireMany, AcquireOptions, DistributedLock, KeyDerivation, LeaderBoard, LockAcquisitionError,
    LockMode, LockNotHeldError, LockRegistry, PermitHolders, Proclamation, Semaphore,
};
use tracing::Instrument;

use crate::acquire;
use crate::board;
use crate::builder::PostgresLockManagerBuilder;
use crate::guard::PostgresLockGuard;
use crate::health::LostLockCounts;
use crate::inner::Inner;
use crate::inspect;
use crate::inspect::{InspectError, LockHolder};
use crate::lease::{Lease, LeaseError};
use crate::lock_table;
use crate::lock_table::{LockTableGauge, LockTableUsage};
use crate::many;
use crate::many::PostgresLockGroup;
use crate::monitor;
use crate::pool::Pool;
use crate::release;
use crate::semaphore;
use crate::semaphore::PostgresPermit;
use crate::settings::{KeyVisibility, Settings};
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
        self.inner.holder_id().map(String::as_str)
    }

    /// The pool the manager checks connections out of.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        self.inner.pool()
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
            .key_visibility(self.inner.key_visibility())
    }

    /// The lease in force and its bounds (`None` when built with `lease(None)`, or
    /// when the lease asked for cannot hold: then every acquisition fails and says why).
    #[must_use]
    pub fn lease(&self) -> Option<Lease> {
        self.inner.lease().ok().flatten().copied()
    }

    /// How many locks this manager has lost since it was built, by reason: the figure
    /// to alert on (also counted in the `eventsource.lock.lost` span's
    /// `lock.lost_reason` attribute, and in the `eventsource.lock.lost` and
    /// `eventsource.semaphore.permits.lost` metrics). Semaphore permits count too: each
    /// is an advisory lock held on a session of its own. Releases are not counted,
    /// except one that finds the session already ended (the lock was lost while held,
    /// before the monitor saw it).
    #[must_use]
    pub fn lost_lock_counts(&self) -> LostLockCounts {
        monitor::lost_lock_counts(&self.inner)
    }

    /// Who holds `key`'s lock and who waits for it, from the server: holders first, then
    /// waiters in the order the server queued them. Sees every client's locks (session or
    /// transaction scoped, this process's, other processes', `psql`'s) on the database the
    /// pool connects to. Uses one pooled connection for one query.
    ///
    /// What it costs: like [`lock_table_usage`](Self::lock_table_usage) it reads
    /// `pg_locks`, whose copy of the server's whole lock table grows with the locks held
    /// and holds up every other session's lock requests meanwhile (figures in
    /// `docs/capacity.md`). A tool for a person or an incident, not for a loop; on a server
    /// holding 10^5 locks or more, call it at most every few seconds.
    ///
    /// ```no_run
    /// # async fn run(locks: locks_postgres::PostgresLockManager) -> Result<(), Box<dyn std::error::Error>> {
    /// for holder in locks.holders("cutover:tenant-1").await? {
    ///     println!(
    ///         "pid {:?} {:?} granted={} app={:?} holder_id={:?} since {:?}",
    ///         holder.pid, holder.mode, holder.granted, holder.application_name,
    ///         holder.holder_id, holder.waiting_since,
    ///     );
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`InspectError::PoolFull`] when every pool connection stayed in use for the
    /// manager's [`connect_timeout`](crate::PostgresLockManagerBuilder::connect_timeout)
    /// (each held lock keeps one; the message says so in an acquisition's words: `could
    /// not ask who holds advisory locks: no pool connection was free to look with (all 1
    /// in use; each held lock keeps one)`), [`InspectError::Pool`] when no connection
    /// could be opened within it (waiting for a free pool connection and opening one
    /// both count), [`InspectError::Query`] when the server refuses.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holders(&self, key: &str) -> Result<Vec<LockHolder>, InspectError> {
        inspect::holders_of_key(&self.inner, key).await
    }

    /// Every advisory lock on the database the pool connects to, held or waited for, by
    /// anyone: ordered by lock, then holders before waiters in queue order.
    ///
    /// Only lock ids: keys are not recoverable from ids (an id is a hash of its key). To
    /// name them, derive the ids of the keys you know with [`lock_id`](Self::lock_id).
    ///
    /// ```no_run
    /// # async fn run(locks: locks_postgres::PostgresLockManager) -> Result<(), Box<dyn std::error::Error>> {
    /// let id = locks.lock_id("cutover:tenant-1");
    /// for holder in locks.holders_of_all().await? {
    ///     let name = if holder.lock.as_int8() == Some(id) { "cutover:tenant-1" } else { "?" };
    ///     println!("{:?} ({name}): pid {:?} granted={}", holder.lock, holder.pid, holder.granted);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`holders`](Self::holders).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holders_of_all(&self) -> Result<Vec<LockHolder>, InspectError> {
        inspect::holders_of_every_lock(&self.inner).await
    }

    /// How full the server's lock table is: advisory locks held or waited for by anyone,
    /// every non-fast-path entry, and the documented capacity. Records the
    /// `eventsource.server.lock_table.advisory` and `.capacity` gauges (see the metrics
    /// table in the crate docs), so calling it periodically feeds a dashboard. Uses one
    /// pooled connection for one query, within the connect timeout as
    /// [`holders`](Self::holders) does.
    ///
    /// What it costs: it reads `pg_locks`, which copies the server's whole lock table
    /// under every lock partition's lock, so every other session's lock request on the
    /// server waits while it copies; the copy grows with the locks held (tens of
    /// milliseconds at 10^4, about a tenth of a second at 10^5, about a second at 10^6 by
    /// extrapolation: `docs/capacity.md`, "What each observation read costs"). Safe every few
    /// seconds on a small server; poll a [`lock_table_gauge`](Self::lock_table_gauge),
    /// which bounds how often it asks, from a metrics callback.
    ///
    /// ```no_run
    /// # async fn run(locks: locks_postgres::PostgresLockManager) -> Result<(), Box<dyn std::error::Error>> {
    /// let usage = locks.lock_table_usage().await?;
    /// if usage.fraction() > 0.8 {
    ///     eprintln!("{} of {} lock table entries held: raise max_locks_per_transaction",
    ///         usage.advisory, usage.capacity);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`holders`](Self::holders).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn lock_table_usage(&self) -> Result<LockTableUsage, InspectError> {
        lock_table::recorded_usage(&self.inner).await
    }

    /// [`lock_table_usage`](Self::lock_table_usage) for a gauge polled on a schedule:
    /// it asks the server at most once per `every` (and at most once per 100 times its
    /// last read's duration) and answers other calls with the last reading. Poll this,
    /// not `lock_table_usage`, from a metrics callback or a health endpoint: the read
    /// copies the server's whole lock table (see `docs/capacity.md`).
    #[must_use]
    pub fn lock_table_gauge(&self, every: Duration) -> LockTableGauge {
        LockTableGauge::new(Arc::clone(&self.inner), every)
    }

    /// Takes the locks of all `keys`, or none: in one global order (ascending lock id,
    /// keys with the same lock id merged), within one deadline (`options`' timeout), on
    /// one connection (a session can hold many advisory locks). Every process that takes
    /// several keys this way takes them in the same order, so two of them can never
    /// deadlock on each other.
    ///
    /// Uncontended it costs what one key costs: one checkout and one round trip (the
    /// tries of every key go in one statement), and [`PostgresLockGroup::release`] is one
    /// more. A busy key is waited for in the server's queue, holding only the keys
    /// before it in the order (ADR 0019).
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
    pub fn acquire_many<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<PostgresLockGroup, LockAcquisitionError>> + Send {
        let keys = locks_port::owned_keys(keys);
        let options = options.into();
        async move {
            let keys = keys?;
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            many::acquire_many(&self.inner, &keys, options).await
        }
    }

    /// The class of the semaphore `name` (for `pg_locks`: its permits are `(class, slot)`
    /// advisory locks with `objsubid = 2`).
    #[must_use]
    pub fn semaphore_class(&self, name: &str) -> i32 {
        semaphore::class_of(name)
    }
}

impl fmt::Debug for PostgresLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockManager")
            .field("holder_id", &self.inner.holder_id())
            .field("key_visibility", &self.inner.key_visibility())
            .field("derivation", &self.inner.lock_ids().derivation())
            .field("settings", &self.inner.settings())
            .field("held_lock_count", &self.inner.book().len())
            .field("pool", &self.inner.pool().status())
            .finish()
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
    /// [`LockAcquisitionError`] with kind `Timeout` (lock busy; when the holder is this
    /// manager itself, another of its guards, the reason says so and
    /// [`is_held_by_this_manager`](LockAcquisitionError::is_held_by_this_manager) is
    /// true: `Timeout after 0.5s: this manager holds 'job:nightly' itself (exclusive,
    /// holder id "worker-1", since 2026-12-05T08:30:00.250000Z): release that guard
    /// first`), `PoolUnavailable`
    /// (no pool slot in time), `Unreachable`, `Configuration`, `ConnectionLost`,
    /// `Deadlock`, `Cancelled` or `Backend`; database failures have the reason
    /// `Database error: <the server's message> (<SQLSTATE>)` and the driver's error as
    /// source. Without a timeout a key this manager holds is waited for until that
    /// guard is released, for ever if nobody releases it; a debug event
    /// (`the key is busy because this manager holds it itself`) says so when the wait
    /// begins.
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
        let began = inner.metrics().started();
        // Pinned where it is made and awaited through the pin: the acquisition's
        // future is large, and wrapping it by value would copy it twice per call.
        let acquiring = std::pin::pin!(acquire::acquire_grant(inner, key, lock_id, options));
        // No subscriber records the span (the default): no layer of future to enter
        // and exit it on every poll.
        let attempt = if span.is_disabled() {
            acquiring.await
        } else {
            acquiring.instrument(span.clone()).await
        };
        let attempt = match attempt {
            Ok(grant) => {
                acquire::register_grant(inner, shared_key, lock_id, options.mode(), grant, &span)
                    .await
            }
            Err(error) => Err(acquire::said_if_held_here(
                inner,
                key,
                lock_id,
                options.mode(),
                error,
            )),
        };
        finish_acquire_span(&span, started, attempt.as_ref().map(|_| true));
        let outcome = attempt.as_ref().map(|_| true);
        inner
            .metrics()
            .acquisition(options.mode(), lock_id, began, outcome);
        attempt
    }

    /// One `pg_try_advisory_lock` (`_shared` in [`LockMode::Shared`]); `Ok(None)` when
    /// the lock is held elsewhere, or by this manager itself
    /// ([`is_held`](DistributedLock::is_held) tells which; a debug event says so).
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
        let began = inner.metrics().started();
        let trying = std::pin::pin!(acquire::try_grant(inner, key, lock_id, mode));
        let attempt = trying.instrument(span.clone()).await;
        let attempt = match attempt {
            Ok(Some(grant)) => {
                acquire::register_grant(inner, shared_key, lock_id, mode, grant, &span)
                    .await
                    .map(Some)
            }
            Ok(None) => {
                acquire::tell_of_own_hold(inner, key, lock_id, mode, "try_acquire says None");
                Ok(None)
            }
            Err(error) => Err(error),
        };
        finish_acquire_span(&span, started, attempt.as_ref().map(Option::is_some));
        let outcome = attempt.as_ref().map(Option::is_some);
        inner.metrics().acquisition(mode, lock_id, began, outcome);
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
            release::unlock_to_the_end(&self.inner, held).await;
        }
        Ok(())
    }

    fn is_held(&self, key: &str) -> bool {
        let lock_id = self.inner.lock_ids().lock_id(key);
        self.inner.book().contains(key, lock_id)
    }

    /// [`ANNOUNCED_LOSS_NOTICE`] (100 ms) on a pool whose connections announce their end
    /// ([`plain_pool`](crate::plain_pool), [`tls_pool`](crate::tls_pool)); `None` on any
    /// other pool, where only the health check tells a holder (369 ms at worst measured
    /// at the default 200 ms interval, and longer at a longer one).
    fn loss_notice_bound(&self) -> Option<std::time::Duration> {
        crate::pool::connect::announces_end(self.inner.pool()).then_some(ANNOUNCED_LOSS_NOTICE)
    }
}

/// How soon a holder of a lock taken on a pool that announces a connection's end
/// ([`plain_pool`](crate::plain_pool), [`tls_pool`](crate::tls_pool)) is told that its
/// session ended, at worst, as [`DistributedLock::loss_notice_bound`] says it: 100 ms,
/// 3.4 times the worst measured (29 ms over 88 terminated sessions on a loaded 2-core
/// machine; `docs/benchmarks.md`, "How soon a holder is told", `tests/it/told.rs`).
pub const ANNOUNCED_LOSS_NOTICE: std::time::Duration = std::time::Duration::from_millis(100);

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
        release::release_all(&self.inner).await
    }

    fn held_lock_count(&self) -> usize {
        self.inner.book().len()
    }
}

/// For code generic over the manager: the inherent [`PostgresLockManager::acquire_many`].
impl AcquireMany for PostgresLockManager {
    type Locks = PostgresLockGroup;

    fn acquire_many<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<PostgresLockGroup, LockAcquisitionError>> + Send {
        Self::acquire_many(self, keys, options)
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
        semaphore::acquire_permit(&self.inner, name, permits, options).await
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
        semaphore::try_acquire_permit(&self.inner, name, permits).await
    }

    /// Reads `pg_locks` (joined with `pg_stat_activity`), which copies the server's whole
    /// lock table: its cost grows with every lock held on the server (see
    /// `docs/capacity.md`, "What each observation read costs").
    async fn permit_holders(&self, name: &str) -> Result<PermitHolders, LockAcquisitionError> {
        (semaphore::permit_holders(&self.inner, name).await)
            .map_err(|error| error.for_read(format!("who holds the permits of semaphore '{name}'")))
    }

    /// One statement that tries the slot shared and lets it go: one lock-table entry,
    /// never `pg_locks`, so its cost does not grow with the locks held on the server. An
    /// acquisition that tries the slot in the same instant finds it taken and waits for
    /// its next look (1 to 5 ms); a probe never lets two sessions hold a permit.
    async fn permit_held(&self, name: &str, slot: u32) -> Result<bool, LockAcquisitionError> {
        (semaphore::permit_held(&self.inner, name, slot).await).map_err(|error| {
            error.for_read(format!(
                "whether permit {slot} of semaphore '{name}' is held"
            ))
        })
    }
}

/// Terms are rows of [`LEADER_BOARD_TABLE`](crate::LEADER_BOARD_TABLE) (install it with
/// [`install_leader_board`](crate::install_leader_board)),
/// with the manager's holder id as `permit_holders` reports it (as its sessions'
/// `application_name` carries it: a long one's start and a hash,
/// [`holder_application_name`](crate::holder_application_name)) and the server's clock.
/// Each call checks a pooled connection out for one statement, bounded by the answer
/// timeout.
impl LeaderBoard for PostgresLockManager {
    async fn proclaim(
        &self,
        name: &str,
        value: &str,
    ) -> Result<Proclamation, LockAcquisitionError> {
        board::proclaim(&self.inner, name, value).await
    }

    async fn retire(&self, name: &str, term: u64) -> Result<(), LockAcquisitionError> {
        board::retire(&self.inner, name, term).await
    }

    async fn latest(&self, name: &str) -> Result<Option<Proclamation>, LockAcquisitionError> {
        (board::latest(&self.inner, name).await).map_err(|error| {
            error.for_read(format!("the latest term of '{name}' on the leader board"))
        })
    }
}

// The builder's last step lives beside the manager it builds (the builder, a floor
// below, never names the manager).
impl PostgresLockManagerBuilder {
    /// Builds the manager, or says why its [`lease`](Self::lease) cannot hold with the
    /// other settings. Does no I/O.
    ///
    /// # Errors
    /// A [`LeaseError`] naming the settings that break the lease's order.
    pub fn try_build(self) -> Result<PostgresLockManager, LeaseError> {
        let manager = self.build();
        match manager.inner.lease() {
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
        let inner = Arc::new(Inner::new(
            self.pool,
            self.canceller,
            self.holder_id,
            self.key_visibility,
            self.derivation,
            self.settings,
            self.meter.as_ref(),
        ));
        // A lease on stopped holders closes idle pooled connections from the start
        // (outside a runtime, from the first grant).
        if self.settings.expire_stopped_holders {
            inner.ensure_monitor();
        }
        PostgresLockManager { inner }
    }
}
