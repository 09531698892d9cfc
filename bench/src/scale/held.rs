//! The held-lock curve: one manager multiplexed on [`connections`] connections grows to
//! 10³ … `--scale-max` held locks; at each count the time to reach it, another manager's
//! cycle p50/p99, client heap, RSS and CPU at rest per held lock, the server's lock-table
//! fill and the observation reads' costs ([`super::reads`]); then raw SQL grows to the
//! same counts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_leader::LeaderElection;
use locks_port::{AcquireOptions, DistributedLock, LockGuard, LockRegistry, lock_id};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::Client;
use locks_shard::{ShardGroup, ShardMember};
use locks_shard_postgres::PostgresShardTerms;

use super::reads::{self, LEADER, ReadCost, read_costs};
use super::{APP, IN_FLIGHT, P50P99, PROBE_CYCLES, connections, cycles};
use crate::chart::{BLUE, GREEN, ORANGE, Panel, RED, Unit, curve, panel, x};
use crate::clients::Op;
use crate::db::{Database, Raw};
use crate::harness::cells;
use crate::stats::{allocated_bytes, as_f64, fmt_bytes, fmt_ns, nanos, rss_bytes};
use crate::turns::{each, open_pool};
use crate::{BoxError, Plan};

/// An acquisition of the holding manager that takes longer has stalled: the curve stops
/// at the last count reached, and the report says so.
pub(super) const STALL: Duration = Duration::from_secs(60);

/// The held-lock curve at one count.
#[derive(Debug, serde::Serialize)]
pub(super) struct Held {
    pub(super) count: usize,
    /// From the first acquisition to this count.
    #[serde(serialize_with = "super::ns")]
    pub(super) reach: Duration,
    #[serde(serialize_with = "super::ns")]
    pub(super) raw_reach: Duration,
    pub(super) probe: P50P99,
    pub(super) raw_probe: P50P99,
    pub(super) heap_per_lock: f64,
    pub(super) rss_per_lock: Option<f64>,
    /// CPU ns a second at rest, minus that with nothing held, per held lock.
    pub(super) cpu_per_lock: f64,
    pub(super) advisory: u64,
    pub(super) capacity: u64,
    pub(super) reads: Vec<ReadCost>,
}

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

/// Takes keys `from..to`, [`IN_FLIGHT`] at once, keeping them: with the holding
/// manager (each acquisition given [`STALL`]), or raw `pg_advisory_lock` over `clients`,
/// each client pipelining its share.
async fn grow(
    holder: Result<PostgresLockManager, Arc<Vec<Raw>>>,
    run: u32,
    (from, to): (usize, usize),
) -> Result<(), BoxError> {
    let stalled = || format!("an acquisition waited over {} s", STALL.as_secs());
    each(from..to, IN_FLIGHT, move |n| {
        let holder = holder.clone();
        async move {
            match holder {
                Ok(manager) => {
                    let key = format!("bench:scale:{run}:{n}");
                    let acquiring = manager.acquire(&key, AcquireOptions::new());
                    let guard = tokio::time::timeout(STALL, acquiring).await;
                    drop(guard.map_err(|_| stalled())??.into_held());
                }
                Err(clients) => {
                    let id = i64::try_from(n)? + 1_000_000_000;
                    clients[n % clients.len()].lock(id).await?;
                }
            }
            Ok(())
        }
    })
    .await
    .map(drop)
}

/// The held-lock curve: the library grows to each count (measured there), releases all,
/// then raw SQL grows to the same counts; and where it stalled, if it did.
pub(super) async fn measure(
    db: &Database,
    plan: &Plan,
    admin: &Client,
) -> Result<(Vec<Held>, Option<String>), BoxError> {
    let counts = counts(plan.scale_max);
    let max = *counts.last().unwrap_or(&1000);
    let holding = connections(max);
    let per_connection = (max * 3 / 2).div_ceil(holding);
    let pool = open_pool(db, holding, APP).await?;
    let holder = PostgresLockManager::builder(pool)
        .multiplex(per_connection)
        .build();
    // Another manager's cycle of one key, and raw SQL's.
    let (key, app) = ("bench:scale:probe", "lock-bench-scale-probe");
    let probe = Op::Acquire {
        manager: PostgresLockManager::new(open_pool(db, 2, app).await?),
        keys: vec![key.to_owned()],
        options: AcquireOptions::new(),
    };
    let raw_probe = Op::RawPrepared {
        raw: Raw::connect(db, app, false).await?,
        ids: vec![lock_id(key)],
        try_lock: false,
    };
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
    // A member of a shard group of 4 runs (its permit, its roster row, 4 shard locks),
    // for the shard owners reads.
    locks_shard_postgres::install_shard_terms(admin).await?;
    let sharded = Arc::new(reads::Sharded {
        group: ShardGroup::new("bench:scale:shards", (0..4).map(|i| format!("s{i}")))?,
        terms: PostgresShardTerms::new(open_pool(db, 2, "lock-bench-scale-terms").await?),
    });
    let member = ShardMember::new(
        PostgresLockManager::builder(open_pool(db, 6, "lock-bench-scale-member").await?)
            .holder_id("bench-member")
            .build(),
        sharded.terms.clone(),
        sharded.group.clone(),
    );
    let membering = tokio::spawn(async move {
        member
            .run(|_, stop| async move {
                let _ = stop.await;
            })
            .await
    });
    cycles(&probe, 50, Duration::ZERO).await?;
    cycles(&raw_probe, 50, Duration::ZERO).await?;
    let rest = Duration::from_secs(if plan.quick { 1 } else { 3 });
    let idle_cpu = cpu_at_rest(rest).await;
    let (heap0, rss0) = (allocated_bytes(), rss_bytes());
    let run = std::process::id();

    let mut points = Vec::new();
    let started = Instant::now();
    // The time spent growing only: the measurements at each count (the observers'
    // windows alone take a minute) are not part of reaching the next.
    let mut reach = Duration::ZERO;
    let mut from = 0;
    let mut stall = None;
    for &count in &counts {
        let growing = Instant::now();
        let grown = grow(Ok(holder.clone()), run, (from, count)).await;
        reach += growing.elapsed();
        if let Err(error) = grown {
            let message = format!(
                "on the way to {count}, at {} held after {:.0} s: {error}",
                holder.held_lock_count(),
                started.elapsed().as_secs_f64()
            );
            eprintln!("lock-bench: scale: stalled {message}");
            stall = Some(message);
            break;
        }
        from = count;
        let held = holder.held_lock_count();
        if held != count {
            return Err(format!("the holding manager holds {held} locks, expected {count}").into());
        }
        let per_lock = |bytes: f64| bytes / as_f64(count as u64);
        let heap = per_lock(as_f64(allocated_bytes().saturating_sub(heap0) as u64));
        let rss = rss_bytes()
            .zip(rss0)
            .map(|(now, before)| per_lock(as_f64(now as u64) - as_f64(before as u64)));
        let cpu = per_lock(cpu_at_rest(rest).await - idle_cpu);
        let usage = locks_postgres::lock_table_usage(admin).await?;
        let probe_at = cycles(&probe, PROBE_CYCLES, Duration::ZERO).await?;
        let raw_probe_at = cycles(&raw_probe, PROBE_CYCLES, Duration::ZERO).await?;
        let reads = read_costs(&observer, &sharded, &probe).await?;
        eprintln!(
            "lock-bench: scale: {count} held in {:.1} s; probe p99 {}; {} heap, {} RSS a lock",
            reach.as_secs_f64(),
            fmt_ns(probe_at.1),
            fmt_bytes(heap),
            rss.map_or("?".to_owned(), fmt_bytes)
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
    membering.abort();
    let held = holder.held_lock_count();
    let released = holder.release_all().await;
    if released != held {
        return Err(format!("release_all released {released} of {held}").into());
    }
    drop(holder);

    let mut clients = Vec::new();
    for _ in 0..holding {
        clients.push(Raw::connect(db, APP, false).await?);
    }
    let clients = Arc::new(clients);
    let started = Instant::now();
    let mut from = 0;
    for point in &mut points {
        grow(Err(Arc::clone(&clients)), run, (from, point.count)).await?;
        point.raw_reach = started.elapsed();
        from = point.count;
    }
    drop(clients);
    db.sessions(admin, APP, 0).await?;
    Ok((points, stall))
}

pub(super) fn row(h: &Held) -> Vec<crate::harness::Cell> {
    cells![
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
        reads::cell(h),
    ]
}

/// The points of a curve over the held-lock counts.
pub(super) fn on_held(held: &[Held], f: impl Fn(&Held) -> f64) -> Vec<(f64, f64)> {
    held.iter().map(|h| (x(h.count), f(h))).collect()
}

/// The time to reach each count, the other manager's cycle, the bytes per held lock.
pub(super) fn panels(held: &[Held]) -> [Panel; 3] {
    let on =
        |label, color, dashed, f: fn(&Held) -> f64| curve(label, color, dashed, on_held(held, f));
    let axes = |y: &'static str, unit| ("held locks", y, unit);
    [
        panel(
            "time to hold N locks",
            axes("time", Unit::Nanos),
            vec![
                on("library, multiplexed", BLUE, false, |h| {
                    as_f64(nanos(h.reach))
                }),
                on("raw pg_advisory_lock", RED, true, |h| {
                    as_f64(nanos(h.raw_reach))
                }),
            ],
        ),
        panel(
            "another session's acquire + release at N held",
            axes("cycle", Unit::Nanos),
            vec![
                on("library p99", BLUE, false, |h| as_f64(h.probe.1)),
                on("library p50", GREEN, false, |h| as_f64(h.probe.0)),
                on("raw p99", RED, true, |h| as_f64(h.raw_probe.1)),
            ],
        ),
        panel(
            "client bytes per held lock",
            axes("bytes", Unit::Plain),
            vec![
                on("heap", BLUE, false, |h| h.heap_per_lock),
                on("RSS", ORANGE, false, |h| h.rss_per_lock.unwrap_or(0.0)),
            ],
        ),
    ]
}
