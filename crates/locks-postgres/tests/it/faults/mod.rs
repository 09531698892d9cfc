//! Faults on a real server, one file per family: sessions ended or cancelled under a
//! holder or a waiter ([`sessions`]), the server going away ([`server`]), futures
//! dropped mid-flight ([`dropped`]), bounded waits racing releases, an exhausted pool and
//! polling ([`bounded_waits`]), keys and holder ids no SQL should see ([`keys`]), a
//! stalled backend under stall patience ([`stalled`]). Each test checks `pg_locks` from
//! a separate admin connection, because "no lock left behind" is what matters; the
//! fixtures for that are here.
//!
//! Modes: a case marked [`in_both_modes!`] runs once with a plain manager and once
//! multiplexed ([`Mode`]; its test names end `::plain` and `::multiplexed`): every
//! dropped future, ended or cancelled session, server restart, stopped or silent
//! server, bounded wait, keepalive and connection error, since multiplexing changes
//! where tries, waits, releases and keepalives run;
//! single-mode are the cases about key derivation ([`keys`]), fencing tokens (SQL of
//! their own; multiplexed in `multiplex.rs`) and session settings (`idle_session_timeout`,
//! `statement_timeout`: set at checkout, the same for both modes).

/// For each `async fn case(mode: Mode)` named, a module `case` of two tests, `plain`
/// and `multiplexed`, that run it in that [`Mode`]: one body, and a failure names its
/// mode.
macro_rules! in_both_modes {
    ($($case:ident),+ $(,)?) => {$(
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn plain() {
                super::$case($crate::faults::Mode::Plain).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn multiplexed() {
                super::$case($crate::faults::Mode::Multiplexed).await;
            }
        }
    )+};
}

mod bounded_waits;
mod dropped;
mod health;
mod keys;
pub(crate) mod server;
mod sessions;
mod stalled;

use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, LostReason, ReleaseOutcome};
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres;
use locks_postgres::{PostgresLockGuard, PostgresLockManager, PostgresLockManagerBuilder};
use throwaway_pg::ThrowawayPostgres;
pub(crate) use throwaway_pg::testing::connect as admin_at;

use crate::support::{admin, holders, pool, unique_key};

/// The liveness bound of every "eventually" in these tests.
const EVENTUALLY: Duration = Duration::from_secs(5);

/// Polls `check` every 10 ms until it is true; fails after [`EVENTUALLY`].
pub(crate) async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < EVENTUALLY,
            "timed out after {EVENTUALLY:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The backends holding (`granted`) or queued for the advisory lock `lock_id`, by pid.
async fn lock_pids(admin: &tokio_postgres::Client, lock_id: i64, granted: bool) -> Vec<i32> {
    let mut pids: Vec<i32> = throwaway_pg::testing::advisory_lock(admin, lock_id)
        .await
        .into_iter()
        .filter(|row| row.granted == granted)
        .map(|row| row.pid)
        .collect();
    pids.sort_unstable();
    pids
}

/// The backends holding the advisory lock `lock_id`.
pub(crate) async fn holder_pids(admin: &tokio_postgres::Client, lock_id: i64) -> Vec<i32> {
    lock_pids(admin, lock_id, true).await
}

/// The backends queued for the advisory lock `lock_id`.
pub(crate) async fn waiting_pids(admin: &tokio_postgres::Client, lock_id: i64) -> Vec<i32> {
    lock_pids(admin, lock_id, false).await
}

/// A key of one test and its lock id, with an admin session that watches the lock in
/// `pg_locks` (and terminates or cancels backends).
struct Watched {
    admin: tokio_postgres::Client,
    key: String,
    lock_id: i64,
}

impl Watched {
    /// A key no other test uses, `name` in it, watched from a new admin session on the
    /// test server.
    async fn new(name: &str) -> Self {
        Self::on(admin().await, unique_key(name))
    }

    /// `key`, watched from `admin`.
    fn on(admin: tokio_postgres::Client, key: String) -> Self {
        let lock_id = locks_port::lock_id(&key);
        Self {
            admin,
            key,
            lock_id,
        }
    }

    /// How many sessions hold the lock.
    async fn holders(&self) -> i64 {
        holders(&self.admin, self.lock_id).await
    }

    async fn holder_pids(&self) -> Vec<i32> {
        holder_pids(&self.admin, self.lock_id).await
    }

    async fn waiting_pids(&self) -> Vec<i32> {
        waiting_pids(&self.admin, self.lock_id).await
    }

    /// The one backend holding the lock.
    async fn the_holder(&self) -> i32 {
        let [pid] = self.holder_pids().await[..] else {
            panic!("one holder expected");
        };
        pid
    }

    /// Waits until exactly one backend queues for the lock and returns its pid.
    async fn the_waiter(&self) -> i32 {
        let started = Instant::now();
        loop {
            if let [pid] = self.waiting_pids().await[..] {
                return pid;
            }
            assert!(
                started.elapsed() < EVENTUALLY,
                "timed out after {EVENTUALLY:?} waiting for one backend to queue for the lock"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (see [`wait_for`]) until no session holds the lock.
    async fn until_free(&self, what: &str) {
        wait_for(what, || async { self.holders().await == 0 }).await;
    }

    /// After the holder released: for a second, nobody (a dropped or cancelled
    /// waiter's session above all) is ever granted the lock.
    async fn assert_nobody_takes_it(&self) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(1) {
            assert_eq!(
                self.holder_pids().await,
                Vec::<i32>::new(),
                "a cancelled waiter was granted the lock"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether backend `pid` is still waiting on a heavyweight lock.
    async fn waits_on_a_lock(&self, pid: i32) -> bool {
        self.admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                &[&pid],
            )
            .await
            .expect("pg_stat_activity")
            .get::<_, i64>(0)
            > 0
    }

    /// Terminates backend `pid`, which must exist.
    async fn terminate(&self, pid: i32) {
        terminate_backend(&self.admin, pid).await;
    }
}

/// Terminates backend `pid` from `admin`; the backend must exist.
pub(crate) async fn terminate_backend(admin: &tokio_postgres::Client, pid: i32) {
    let done: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("pg_terminate_backend")
        .get(0);
    assert!(done, "backend {pid} was there to terminate");
}

/// Whether a test's manager shares connections between its locks (ADR 0013).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    /// One connection per held lock (the default).
    Plain,
    /// Up to [`LOCKS_PER_CONNECTION`] locks on one connection.
    Multiplexed,
}

/// The cap of a multiplexed manager in these tests.
const LOCKS_PER_CONNECTION: usize = 4;

impl Mode {
    /// A manager on `pool` in this mode.
    fn manager(self, pool: Pool) -> PostgresLockManager {
        self.builder(pool).build()
    }

    /// A builder on `pool` in this mode, for a test that sets more.
    fn builder(self, pool: Pool) -> PostgresLockManagerBuilder {
        let builder = PostgresLockManager::builder(pool);
        match self {
            Self::Plain => builder,
            Self::Multiplexed => builder.multiplex(LOCKS_PER_CONNECTION),
        }
    }

    /// The connections [`Mode::neighbours`] take: the one they share, multiplexed.
    fn neighbour_connections(self) -> usize {
        match self {
            Self::Plain => 0,
            Self::Multiplexed => 1,
        }
    }

    /// Multiplexed, `manager` takes locks that fill one shared connection but for one
    /// place, so the test's own lock is tried there first (and joins them when free);
    /// plain, none. Watched from `admin`.
    async fn neighbours(
        self,
        manager: &PostgresLockManager,
        admin: &tokio_postgres::Client,
    ) -> Neighbours {
        let count = match self {
            Self::Plain => 0,
            Self::Multiplexed => LOCKS_PER_CONNECTION - 1,
        };
        let mut guards = Vec::new();
        for n in 0..count {
            let key = unique_key(&format!("neighbour-{n}"));
            let guard = manager
                .acquire(&key, timeout(EVENTUALLY))
                .await
                .expect("a neighbour");
            guards.push(guard);
        }
        let mut pids = Vec::new();
        for guard in &guards {
            pids.extend(holder_pids(admin, guard.info().lock_id()).await);
        }
        pids.dedup();
        assert!(
            pids.len() <= 1,
            "the neighbours share one session: {pids:?}"
        );
        Neighbours {
            guards,
            pid: pids.first().copied(),
        }
    }
}

/// Locks a test's manager holds besides the test's own (see [`Mode::neighbours`]): what
/// a fault does to them is checked too.
struct Neighbours {
    guards: Vec<PostgresLockGuard>,
    /// The backend of their shared connection.
    pid: Option<i32>,
}

impl Neighbours {
    /// How many locks the manager holds besides the test's own.
    fn count(&self) -> usize {
        self.guards.len()
    }

    /// Whether backend `pid` is the neighbours' shared connection.
    fn on(&self, pid: i32) -> bool {
        self.pid == Some(pid)
    }

    /// Multiplexed, the test's (uncontended) lock joined the neighbours' session.
    async fn assert_joined_by(&self, lock: &Watched) {
        if let Some(pid) = self.pid {
            assert_eq!(
                lock.the_holder().await,
                pid,
                "the lock joins its neighbours"
            );
        }
    }

    /// Each is still held, by the same session, and its guard was told nothing.
    async fn assert_untouched(&self, admin: &tokio_postgres::Client) {
        for guard in &self.guards {
            assert!(!guard.is_lost(), "a neighbour was lost");
            let pids = holder_pids(admin, guard.info().lock_id()).await;
            assert_eq!(pids, Vec::from_iter(self.pid), "a neighbour moved or went");
        }
    }

    /// Each guard is told within [`EVENTUALLY`] that its lock went, for `reason`.
    async fn assert_lost(&self, reason: LostReason) {
        for guard in &self.guards {
            let told = tokio::time::timeout(EVENTUALLY, guard.lost())
                .await
                .expect("each neighbour's guard is told");
            assert_eq!(told, reason);
        }
    }

    /// Releases each (they must be held).
    async fn release(self) {
        for guard in self.guards {
            assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
        }
    }
}

/// Two managers, a holder (plain) and a waiter in `mode`, each on a pool of its own of
/// `size` connections, and the waiter's [`Mode::neighbours`] one more.
fn holder_and_waiter(mode: Mode, size: usize) -> (PostgresLockManager, PostgresLockManager) {
    (
        PostgresLockManager::new(pool(size)),
        mode.manager(pool(size + mode.neighbour_connections())),
    )
}

fn timeout(duration: Duration) -> AcquireOptions {
    AcquireOptions::new().with_timeout(duration)
}

fn assert_bounded(what: &str, started: Instant) {
    assert!(
        started.elapsed() < EVENTUALLY,
        "{what} took {:?}, more than {EVENTUALLY:?}",
        started.elapsed()
    );
}

/// `manager` takes `key` within 5 s (`what` says why it should) and unlocks it.
pub(crate) async fn assert_still_locks(manager: &PostgresLockManager, key: &str, what: &str) {
    let guard = manager
        .acquire(key, timeout(Duration::from_secs(5)))
        .await
        .expect(what);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

/// The pool never grew past its bound (dead connections were given up, not kept).
fn assert_pool_within_bounds(manager: &PostgresLockManager) {
    let status = manager.pool().status();
    assert!(status.size <= status.max_size, "{status:?}");
}

fn pool_at(url: &str, size: usize) -> Pool {
    locks_postgres::plain_pool(url, size).expect("pool")
}

fn pool_from(config: tokio_postgres::Config, size: usize) -> Pool {
    locks_postgres::plain_pool_with_config(config, size).expect("pool")
}

/// The test server's connection settings, for a pool with settings a URL does not carry.
fn test_server_config() -> tokio_postgres::Config {
    tokio_postgres::Config::from_str(&crate::support::database_url()).expect("a valid database URL")
}

/// A cluster of one test alone (`what` it is for), for faults the shared server must
/// not see. Dropping it stops the server and removes its folder, also when the test
/// fails; drop it with [`drop_cluster`] on a runtime thread.
pub(crate) fn own_cluster(what: &str) -> ThrowawayPostgres {
    tokio::task::block_in_place(ThrowawayPostgres::start)
        .unwrap_or_else(|error| panic!("a throwaway PostgreSQL cluster for {what}: {error}"))
}

pub(crate) fn drop_cluster(cluster: ThrowawayPostgres) {
    tokio::task::block_in_place(|| drop(cluster));
}
