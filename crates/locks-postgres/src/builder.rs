//! The manager's builder: it gathers the settings (see `settings.rs`) and builds the
//! manager.

use std::time::Duration;

use crate::pool::Pool;
use locks_port::KeyDerivation;

use crate::settings::{KeyVisibility, Settings};

/// Builds a [`PostgresLockManager`](crate::PostgresLockManager) with options.
///
/// ```
/// use std::time::Duration;
/// use locks_postgres::PostgresLockManager;
///
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 8)?;
/// let locks = PostgresLockManager::builder(pool)
///     .holder_id("billing-7f3c")
///     .keepalive(Some(Duration::from_secs(5)))
///     .answer_timeout(Duration::from_secs(3))
///     .build();
/// assert_eq!(locks.holder_id(), Some("billing-7f3c"));
/// # Ok::<(), locks_postgres::PoolConfigError>(())
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct PostgresLockManagerBuilder {
    pub(crate) pool: Pool,
    pub(crate) holder_id: Option<String>,
    pub(crate) key_visibility: KeyVisibility,
    pub(crate) derivation: KeyDerivation,
    pub(crate) settings: Settings,
    /// The meter of the manager's instruments (`None`: the global provider's).
    pub(crate) meter: Option<opentelemetry::metrics::Meter>,
    /// The pool's cancel path, when set by [`tls`](Self::tls) (else found from the pool).
    pub(crate) canceller: Option<crate::pool::connect::Canceller>,
}

impl PostgresLockManagerBuilder {
    /// A label for this process or instance, copied into
    /// [`LockInfo::holder_id`](locks_port::LockInfo::holder_id) and published on the
    /// lock connections as `application_name = 'locks:<holder id>'` (an id the 63 bytes
    /// of the server's name cannot carry as it is: its start and a hash of it, see
    /// [`holder_application_name`](crate::holder_application_name)), so
    /// `pg_stat_activity` and [`lock_holders`](crate::lock_holders) show who holds what.
    /// Without a holder id the connections' own `application_name` is left alone. It
    /// never reaches SQL text: it is bound as a parameter.
    pub fn holder_id(mut self, holder_id: impl Into<String>) -> Self {
        self.holder_id = Some(holder_id.into());
        self
    }

    /// Whether keys appear in spans and events (see [`KeyVisibility`]).
    pub fn key_visibility(mut self, key_visibility: KeyVisibility) -> Self {
        self.key_visibility = key_visibility;
        self
    }

    /// The level of the `eventsource.lock.acquire` and `eventsource.lock.release`
    /// spans: DEBUG by default, so a subscriber filtering at INFO (the usual setting
    /// in production) records none and they cost nothing; INFO puts every lock in
    /// your traces. An OpenTelemetry pipeline that records them spends about as much
    /// on the two spans of a lock+unlock cycle as the cycle itself costs the client
    /// (see `docs/benchmarks.md`). Failures are WARNING events and lost locks
    /// `eventsource.lock.lost` spans at INFO with an ERROR status, whatever this level.
    ///
    /// ```
    /// use locks_postgres::PostgresLockManager;
    ///
    /// let pool = locks_postgres::plain_pool("postgres://app@db/app", 8)?;
    /// let locks = PostgresLockManager::builder(pool)
    ///     .span_level(tracing::Level::INFO)
    ///     .build();
    /// # drop(locks);
    /// # Ok::<(), locks_postgres::PoolConfigError>(())
    /// ```
    pub fn span_level(mut self, level: tracing::Level) -> Self {
        self.settings.span_level = level;
        self
    }

    /// The meter the manager's instruments are made on (see the crate's *Metrics*
    /// section). Without one, they are made on the global meter provider as it is when
    /// the manager is built (scope `locks-postgres`): install the provider first, or
    /// none is made (as with [`metrics(false)`](Self::metrics)).
    ///
    /// ```
    /// use locks_postgres::PostgresLockManager;
    /// use locks_postgres::opentelemetry::{InstrumentationScope, global};
    ///
    /// let meter = global::meter_with_scope(InstrumentationScope::builder("billing").build());
    /// let pool = locks_postgres::plain_pool("postgres://app@db/app", 8)?;
    /// let locks = PostgresLockManager::builder(pool).meter(meter).build();
    /// # drop(locks);
    /// # Ok::<(), locks_postgres::PoolConfigError>(())
    /// ```
    pub fn meter(mut self, meter: opentelemetry::metrics::Meter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// Whether the manager records metrics at all (default on). Off, no instrument is
    /// made and the lock cycle reads no clock for them; so too when it is on with no
    /// [`meter`](Self::meter) given and no meter provider installed when the manager is
    /// built (the global provider is then OpenTelemetry's no-op one).
    pub fn metrics(mut self, on: bool) -> Self {
        self.settings.metrics = on;
        self
    }

    /// Adds the lock id (`lock.id`) to the acquisition and loss metrics (off by default).
    /// Each lock id becomes a series of its own: turn it on only where the keys are few.
    /// Key text is never an attribute.
    pub fn metrics_lock_id(mut self, on: bool) -> Self {
        self.settings.metrics_lock_id = on;
        self
    }

    /// The key derivation. Every process contending for the same keys must use the
    /// same one.
    pub fn key_derivation(mut self, derivation: KeyDerivation) -> Self {
        self.derivation = derivation;
        self
    }

    /// How often an idle held connection is asked `SELECT true`, to notice a hung
    /// server or a silent network cut (default 10 s; `None` turns keepalives off, and
    /// then only ended connections are noticed). A keepalive that gets no answer
    /// within [`answer_timeout`](Self::answer_timeout) loses the lock with
    /// [`LostReason::KeepaliveFailed`](locks_port::LostReason::KeepaliveFailed). Each
    /// keepalive is one instant statement per held lock: it never shows as a slow
    /// query, and it keeps an `idle_session_timeout` proxy from closing the session.
    ///
    /// With a [`lease`](Self::lease) (the default) and no explicit cadence, the cadence
    /// is a sixth of the lease, at most 10 s. `None` without an explicit lease turns the
    /// default lease off too.
    pub fn keepalive(mut self, cadence: Option<Duration>) -> Self {
        self.settings.keepalive = cadence;
        self.settings.keepalive_set = true;
        self
    }

    /// How often the manager checks, locally and without I/O, whether a held lock's
    /// connection has ended (terminated backend, server restart, reset socket): the
    /// bound on noticing those losses (default 200 ms; at least 10 ms).
    pub fn health_check_interval(mut self, interval: Duration) -> Self {
        self.settings.health_check_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// How long a quick statement may wait for the server's answer: the one
    /// `pg_try_advisory_lock` of `try_acquire` (and the first try of an unbounded
    /// `acquire`), unlocks and keepalives (default 5 s). On expiry the connection is
    /// closed, which frees anything it held.
    ///
    /// With a [`lease`](Self::lease) (the default) and no explicit answer timeout, it is
    /// a twelfth of the lease, at most 5 s.
    pub fn answer_timeout(mut self, timeout: Duration) -> Self {
        self.settings.answer_timeout = timeout;
        self.settings.answer_timeout_set = true;
        self
    }

    /// Patience with a stalled session (off by default): a keepalive that gets no
    /// answer within the [`answer_timeout`](Self::answer_timeout) does not lose the lock
    /// yet while the server shows the session's backend alive. The manager asks, over
    /// another connection of its pool, whether `pg_stat_activity` still has the
    /// session's backend (its pid and start, read once per connection by the set-up:
    /// nothing more per lock), and again every keepalive cadence; each look is bounded by
    /// the answer timeout. While the backend is there its session's locks are held (a
    /// session-level advisory lock ends only with its session, or by a statement on it,
    /// and the only statement in flight there is the keepalive), so nobody else can be
    /// granted them. The answer then arriving is a keepalive answered as ever. The lock
    /// is lost ([`KeepaliveFailed`](locks_port::LostReason::KeepaliveFailed)) when the
    /// look fails (no pool connection free within its bound, the server unreachable, no
    /// answer) or when `patience` has passed beyond the answer timeout; lost
    /// ([`ConnectionClosed`](locks_port::LostReason::ConnectionClosed)) when the server
    /// says the backend is gone. A keepalive that errors is lost at once, as without
    /// patience: patience applies to silence only.
    ///
    /// What it is for: a backend that stops answering for a while though its session
    /// lives, a `SIGSTOP`ped backend (a chaos test, a debugger), a server too busy to
    /// answer within the answer timeout. Without patience such a lock is declared lost,
    /// its connection closed, and the lock stays taken by the stalled backend until it
    /// runs again: the holder gives up what nobody else can take. What it costs: a host
    /// cut off from the server cannot have its backend confirmed, so its loss is told
    /// once a look fails (within another answer timeout), at worst `patience` later
    /// than without patience, and
    /// [`Lease::holder_told_within`](crate::Lease::holder_told_within) grows by
    /// `patience`. The server timers of the [`lease`](Self::lease) are derived from that
    /// larger bound (the margin stays whole), and a lease it no longer fits is refused
    /// with a message that names patience. A release or a downgrade waits for the
    /// keepalive in flight, up to the answer timeout plus `patience`.
    ///
    /// `Duration::ZERO` turns it off.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_postgres::PostgresLockManager;
    ///
    /// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 8)?;
    /// let locks = PostgresLockManager::builder(pool)
    ///     .stall_patience(Duration::from_millis(2500))
    ///     .try_build()?;
    /// let lease = locks.lease().unwrap(); // keepalive 10 s + answer 5 s + 2.5 s + 2 × 200 ms
    /// assert_eq!(lease.holder_told_within, Duration::from_millis(17_900));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stall_patience(mut self, patience: Duration) -> Self {
        self.settings.stall_patience = (!patience.is_zero()).then_some(patience);
        self
    }

    /// The lease (default 60 s): if the holder's host vanishes without closing its
    /// sockets (power loss, a frozen VM, a cut network), the server frees its locks
    /// within this, and the holder's [`lost`](locks_port::LockGuard::lost) signal fires
    /// at least the [`lease_margin`](Self::lease_margin) before the server can free
    /// them. A waiter whose host vanished leaves the server's queue once the server
    /// finds its socket dead: within [`Lease::server_frees_within`](crate::Lease::server_frees_within) plus one
    /// `client_connection_check_interval` of its last traffic (inside the lease for the
    /// derived settings); one the server granted before noticing frees the lock within
    /// [`Lease::server_frees_after`](crate::Lease::server_frees_after) of the grant.
    ///
    /// From it the manager derives the keepalive cadence and the answer timeout (unless
    /// set explicitly) and the server's per-session TCP timers (`tcp_keepalives_idle`,
    /// `tcp_keepalives_interval`, `tcp_keepalives_count`, `tcp_user_timeout`,
    /// `client_connection_check_interval`), set in each connection's set-up round trip:
    /// nothing more per lock. See [`Lease`](crate::Lease) for the bounds and
    /// [`PostgresLockManager::lease`](crate::PostgresLockManager::lease) for the ones in
    /// force. `None` leaves the server's timers alone (its defaults keep a dead
    /// holder's lock for about 2 h 11 min on Linux).
    ///
    /// [`keepalive(None)`](Self::keepalive) without an explicit lease turns the default
    /// lease off (nothing would tell a cut-off holder). A lease that cannot hold with the
    /// other settings (keepalives off, or a keepalive, answer timeout or margin too long
    /// for it) is refused: by
    /// [`try_build`](Self::try_build) at once, and by [`build`](Self::build) on every
    /// acquisition, with a [`Configuration`](locks_port::AcquisitionErrorKind::Configuration)
    /// error that says why. A stopped holder (`SIGSTOP`, a blocked runtime) is not
    /// covered by default: the server sees its host answer. Turn
    /// [`expire_stopped_holders`](Self::expire_stopped_holders) on for that, and guard
    /// writes with fencing tokens (a stopped holder that wakes is told only then).
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_postgres::PostgresLockManager;
    ///
    /// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 8)?;
    /// let locks = PostgresLockManager::builder(pool)
    ///     .lease(Some(Duration::from_secs(15)))
    ///     .try_build()?;
    /// let lease = locks.lease().unwrap();
    /// assert!(lease.server_frees_within <= Duration::from_secs(15));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lease(mut self, lease: Option<Duration>) -> Self {
        self.settings.lease = lease;
        self.settings.lease_set = true;
        self
    }

    /// How long before the server can free a silent holder's locks its lost signal
    /// fires, at least (default 5 s). See [`lease`](Self::lease).
    pub fn lease_margin(mut self, margin: Duration) -> Self {
        self.settings.lease_margin = margin;
        self
    }

    /// Frees the locks of a holder whose process stopped within the [`lease`](Self::lease)
    /// too (default off; PostgreSQL 14+). A process stopped with `SIGSTOP` (or `Ctrl-Z`), frozen by a
    /// debugger, or whose runtime is blocked sends no keepalives, but its kernel still
    /// answers TCP, so the lease's TCP timers never end its sessions: its locks stay held
    /// for as long as it stays stopped. With this on, each lock session also carries
    /// `idle_session_timeout` = [`Lease::server_frees_after`](crate::Lease::server_frees_after):
    /// the server ends a session that sent nothing for that long and frees its locks, within
    /// the lease of the holder's last keepalive
    /// ([`ServerTimers::idle_session_timeout`](crate::ServerTimers::idle_session_timeout)).
    ///
    /// What it costs and what it does not cover:
    /// - A live holder is never ended: its keepalives come every
    ///   [`keepalive`](Self::keepalive) cadence, at least the margin sooner. But a runtime
    ///   blocked for longer than the bound loses its locks (told with
    ///   [`LostReason::ConnectionClosed`](locks_port::LostReason::ConnectionClosed) once
    ///   it runs again); a stopped holder that wakes may act before it is told, so
    ///   guard its writes with a fencing token, as for any lost lock.
    /// - The manager closes its idle pooled connections before the server would (each one
    ///   not checked out for half the bound, looked at every quarter of it for the
    ///   manager's life), so a checkout never takes a session the server is ending. A connection
    ///   that was checked out longer than that is closed at the next look after it comes
    ///   back, and the next acquisition opens a new one.
    /// - A polling acquisition ([`AcquireOptions::retry_interval`](locks_port::AcquireOptions))
    ///   tries at least every half bound, so its session is never idle for the bound.
    /// - Transaction-scoped locks are not covered (their session is in a transaction, which
    ///   `idle_session_timeout` does not count).
    /// - It needs a lease (refused with a [`Configuration`](locks_port::AcquisitionErrorKind::Configuration)
    ///   error without one) and PostgreSQL 14 or later: on PostgreSQL 13 every acquisition
    ///   fails with the server's own `unrecognized configuration parameter
    ///   "idle_session_timeout"`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_postgres::PostgresLockManager;
    ///
    /// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 8)?;
    /// let locks = PostgresLockManager::builder(pool)
    ///     .lease(Some(Duration::from_secs(30)))
    ///     .expire_stopped_holders(true)
    ///     .try_build()?;
    /// let lease = locks.lease().unwrap();
    /// assert_eq!(lease.server.idle_session_timeout, Some(lease.server_frees_after));
    /// assert!(lease.server_frees_after < Duration::from_secs(30));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expire_stopped_holders(mut self, on: bool) -> Self {
        self.settings.expire_stopped_holders = on;
        self
    }

    /// The TLS connector the pool's connections are opened with, for a pool built by hand
    /// (not by [`plain_pool`](crate::plain_pool) or [`tls_pool`](crate::tls_pool), which
    /// the manager recognises). A dropped wait is cancelled on the server with a cancel
    /// request, which opens a connection of its own: where the server takes TLS
    /// connections only (`sslmode=require`), it needs the pool's connector, and without
    /// it the wait stays in the server's queue until the server notices the closed
    /// socket (and may be granted meanwhile).
    ///
    /// ```
    /// use locks_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
    /// use locks_postgres::tokio_postgres::NoTls; // your TLS connector here
    ///
    /// let config = "postgres://app@localhost/app".parse()?;
    /// let manager = Manager::from_connect(
    ///     config,
    ///     locks_postgres::LockConnect::new(NoTls),
    ///     ManagerConfig { recycling_method: RecyclingMethod::Fast },
    /// );
    /// let pool = Pool::builder(manager).max_size(8).build()?;
    /// let locks = locks_postgres::PostgresLockManager::builder(pool).tls(NoTls).build();
    /// # drop(locks);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tls<T>(mut self, tls: T) -> Self
    where
        T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>
            + Clone
            + Sync
            + Send
            + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
    {
        self.canceller = Some(crate::pool::connect::Canceller::with(tls));
        self
    }

    /// How long opening a connection may take for calls without a deadline of their
    /// own: `try_acquire` and an unbounded `acquire` (default 5 s). A bounded
    /// `acquire` opens connections within its own deadline.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Hands out fencing tokens: after each grant the manager increments the key's
    /// counter in the token table and puts the new value in
    /// [`LockInfo::fencing_token`](locks_port::LockInfo::fencing_token). One more
    /// round trip per acquisition. The table must exist: create it once with
    /// [`install_fencing`](crate::install_fencing). Off by default; the lock itself
    /// works exactly the same either way.
    pub fn fencing(mut self, on: bool) -> Self {
        self.settings.fencing = on;
        self
    }

    /// Takes the unlock off the caller's path: a guard's
    /// [`release`](locks_port::LockGuard::release) returns as soon as the
    /// `pg_advisory_unlock` is handed to the connection (reporting
    /// [`ReleaseOutcome::InBackground`](locks_port::ReleaseOutcome::InBackground)), and
    /// a task reads the answer; the connection goes back to the pool only when the
    /// answer says the lock is gone, else it is closed. Saves the caller one round trip
    /// per cycle (see `docs/benchmarks.md`). Exclusion is unchanged: the lock is free
    /// once the server reads the unlock, and statements on one connection run in order.
    /// What changes: a key is free a moment after `release` returns, not at once, and a
    /// failed unlock is only logged. Off by default.
    ///
    /// An acquisition of a key whose unlock this manager still has in flight waits in
    /// the server's queue at once instead of trying first (a try on another connection
    /// can reach the server before the unlock and find the key busy, which cost a
    /// second round trip): it is granted the moment the unlock lands. Such a wait is
    /// bounded as any wait in the queue is (by the call's timeout, if any).
    pub fn release_in_background(mut self, on: bool) -> Self {
        self.settings.release_in_background = on;
        self
    }

    /// Lets held locks share connections, up to `locks_per_connection` locks on each
    /// (0 and 1 mean one connection per held lock: the default). Off by default.
    ///
    /// An acquisition first makes one `pg_try_advisory_lock` on a connection that
    /// already holds other locks of this manager and has room; it never waits there, so
    /// a wait cannot hold up a release of another lock on that connection. A connection
    /// never takes one key twice (advisory locks are re-entrant per session): a second
    /// acquisition of a key this manager holds goes to another connection, and waits
    /// there as any contender does. When the try finds the lock busy, the acquisition
    /// waits on a connection of its own, as without multiplexing; once granted, that
    /// connection takes further tries too. A connection goes back to the pool when it
    /// holds nothing; `release_all` frees a connection whose every lock it releases
    /// with one `pg_advisory_unlock_all()`.
    ///
    /// Health stays per lock: a connection that ends loses exactly the locks it held,
    /// each guard told and counted. The cap bounds how many locks one lost connection
    /// takes with it. `acquire_many` keeps its own connection per group.
    ///
    /// ```
    /// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 100)?;
    /// // Up to 10 000 held locks on at most 100 connections.
    /// let locks = locks_postgres::PostgresLockManager::builder(pool).multiplex(100).build();
    /// # drop(locks);
    /// # Ok::<(), locks_postgres::PoolConfigError>(())
    /// ```
    pub fn multiplex(mut self, locks_per_connection: usize) -> Self {
        self.settings.locks_per_connection = locks_per_connection.max(1);
        self
    }
}
