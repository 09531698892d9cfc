//! Scenario `scale`: how each cost grows, one curve each, beside raw tokio-postgres doing
//! the same work where there is a raw equivalent:
//! - **held locks** 10³ … `--scale-max` (10⁵ by default) held by one manager multiplexed on
//!   [`CONNECTIONS`] connections: time to reach each count, another manager's acquire +
//!   release p50/p99 at that count, client heap and RSS bytes and CPU at rest per held
//!   lock, the server's lock-table fill; and the cost of each observation read
//!   (`holders`, `lock_table_usage`, the leader's `who_leads`): its own time, and the
//!   other manager's cycle p99 while it runs in a loop, against the p99 without it;
//! - **tasks** 1 → 1,000 on distinct keys: throughput ÷ raw;
//! - **waiters** 4 → 1,000 on one key: handoff p99 and fairness;
//! - **groups**: `acquire_many` of 1 → 1,000 keys, cost per key.
//!
//! The server must be sized for it (`cargo xtask bench --only scale` starts one that is);
//! the scenario reads its settings and shared memory and reports them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_leader::LeaderElection;
use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, LockRegistry, PermitGuard, Semaphore,
};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::{Client, Statement};
use serde_json::{Value, json};

use crate::chart::{Curve, Panel, Unit, curves_svg};
use crate::db::{Database, RawStatements};
use crate::report::{Outcome, Section};
use crate::stats::{
    Latencies, allocated_bytes, as_f64, fairness, fmt_bytes, fmt_ns, fmt_ratio, median, nanos,
    ratio, rss_bytes,
};
use crate::{BoxError, Plan, interleave};

/// Connections of the holding manager (and of the raw holder).
const CONNECTIONS: usize = 50;
/// Acquisitions in flight while growing to a count.
const IN_FLIGHT: usize = 32;
/// Probe cycles at each count (and while each read loops).
const PROBE_CYCLES: usize = 300;
/// How long the cycle is measured beside each observer at its interval (and without one).
const OBSERVE_WINDOW: Duration = Duration::from_secs(10);
/// The interval of the lock-table gauge observer.
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);
/// Concurrent tasks, waiters and group sizes of the three other curves.
const TASKS: [usize; 4] = [1, 10, 100, 1000];
const WAITERS: [usize; 4] = [4, 32, 256, 1000];
const GROUPS: [usize; 4] = [1, 10, 100, 1000];
/// At most this many connections serve the task curve (either side).
const TASK_CONNECTIONS: usize = 100;
/// An acquisition of the holding manager that takes longer has stalled: the curve stops
/// at the last count reached, and the report says so.
const STALL: Duration = Duration::from_secs(60);
/// Connections opened at once (more, on a loaded machine, time out in the pool).
const OPENING: usize = 16;
/// How long a waiter holds the lock.
const HOLD: Duration = Duration::from_millis(1);
const APP: &str = "lock-bench-scale";
/// The election a leader holds while the reads are measured (with a board).
const LEADER: &str = "bench:scale";
const SETTINGS: [&str; 6] = [
    "max_locks_per_transaction",
    "max_connections",
    "max_prepared_transactions",
    "shared_buffers",
    "shared_memory_size",
    "server_version",
];

const BLUE: (u8, u8, u8) = (0x1f, 0x77, 0xb4);
const ORANGE: (u8, u8, u8) = (0xff, 0x7f, 0x0e);
const GREEN: (u8, u8, u8) = (0x2c, 0xa0, 0x2c);
const RED: (u8, u8, u8) = (0xd6, 0x27, 0x28);

/// 10³, 10⁴, … up to `max` (and `max` itself when it is not a power of ten).
fn counts(max: usize) -> Vec<usize> {
    let mut counts: Vec<usize> = std::iter::successors(Some(1000usize), |c| c.checked_mul(10))
        .take_while(|c| *c <= max)
        .collect();
    if counts.last() != Some(&max) {
        counts.push(max);
    }
    counts
}

/// Process CPU time (user + system) so far.
fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |usage| {
        let micros = |t: nix::sys::time::TimeVal| {
            Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
        };
        micros(usage.user_time()) + micros(usage.system_time())
    })
}

/// CPU nanoseconds a second this process spends over `window` doing nothing asked of it.
async fn cpu_at_rest(window: Duration) -> f64 {
    let (cpu, wall) = (cpu_time(), Instant::now());
    tokio::time::sleep(window).await;
    as_f64(nanos(cpu_time().saturating_sub(cpu))) / wall.elapsed().as_secs_f64()
}

/// p50 and p99 of a histogram, in nanoseconds (kept instead of the histogram, whose
/// memory would count against the held locks').
#[derive(Debug, Clone, Copy)]
struct P50P99(u64, u64);

impl P50P99 {
    fn of(latencies: &Latencies) -> Self {
        Self(latencies.p50(), latencies.p99())
    }

    fn to_json(self) -> Value {
        json!({ "p50_ns": self.0, "p99_ns": self.1 })
    }
}

/// One cycle of the other manager or of raw SQL: acquire + release of one key.
enum Prober {
    Library(PostgresLockManager),
    Raw(Client, RawStatements),
}

impl Prober {
    async fn cycles(&self, count: usize) -> Result<P50P99, BoxError> {
        self.cycles_until(count, Duration::ZERO).await
    }

    /// At least `count` cycles, and for at least `window`.
    async fn cycles_until(&self, count: usize, window: Duration) -> Result<P50P99, BoxError> {
        let mut latencies = Latencies::new();
        let key = "bench:scale:probe";
        let id = locks_port::lock_id(key);
        let began = Instant::now();
        let mut done = 0;
        while done < count || began.elapsed() < window {
            done += 1;
            let started = Instant::now();
            match self {
                Self::Library(manager) => {
                    manager
                        .acquire(key, AcquireOptions::new())
                        .await?
                        .release()
                        .await;
                }
                Self::Raw(client, statements) => {
                    client.execute(&statements.lock, &[&id]).await?;
                    client.execute(&statements.unlock, &[&id]).await?;
                }
            }
            latencies.record(started.elapsed());
        }
        Ok(P50P99::of(&latencies))
    }
}

/// The observation reads, each on the observer manager.
#[derive(Debug, Clone, Copy)]
enum Read {
    Holders,
    LockTableUsage,
    WhoLeads,
    /// One leader watch at its default interval, for [`OBSERVE_WINDOW`].
    Watch,
    /// The same without a board: it names the leader from `permit_holders` (`pg_locks`),
    /// as every watch did before the board named it.
    WatchWithoutBoard,
    /// `lock_table_usage()` every [`GAUGE_INTERVAL`], for [`OBSERVE_WINDOW`].
    Gauge,
    /// A semaphore's acquire + release in a loop, for [`OBSERVE_WINDOW`].
    Permits,
}

impl Read {
    const ALL: [Self; 7] = [
        Self::Holders,
        Self::LockTableUsage,
        Self::WhoLeads,
        Self::Watch,
        Self::WatchWithoutBoard,
        Self::Gauge,
        Self::Permits,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Holders => "holders(key)",
            Self::LockTableUsage => "lock_table_usage()",
            Self::WhoLeads => "who_leads()",
            Self::Watch => "watch() at its interval",
            Self::WatchWithoutBoard => "watch() without a board",
            Self::Gauge => "lock_table_usage() every 5 s",
            Self::Permits => "permit acquire + release",
        }
    }

    /// Whether it runs at an interval for [`OBSERVE_WINDOW`] (compared with the cycle
    /// over the same window without it), rather than back to back.
    fn timed(self) -> bool {
        matches!(
            self,
            Self::Watch | Self::WatchWithoutBoard | Self::Gauge | Self::Permits
        )
    }

    async fn once(self, observer: &PostgresLockManager) -> Result<(), BoxError> {
        match self {
            Self::Holders => drop(observer.holders("bench:scale:probe").await?),
            Self::LockTableUsage => drop(observer.lock_table_usage().await?),
            Self::WhoLeads => {
                drop(
                    LeaderElection::new(observer.clone(), LEADER)
                        .board(observer.clone())
                        .who_leads()
                        .await?,
                );
            }
            Self::Watch => {
                // Runs until aborted: the leader does not change.
                let election =
                    LeaderElection::new(observer.clone(), LEADER).board(observer.clone());
                let mut watch = election.watch();
                loop {
                    watch.changed().await?;
                }
            }
            Self::WatchWithoutBoard => {
                let election = LeaderElection::new(observer.clone(), LEADER);
                let mut watch = election.watch();
                loop {
                    watch.changed().await?;
                }
            }
            Self::Gauge => {
                observer.lock_table_usage().await?;
                tokio::time::sleep(GAUGE_INTERVAL).await;
            }
            Self::Permits => {
                observer
                    .acquire_permit("bench:scale:permits", 2, AcquireOptions::new())
                    .await?
                    .release()
                    .await;
            }
        }
        Ok(())
    }
}

/// What one read cost at one count.
#[derive(Debug)]
struct ReadCost {
    read: Read,
    /// The read's own time, p50 of its calls while it looped.
    own: u64,
    calls: usize,
    /// The probe's cycle p99 while it looped.
    probe_p99: u64,
    /// For an observer at its interval: the cycle p99 over the same window without it.
    quiet_p99: Option<u64>,
}

impl ReadCost {
    /// The cycle p99 beside the read ÷ without it (over the same window for an
    /// observer at its interval, else the count's own cycle p99).
    fn ratio(&self, without: u64) -> f64 {
        as_f64(self.probe_p99) / as_f64(self.quiet_p99.unwrap_or(without).max(1))
    }
}

/// The held-lock curve at one count.
#[derive(Debug)]
struct Held {
    count: usize,
    /// From the first acquisition to this count.
    reach: Duration,
    raw_reach: Duration,
    probe: P50P99,
    raw_probe: P50P99,
    heap_per_lock: f64,
    rss_per_lock: Option<f64>,
    /// CPU ns a second at rest, minus that with nothing held, per held lock.
    cpu_per_lock: f64,
    advisory: u64,
    capacity: u64,
    reads: Vec<ReadCost>,
}

/// A pool of `size` connections, all opened, at most [`OPENING`] at a time.
async fn open_pool(
    db: &Database,
    size: usize,
    application_name: &str,
) -> Result<locks_postgres::deadpool_postgres::Pool, BoxError> {
    let pool = db.pool(size, application_name);
    let mut open = 0;
    while open < size {
        open = (open + OPENING).min(size);
        db.warm(&pool, open).await?;
    }
    Ok(pool)
}

/// A dedicated connection with the raw exclusive statements prepared.
async fn raw_client(
    db: &Database,
    application_name: &str,
) -> Result<(Client, RawStatements), BoxError> {
    let client = db.connect(application_name).await?;
    let statements = RawStatements::prepare(&client, false).await?;
    Ok((client, statements))
}

/// Calls `take(n)` for each `n` of `from..to`, [`IN_FLIGHT`] calls at once.
async fn take_all<F, Fut>(from: usize, to: usize, take: F) -> Result<(), BoxError>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send,
{
    let next = Arc::new(AtomicUsize::new(from));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (take, next) = (take.clone(), Arc::clone(&next));
        workers.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= to {
                    return Ok::<_, BoxError>(());
                }
                take(n).await?;
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(())
}

/// Takes keys `from..to` with [`IN_FLIGHT`] acquisitions at once, keeping them.
async fn grow(
    manager: &PostgresLockManager,
    run: u32,
    from: usize,
    to: usize,
) -> Result<(), BoxError> {
    let manager = manager.clone();
    take_all(from, to, move |n| {
        let manager = manager.clone();
        async move {
            let key = format!("bench:scale:{run}:{n}");
            let acquiring = manager.acquire(&key, AcquireOptions::new());
            let guard = tokio::time::timeout(STALL, acquiring)
                .await
                .map_err(|_| format!("an acquisition waited over {} s", STALL.as_secs()))??;
            drop(guard.into_held());
            Ok(())
        }
    })
    .await
}

/// The raw side of [`grow`]: `pg_advisory_lock` of ids `from..to` over `clients`, each
/// client pipelining its share, [`IN_FLIGHT`] at once in all.
async fn raw_grow(
    clients: &Arc<Vec<(Client, RawStatements)>>,
    from: usize,
    to: usize,
) -> Result<(), BoxError> {
    let clients = Arc::clone(clients);
    take_all(from, to, move |n| {
        let clients = Arc::clone(&clients);
        async move {
            let (client, statements) = &clients[n % clients.len()];
            let id = i64::try_from(n)? + 1_000_000_000;
            client.execute(&statements.lock, &[&id]).await?;
            Ok(())
        }
    })
    .await
}

/// Each read's own time and the probe's p99 while it loops.
async fn read_costs(
    observer: &PostgresLockManager,
    probe: &Prober,
) -> Result<Vec<ReadCost>, BoxError> {
    let mut costs = Vec::new();
    let quiet = probe.cycles_until(PROBE_CYCLES, OBSERVE_WINDOW).await?;
    for read in Read::ALL {
        let stop = Arc::new(AtomicBool::new(false));
        let looping = {
            let (observer, stop) = (observer.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut own = Latencies::new();
                let mut calls = 0;
                while calls < 3 || !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    read.once(&observer).await?;
                    own.record(started.elapsed());
                    calls += 1;
                }
                Ok::<_, BoxError>((own.p50(), calls))
            })
        };
        let window = if read.timed() {
            OBSERVE_WINDOW
        } else {
            Duration::ZERO
        };
        let during = probe.cycles_until(PROBE_CYCLES, window).await?;
        stop.store(true, Ordering::Relaxed);
        let (own, calls) = if matches!(read, Read::Watch | Read::WatchWithoutBoard | Read::Gauge) {
            looping.abort();
            (0, 0)
        } else {
            looping.await??
        };
        let cost = ReadCost {
            read,
            own,
            calls,
            probe_p99: during.1,
            quiet_p99: read.timed().then_some(quiet.1),
        };
        eprintln!(
            "lock-bench: scale: {}: own p50 {} ({calls} calls); cycle p99 {} (×{:.2} of {})",
            read.name(),
            fmt_ns(own),
            fmt_ns(during.1),
            cost.ratio(quiet.1),
            fmt_ns(cost.quiet_p99.unwrap_or(quiet.1)),
        );
        costs.push(cost);
    }
    Ok(costs)
}

/// The held-lock curve: the library grows to each count (measured there), releases all,
/// then raw SQL grows to the same counts.
async fn held_curve(
    db: &Database,
    plan: &Plan,
    admin: &Client,
) -> Result<(Vec<Held>, Option<String>), BoxError> {
    let counts = counts(plan.scale_max);
    let max = *counts.last().unwrap_or(&1000);
    let per_connection = (max * 3 / 2).div_ceil(CONNECTIONS);
    let pool = open_pool(db, CONNECTIONS, APP).await?;
    let holder = PostgresLockManager::builder(pool)
        .multiplex(per_connection)
        .build();
    let probe_pool = open_pool(db, 2, "lock-bench-scale-probe").await?;
    let probe = Prober::Library(PostgresLockManager::new(probe_pool));
    let observer_pool = open_pool(db, 3, "lock-bench-scale-observer").await?;
    let observer = PostgresLockManager::new(observer_pool);
    // A leader holds the election the reads watch, with a board.
    locks_postgres::install_leader_board(admin).await?;
    let leader = PostgresLockManager::new(open_pool(db, 4, "lock-bench-scale-leader").await?);
    let leading = tokio::spawn(async move {
        LeaderElection::new(leader.clone(), LEADER)
            .board(leader)
            .run(|_| std::future::pending::<()>())
            .await
    });
    let (client, statements) = raw_client(db, "lock-bench-scale-probe").await?;
    let raw_probe = Prober::Raw(client, statements);
    probe.cycles(50).await?;
    raw_probe.cycles(50).await?;
    let rest = if plan.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    let idle_cpu = cpu_at_rest(rest).await;
    let (heap0, rss0) = (allocated_bytes(), rss_bytes());
    let run = std::process::id();

    let mut points = Vec::new();
    let started = Instant::now();
    let mut from = 0;
    let mut stall = None;
    for &count in &counts {
        if let Err(error) = grow(&holder, run, from, count).await {
            let message = format!(
                "on the way to {count}, at {} held after {:.0} s: {error}",
                holder.held_lock_count(),
                started.elapsed().as_secs_f64()
            );
            eprintln!("lock-bench: scale: stalled {message}");
            stall = Some(message);
            break;
        }
        let reach = started.elapsed();
        from = count;
        let held = holder.held_lock_count();
        if held != count {
            return Err(format!("the holding manager holds {held} locks, expected {count}").into());
        }
        let heap = as_f64(allocated_bytes().saturating_sub(heap0) as u64) / as_f64(count as u64);
        let rss = rss_bytes().zip(rss0).map(|(now, before)| {
            (as_f64(now as u64) - as_f64(before as u64)) / as_f64(count as u64)
        });
        let cpu = (cpu_at_rest(rest).await - idle_cpu) / as_f64(count as u64);
        let usage = locks_postgres::lock_table_usage(admin).await?;
        let probe_at = probe.cycles(PROBE_CYCLES).await?;
        let raw_probe_at = raw_probe.cycles(PROBE_CYCLES).await?;
        let reads = read_costs(&observer, &probe).await?;
        eprintln!(
            "lock-bench: scale: {count} held in {:.1} s; probe p99 {}",
            reach.as_secs_f64(),
            fmt_ns(probe_at.1)
        );
        points.push(Held {
            count,
            reach,
            raw_reach: Duration::ZERO,
            probe: probe_at,
            raw_probe: raw_probe_at,
            heap_per_lock: heap,
            rss_per_lock: rss,
            cpu_per_lock: cpu,
            advisory: usage.advisory,
            capacity: usage.capacity,
            reads,
        });
    }
    leading.abort();
    let held = holder.held_lock_count();
    let released = holder.release_all().await;
    if released != held {
        return Err(format!("release_all released {released} of {held}").into());
    }
    drop(holder);

    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(raw_client(db, APP).await?);
    }
    let clients = Arc::new(clients);
    let started = Instant::now();
    let mut from = 0;
    for point in &mut points {
        raw_grow(&clients, from, point.count).await?;
        point.raw_reach = started.elapsed();
        from = point.count;
    }
    drop(clients);
    db.sessions(admin, APP, 0).await?;
    Ok((points, stall))
}

/// Throughput of `tasks` tasks on distinct keys, library ÷ raw, medians of rounds.
#[derive(Debug)]
struct Tasks {
    tasks: usize,
    connections: usize,
    library: f64,
    raw: f64,
}

async fn tasks_point(db: &Database, plan: &Plan, tasks: usize) -> Result<Tasks, BoxError> {
    let connections = tasks.min(TASK_CONNECTIONS);
    let pool = open_pool(db, connections, "lock-bench-scale-tasks").await?;
    let manager = PostgresLockManager::builder(pool)
        .multiplex(tasks.div_ceil(connections))
        .build();
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(raw_client(db, "lock-bench-scale-tasks").await?);
    }
    let clients = Arc::new(clients);
    let (mut library, mut raw) = (Vec::new(), Vec::new());
    interleave::rounds(plan.scale_rounds, 2, async |_, side| {
        let end = Instant::now() + plan.scale_window;
        let started = Instant::now();
        let mut workers = tokio::task::JoinSet::new();
        for task in 0..tasks {
            let key = format!("bench:scale:tasks:{task}");
            let (manager, clients) = (manager.clone(), Arc::clone(&clients));
            workers.spawn(async move {
                let id = locks_port::lock_id(&key);
                let mut ops = 0u64;
                while Instant::now() < end {
                    if side == 0 {
                        manager
                            .acquire(&key, AcquireOptions::new())
                            .await?
                            .release()
                            .await;
                    } else {
                        let (client, statements) = &clients[task % clients.len()];
                        client.execute(&statements.lock, &[&id]).await?;
                        client.execute(&statements.unlock, &[&id]).await?;
                    }
                    ops += 1;
                }
                Ok::<_, BoxError>(ops)
            });
        }
        let mut ops = 0;
        while let Some(joined) = workers.join_next().await {
            ops += joined??;
        }
        let rate = as_f64(ops) / started.elapsed().as_secs_f64();
        if side == 0 { &mut library } else { &mut raw }.push(rate);
        Ok(())
    })
    .await?;
    Ok(Tasks {
        tasks,
        connections,
        library: median(&library),
        raw: median(&raw),
    })
}

/// Handoffs among `waiters` on one key: every gap from a release to the next grant, and
/// each waiter's turns.
#[derive(Debug, Default)]
struct Turns {
    last_release: Option<Instant>,
    gaps: Vec<u64>,
    turns: Vec<u64>,
}

#[derive(Debug)]
struct Waiters {
    waiters: usize,
    library: (u64, f64),
    raw: (u64, f64),
}

/// One window of `waiters` tasks looping acquire / hold [`HOLD`] / release on one key;
/// the gaps' p99 and most ÷ fewest turns.
async fn handoff_window(
    db: &Database,
    plan: &Plan,
    waiters: usize,
    library: bool,
) -> Result<(u64, f64), BoxError> {
    let key = "bench:scale:waiters";
    let id = locks_port::lock_id(key);
    let mut opening = tokio::task::JoinSet::new();
    let opening_at_once = Arc::new(tokio::sync::Semaphore::new(OPENING));
    for _ in 0..waiters {
        let (db, at_once) = (db.clone(), Arc::clone(&opening_at_once));
        opening.spawn(async move {
            let _turn = at_once.acquire().await?;
            if library {
                let pool = db.pool(1, "lock-bench-scale-waiters");
                db.warm(&pool, 1).await?;
                Ok::<_, BoxError>(Ok(PostgresLockManager::new(pool)))
            } else {
                Ok(Err(raw_client(&db, "lock-bench-scale-waiters").await?))
            }
        });
    }
    let mut takers = Vec::new();
    while let Some(joined) = opening.join_next().await {
        takers.push(joined??);
    }
    let state = Arc::new(Mutex::new(Turns {
        turns: vec![0; waiters],
        ..Turns::default()
    }));
    // Every waiter gets several turns in a window, at 2-4 ms a handoff.
    let length = plan
        .scale_window
        .max(HOLD * u32::try_from(waiters * 12).unwrap_or(12_000));
    let end = Instant::now() + length;
    let mut tasks = tokio::task::JoinSet::new();
    for (index, taker) in takers.into_iter().enumerate() {
        let state = Arc::clone(&state);
        tasks.spawn(async move {
            let with = |f: &mut dyn FnMut(&mut Turns)| {
                f(&mut state.lock().unwrap_or_else(PoisonError::into_inner))
            };
            while Instant::now() < end {
                let guard = match &taker {
                    Ok(manager) => Some(manager.acquire(key, AcquireOptions::new()).await?),
                    Err((client, statements)) => {
                        client.execute(&statements.lock, &[&id]).await?;
                        None
                    }
                };
                let at = Instant::now();
                with(&mut |turns| {
                    if at < end {
                        if let Some(released) = turns.last_release.take() {
                            turns.gaps.push(nanos(at - released));
                        }
                        turns.turns[index] += 1;
                    }
                });
                tokio::time::sleep(HOLD).await;
                with(&mut |turns| turns.last_release = Some(Instant::now()));
                match (guard, &taker) {
                    (Some(guard), _) => drop(guard.release().await),
                    (None, Err((client, statements))) => {
                        client.execute(&statements.unlock, &[&id]).await?;
                    }
                    (None, Ok(_)) => {}
                }
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    let turns = std::mem::take(&mut *state.lock().unwrap_or_else(PoisonError::into_inner));
    Ok((Latencies::of(&turns.gaps).p99(), fairness(&turns.turns)))
}

/// `acquire_many` of `keys` keys + release against one raw statement that locks them all
/// (`pg_advisory_lock` over `unnest`, in id order) and one that unlocks them.
#[derive(Debug)]
struct Group {
    keys: usize,
    library: u64,
    raw: u64,
}

async fn group_point(db: &Database, plan: &Plan, size: usize) -> Result<Group, BoxError> {
    let pool = open_pool(db, 1, "lock-bench-scale-groups").await?;
    let manager = PostgresLockManager::new(pool);
    let client = db.connect("lock-bench-scale-groups").await?;
    let lock: Statement = client
        .prepare(
            "SELECT count(pg_advisory_lock(id)) FROM \
             (SELECT id FROM unnest($1::int8[]) AS id ORDER BY id) AS ordered",
        )
        .await?;
    let unlock: Statement = client
        .prepare("SELECT bool_and(pg_advisory_unlock(id)) FROM unnest($1::int8[]) AS id")
        .await?;
    let keys: Vec<String> = (0..size)
        .map(|n| format!("bench:scale:group:{n}"))
        .collect();
    let ids: Vec<i64> = keys.iter().map(|k| locks_port::lock_id(k)).collect();
    let (mut library, mut raw) = (Latencies::new(), Latencies::new());
    interleave::rounds(plan.scale_rounds.max(2), 2, async |_, side| {
        let end = Instant::now() + plan.scale_window / 2;
        let mut calls = 0;
        while calls < 3 || Instant::now() < end {
            let started = Instant::now();
            if side == 0 {
                manager
                    .acquire_many(&keys, AcquireOptions::new())
                    .await?
                    .release()
                    .await;
                library.record(started.elapsed());
            } else {
                client.execute(&lock, &[&ids]).await?;
                let all: Option<bool> = client.query_one(&unlock, &[&ids]).await?.get(0);
                if all != Some(true) {
                    return Err("pg_advisory_unlock answered false".into());
                }
                raw.record(started.elapsed());
            }
            calls += 1;
        }
        Ok(())
    })
    .await?;
    Ok(Group {
        keys: size,
        library: library.p50(),
        raw: raw.p50(),
    })
}

/// The server's settings named in [`SETTINGS`].
async fn settings(admin: &Client) -> Result<Vec<(&'static str, String)>, BoxError> {
    let mut values = Vec::new();
    for name in SETTINGS {
        let value: String = admin.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
        values.push((name, value));
    }
    Ok(values)
}

fn setting<'a>(settings: &'a [(&str, String)], name: &str) -> &'a str {
    settings
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("?", |(_, v)| v.as_str())
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let admin = db.connect("lock-bench-admin").await?;
    let server = settings(&admin).await?;
    let usage = locks_postgres::lock_table_usage(&admin).await?;
    let max_connections: usize = setting(&server, "max_connections").parse().unwrap_or(0);
    if usage.capacity < as_f64(plan.scale_max as u64).mul_add(1.2, 10_000.0) as u64
        || max_connections < CONNECTIONS + TASK_CONNECTIONS * 2 + 20
    {
        return Err(format!(
            "the server's lock table holds {} entries and it allows {max_connections} \
             connections; the scale scenario holds {} locks and opens up to {} connections: \
             run it with `cargo xtask bench --only scale`, which starts a server sized for it",
            usage.capacity,
            plan.scale_max,
            WAITERS[3] + 20
        )
        .into());
    }
    let (held, stall) = held_curve(db, plan, &admin)
        .await
        .map_err(|error| format!("scale, held locks: {error}"))?;
    let mut tasks = Vec::new();
    for count in TASKS {
        let point = tasks_point(db, plan, count).await;
        tasks.push(point.map_err(|error| format!("scale, {count} tasks: {error}"))?);
    }
    // Each waiter has its own connection: as many as the server allows, with room to spare.
    let room = max_connections.saturating_sub(40);
    let (waiter_counts, skipped): (Vec<usize>, Vec<usize>) = WAITERS
        .iter()
        .partition(|w| **w <= room && (!plan.quick || **w <= 256));
    let mut waiters = Vec::new();
    for count in waiter_counts {
        let (mut library, mut raw) = (Vec::new(), Vec::new());
        for side in interleave::order(count, 2) {
            let measured = handoff_window(db, plan, count, side == 0)
                .await
                .map_err(|error| format!("scale, {count} waiters: {error}"))?;
            db.sessions(&admin, "lock-bench-scale-waiters", 0).await?;
            if side == 0 { &mut library } else { &mut raw }.push(measured);
        }
        waiters.push(Waiters {
            waiters: count,
            library: library[0],
            raw: raw[0],
        });
    }
    let mut groups = Vec::new();
    for size in GROUPS {
        let point = group_point(db, plan, size).await;
        groups.push(point.map_err(|error| format!("scale, a group of {size}: {error}"))?);
    }
    let curves = Curves {
        held,
        stall,
        tasks,
        waiters,
        skipped,
        groups,
    };
    outcome(plan, &server, &curves)
}

/// Every curve of one run.
#[derive(Debug)]
struct Curves {
    held: Vec<Held>,
    /// Where the held-lock curve stopped short, if it did.
    stall: Option<String>,
    tasks: Vec<Tasks>,
    waiters: Vec<Waiters>,
    /// Waiter counts left out (quick mode, or too few connections).
    skipped: Vec<usize>,
    groups: Vec<Group>,
}

fn outcome(plan: &Plan, server: &[(&str, String)], curves: &Curves) -> Result<Outcome, BoxError> {
    let Curves {
        held,
        stall,
        tasks,
        waiters,
        skipped,
        groups,
    } = curves;
    let per_connection = (plan.scale_max * 3 / 2).div_ceil(CONNECTIONS);
    let mut rows = Vec::new();
    for h in held {
        let reads: Vec<String> = h
            .reads
            .iter()
            .map(|r| {
                format!(
                    "{} {} (p99 ×{:.2})",
                    r.read.name(),
                    fmt_ns(r.own),
                    r.ratio(h.probe.1)
                )
            })
            .collect();
        rows.push(vec![
            format!("{} held", h.count),
            format!(
                "reach {:.2} s (raw {:.2} s, ×{:.1}); cycle p50 {} p99 {} (raw {} / {})",
                h.reach.as_secs_f64(),
                h.raw_reach.as_secs_f64(),
                h.reach.as_secs_f64() / h.raw_reach.as_secs_f64().max(1e-9),
                fmt_ns(h.probe.0),
                fmt_ns(h.probe.1),
                fmt_ns(h.raw_probe.0),
                fmt_ns(h.raw_probe.1)
            ),
            format!(
                "{} heap, {} RSS, {:.1} ns CPU/s a lock at rest; table {} / {} ({:.0}%)",
                fmt_bytes(h.heap_per_lock),
                h.rss_per_lock.map_or("?".to_owned(), fmt_bytes),
                h.cpu_per_lock,
                h.advisory,
                h.capacity,
                100.0 * as_f64(h.advisory) / as_f64(h.capacity.max(1))
            ),
            reads.join("; "),
        ]);
    }
    for t in tasks {
        rows.push(vec![
            format!("{} tasks, distinct keys", t.tasks),
            format!(
                "{:.0} cycles/s (raw {:.0}), {} connections each",
                t.library, t.raw, t.connections
            ),
            format!("÷ raw {}", fmt_ratio(ratio(t.library, t.raw))),
            String::new(),
        ]);
    }
    for w in waiters {
        rows.push(vec![
            format!("{} waiters, one key", w.waiters),
            format!(
                "handoff p99 {} (raw {})",
                fmt_ns(w.library.0),
                fmt_ns(w.raw.0)
            ),
            format!("fairness {:.2} (raw {:.2})", w.library.1, w.raw.1),
            String::new(),
        ]);
    }
    for g in groups {
        let per = |total: u64| fmt_ns(total / g.keys.max(1) as u64);
        rows.push(vec![
            format!("acquire_many of {}", g.keys),
            format!("p50 {} (raw {})", fmt_ns(g.library), fmt_ns(g.raw)),
            format!("{} a key (raw {})", per(g.library), per(g.raw)),
            fmt_ratio(ratio(as_f64(g.library), as_f64(g.raw))),
        ]);
    }
    let settings_line = server
        .iter()
        .map(|(name, value)| format!("{name} = {value}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut notes = vec![
        format!(
            "Server: {settings_line}. One manager holds the locks, multiplexed \
             (`multiplex({per_connection})`) on {CONNECTIONS} connections, {IN_FLIGHT} \
             acquisitions in flight; raw: `pg_advisory_lock` over {CONNECTIONS} \
             connections, {IN_FLIGHT} in flight. Cycle: another manager's (raw: another \
             connection's) acquire + release of one key, {PROBE_CYCLES} at each count. \
             Bytes and CPU a lock: the process's heap (counting allocator) and RSS growth \
             since the warmed, empty manager, and CPU a second at rest minus that with \
             nothing held. Reads: each one's p50 while it runs in a loop, and the cycle p99 \
             meanwhile ÷ the p99 without it; a leader holds the election `who_leads` \
             reads (with a board). Observers at an interval (a leader watch, the gauge \
             every {} s, a semaphore of 2 acquired and released in a loop): the cycle p99 \
             over {} s beside it ÷ over {} s without.",
            GAUGE_INTERVAL.as_secs(),
            OBSERVE_WINDOW.as_secs(),
            OBSERVE_WINDOW.as_secs()
        ),
        format!(
            "Tasks: N tasks each on its own key, acquire + release in a loop for {:.1} s; \
             library multiplexed on min(N, {TASK_CONNECTIONS}) connections, raw pipelined \
             on as many; median of {} round(s). Waiters: N tasks (each its own connection, \
             library `Queue`) acquire / hold {} / release one key; handoff = release → \
             next grant; fairness = most ÷ fewest turns. Groups: `acquire_many` + release \
             against one `pg_advisory_lock` over `unnest` + one unlock statement, p50.",
            plan.scale_window.as_secs_f64(),
            plan.scale_rounds,
            fmt_ns(nanos(HOLD))
        ),
    ];
    if let Some(stall) = stall {
        notes.push(format!(
            "**The held-lock curve stalled** {stall} (no acquisition returned within {} s; \
             the larger counts are not measured).",
            STALL.as_secs()
        ));
    }
    if !skipped.is_empty() {
        notes.push(format!(
            "Not measured here: {skipped:?} waiters ({} mode, or more connections than the \
             server allows).",
            plan.mode()
        ));
    }
    let svg = chart(held, tasks, waiters, groups, &settings_line)?;
    Ok(Outcome {
        id: "scale",
        section: Section {
            title: "17. Scale: held locks, observation reads, tasks, waiters, groups".to_owned(),
            notes,
            header: vec![
                "Point",
                "Time",
                "Cost",
                "Reads (and the cycle p99 while looping) / ratio",
            ],
            rows,
        },
        checks: Vec::new(),
        json: json!({
            "server": server.iter().map(|(n, v)| (n.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "connections": CONNECTIONS,
            "multiplex": per_connection,
            "in_flight": IN_FLIGHT,
            "held": held.iter().map(|h| json!({
                "count": h.count,
                "reach_s": h.reach.as_secs_f64(),
                "raw_reach_s": h.raw_reach.as_secs_f64(),
                "cycle": h.probe.to_json(),
                "raw_cycle": h.raw_probe.to_json(),
                "heap_bytes_per_lock": h.heap_per_lock,
                "rss_bytes_per_lock": h.rss_per_lock,
                "cpu_ns_per_s_per_lock": h.cpu_per_lock,
                "lock_table_advisory": h.advisory,
                "lock_table_capacity": h.capacity,
                "reads": h.reads.iter().map(|r| json!({
                    "read": r.read.name(),
                    "own_p50_ns": r.own,
                    "calls": r.calls,
                    "cycle_p99_ns_while_looping": r.probe_p99,
                    "cycle_p99_ns_same_window_without": r.quiet_p99,
                    "ratio_to_cycle_p99": r.ratio(h.probe.1),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "tasks": tasks.iter().map(|t| json!({
                "tasks": t.tasks, "connections": t.connections,
                "library_per_s": t.library, "raw_per_s": t.raw,
                "ratio": ratio(t.library, t.raw),
            })).collect::<Vec<_>>(),
            "waiters": waiters.iter().map(|w| json!({
                "waiters": w.waiters,
                "library_handoff_p99_ns": w.library.0, "library_fairness": finite(w.library.1),
                "raw_handoff_p99_ns": w.raw.0, "raw_fairness": finite(w.raw.1),
            })).collect::<Vec<_>>(),
            "waiters_not_measured": skipped,
            "held_stalled": stall,
            "groups": groups.iter().map(|g| json!({
                "keys": g.keys, "library_p50_ns": g.library, "raw_p50_ns": g.raw,
            })).collect::<Vec<_>>(),
        }),
        files: vec![("scale.svg", svg)],
    })
}

/// A ratio for JSON: infinite (a waiter without a turn) as null.
fn finite(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else {
        Value::Null
    }
}

fn curve(label: &str, color: (u8, u8, u8), dashed: bool, points: Vec<(f64, f64)>) -> Curve {
    Curve {
        label: label.to_owned(),
        color,
        dashed,
        points,
    }
}

fn chart(
    held: &[Held],
    tasks: &[Tasks],
    waiters: &[Waiters],
    groups: &[Group],
    settings_line: &str,
) -> Result<String, BoxError> {
    let x = |n: usize| as_f64(n as u64);
    let on_held =
        |f: &dyn Fn(&Held) -> f64| held.iter().map(|h| (x(h.count), f(h))).collect::<Vec<_>>();
    let ns = |d: Duration| as_f64(nanos(d));
    let mut reads = Vec::new();
    for (index, (read, color)) in Read::ALL.iter().zip([BLUE, ORANGE, GREEN]).enumerate() {
        reads.push(curve(
            read.name(),
            color,
            false,
            on_held(&|h| as_f64(h.reads[index].own)),
        ));
    }
    let mut ratios = Vec::new();
    for (index, (read, color)) in Read::ALL.iter().zip([BLUE, ORANGE, GREEN]).enumerate() {
        ratios.push(curve(
            &format!("while {} loops", read.name()),
            color,
            false,
            on_held(&|h| as_f64(h.reads[index].probe_p99) / as_f64(h.probe.1.max(1))),
        ));
    }
    let panels = vec![
        Panel {
            title: "time to hold N locks".to_owned(),
            x_desc: "held locks",
            y_desc: "time",
            y_unit: Unit::Nanos,
            curves: vec![
                curve(
                    "library, multiplexed",
                    BLUE,
                    false,
                    on_held(&|h| ns(h.reach)),
                ),
                curve(
                    "raw pg_advisory_lock",
                    RED,
                    true,
                    on_held(&|h| ns(h.raw_reach)),
                ),
            ],
        },
        Panel {
            title: "another session's acquire + release at N held".to_owned(),
            x_desc: "held locks",
            y_desc: "cycle",
            y_unit: Unit::Nanos,
            curves: vec![
                curve("library p99", BLUE, false, on_held(&|h| as_f64(h.probe.1))),
                curve("library p50", GREEN, false, on_held(&|h| as_f64(h.probe.0))),
                curve("raw p99", RED, true, on_held(&|h| as_f64(h.raw_probe.1))),
            ],
        },
        Panel {
            title: "client bytes per held lock".to_owned(),
            x_desc: "held locks",
            y_desc: "bytes",
            y_unit: Unit::Plain,
            curves: vec![
                curve("heap", BLUE, false, on_held(&|h| h.heap_per_lock)),
                curve(
                    "RSS",
                    ORANGE,
                    false,
                    on_held(&|h| h.rss_per_lock.unwrap_or(0.0)),
                ),
            ],
        },
        Panel {
            title: "one observation read's own time".to_owned(),
            x_desc: "held locks",
            y_desc: "time",
            y_unit: Unit::Nanos,
            curves: reads,
        },
        Panel {
            title: "cycle p99 while a read loops ÷ without".to_owned(),
            x_desc: "held locks",
            y_desc: "ratio",
            y_unit: Unit::Plain,
            curves: ratios,
        },
        Panel {
            title: "throughput ÷ raw, distinct keys".to_owned(),
            x_desc: "concurrent tasks",
            y_desc: "ratio",
            y_unit: Unit::Plain,
            curves: vec![curve(
                "library ÷ raw",
                BLUE,
                false,
                tasks
                    .iter()
                    .map(|t| (x(t.tasks), ratio(t.library, t.raw).unwrap_or(0.0)))
                    .collect(),
            )],
        },
        Panel {
            title: "handoff p99, waiters on one key".to_owned(),
            x_desc: "waiters",
            y_desc: "release → grant",
            y_unit: Unit::Nanos,
            curves: vec![
                curve(
                    "library (Queue)",
                    BLUE,
                    false,
                    waiters
                        .iter()
                        .map(|w| (x(w.waiters), as_f64(w.library.0)))
                        .collect(),
                ),
                curve(
                    "raw",
                    RED,
                    true,
                    waiters
                        .iter()
                        .map(|w| (x(w.waiters), as_f64(w.raw.0)))
                        .collect(),
                ),
            ],
        },
        Panel {
            title: "acquire_many + release, per key".to_owned(),
            x_desc: "keys in the group",
            y_desc: "per key",
            y_unit: Unit::Nanos,
            curves: vec![
                curve(
                    "library",
                    BLUE,
                    false,
                    groups
                        .iter()
                        .map(|g| (x(g.keys), as_f64(g.library) / x(g.keys)))
                        .collect(),
                ),
                curve(
                    "raw (one statement)",
                    RED,
                    true,
                    groups
                        .iter()
                        .map(|g| (x(g.keys), as_f64(g.raw) / x(g.keys)))
                        .collect(),
                ),
            ],
        },
    ];
    curves_svg(
        "Scale: how each cost grows (log-log)",
        &panels,
        4,
        &[format!("Server: {settings_line}.")],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_decades_up_to_the_largest() {
        assert_eq!(counts(100_000), [1000, 10_000, 100_000]);
        assert_eq!(counts(1_000_000), [1000, 10_000, 100_000, 1_000_000]);
        assert_eq!(counts(50_000), [1000, 10_000, 50_000]);
        assert_eq!(counts(10), [10]);
    }
}
