//! Scenario `scale`: how each cost grows, beside raw tokio-postgres where there is an
//! equivalent: held locks ([`held`], with the observation reads' costs at each count,
//! [`read_costs`]), waiters on one key ([`waiters`]) and groups ([`group`]). It needs a
//! server sized for it (`cargo xtask bench --only scale` starts one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_leader::{LeaderElection, LeaderWatch};
use locks_port::{AcquireOptions, DistributedLock, LeaderBoard, LockGuard, LockRegistry};
use locks_port::{PermitGuard, Semaphore, lock_id};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::Client;
use locks_shard::{ShardGroup, ShardMember, ShardTerms};
use locks_shard_postgres::PostgresShardTerms;
use serde_json::json;

use crate::chart::{BLUE, Curve, GREEN, ORANGE, Panel, RED, Unit, curves_svg};
use crate::clients::{self, Op};
use crate::db::{Database, NOT_HELD, Raw, each, open_pool, show};
use crate::harness::{self, Cell, Outcome};
use crate::stats::{Latencies, allocated_bytes, fairness, fmt_bytes, fmt_ns, fmt_ratio};
use crate::stats::{nanos, ratio, rss_bytes};
use crate::turns::{Contender, Turns};
use crate::{BoxError, Plan, Result};

/// Connections of the holding manager (and the raw holder) up to 100,000 held locks; past
/// that, one per 2,000 (a session's statements cost the server more the more it holds).
const CONNECTIONS: usize = 50;
const LOCKS_PER_CONNECTION: usize = 2_000;
/// Acquisitions in flight while growing; probe cycles at each count (and beside a read).
const IN_FLIGHT: usize = 32;
const PROBE_CYCLES: usize = 300;
/// An acquisition taking longer has stalled: the curve stops there, and a note says so.
const STALL: Duration = Duration::from_secs(60);
/// The cycle beside each read looping, and as long without, in alternating windows.
const OBSERVE_WINDOW: Duration = Duration::from_secs(10);
const ROUNDS: u32 = 5;
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);
const LEADER: &str = "bench:scale";
/// Waiter counts, and how long a waiter holds the lock; group sizes.
const WAITERS: [usize; 4] = [4, 32, 256, 1000];
const HOLD: Duration = Duration::from_millis(1);
const GROUPS: [usize; 4] = [1, 10, 100, 1000];
const APP: &str = "lock-bench-scale";
const SETTINGS: [&str; 6] = [
    "max_locks_per_transaction",
    "max_connections",
    "max_prepared_transactions",
    "shared_buffers",
    "shared_memory_size",
    "server_version",
];

fn connections(max: usize) -> usize {
    max.div_ceil(LOCKS_PER_CONNECTION).max(CONNECTIONS)
}

/// At least `count` cycles of `probe` (a cycle of one key), and for at least `window`.
async fn record(probe: &Op, count: usize, window: Duration) -> Result<Latencies> {
    let (end, count) = (Instant::now() + window, u64::try_from(count)?);
    let (_, latencies) = harness::until(end, count, true, async || probe.cycle(0).await).await?;
    Ok(latencies)
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome> {
    let admin = db.connect("lock-bench-admin").await?;
    let mut settings = Vec::new();
    for name in SETTINGS {
        settings.push(format!("{name} = {}", show(&admin, name).await?));
    }
    let settings = settings.join(", ");
    let usage = locks_postgres::lock_table_usage(&admin).await?;
    let max_connections: usize = show(&admin, "max_connections").await?.parse().unwrap_or(0);
    let needed = (plan.scale_max as f64).mul_add(1.2, 10_000.0) as u64;
    let holding = connections(plan.scale_max);
    if usage.capacity < needed || max_connections < holding * 2 + 20 {
        let (capacity, locks, opens) = (usage.capacity, plan.scale_max, WAITERS[3] + 20);
        return Err(format!(
            "the server's lock table holds {capacity} entries and it allows {max_connections} \
             connections; the scale scenario holds {locks} locks and opens up to {opens} \
             connections: run it with `cargo xtask bench --only scale`, which starts a server \
             sized for it"
        )
        .into());
    }
    let held = held(db, plan, &admin).await;
    let (held, stall) = held.map_err(|error| format!("scale, held locks: {error}"))?;
    // Each waiter has its own connection: as many as the server allows.
    let room = max_connections.saturating_sub(40);
    let (waiter_counts, skipped): (Vec<usize>, Vec<usize>) =
        (WAITERS.iter()).partition(|w| **w <= room && (!plan.quick || **w <= 256));
    let mut waiters = Vec::new();
    for count in waiter_counts {
        let point = self::waiters(db, plan, &admin, count).await;
        waiters.push(point.map_err(|error| format!("scale, {count} waiters: {error}"))?);
    }
    let mut groups = Vec::new();
    for size in GROUPS {
        let point = group(db, plan, size).await;
        groups.push(point.map_err(|error| format!("scale, a group of {size}: {error}"))?);
    }

    let per_connection = (plan.scale_max * 3 / 2).div_ceil(holding);
    let title = "17. Scale: held locks, observation reads, waiters, groups";
    let mut out = Outcome::new("scale", title);
    let (gauge, observe) = (GAUGE_INTERVAL.as_secs(), OBSERVE_WINDOW.as_secs());
    out.note(format!(
        "Server: {settings}. One manager holds the locks, multiplexed \
         (`multiplex({per_connection})`) on {holding} connections, {IN_FLIGHT} \
         acquisitions in flight; raw: `pg_advisory_lock` over {holding} \
         connections, {IN_FLIGHT} in flight. Cycle: another manager's (raw: another \
         connection's) acquire + release of one key, {PROBE_CYCLES} at each count. \
         Bytes and CPU a lock: the process's heap (counting allocator) and RSS growth \
         since the warmed, empty manager, and CPU a second at rest minus that with \
         nothing held. Reads (a leader holds the election `who_leads` reads, with a \
         board; observers at an interval: a leader watch, the gauge every {gauge} s, a \
         semaphore of 2 acquired and released in a loop; a shard group's `owners()`, what \
         a member's tick reads, with a member of 4 shards running: from the roster, and \
         from `pg_locks` as before it): each one's own p50 while it loops, and the cycle \
         p99 over {observe} s beside it ÷ over {observe} s without, in {ROUNDS} alternating \
         windows a side, pooled."
    ));
    out.note(format!(
        "Waiters: N tasks (each its own connection, library `Queue`, no timeout) acquire \
         / hold {} / release one key; handoff = release → next grant; fairness = most ÷ \
         fewest turns. Groups: `acquire_many` + release against one `pg_advisory_lock` \
         over `unnest` + one unlock statement, p50.",
        fmt_ns(nanos(HOLD))
    ));
    if let Some(stall) = &stall {
        out.note(format!(
            "**The held-lock curve stalled** {stall} (no acquisition returned within {} s; \
             the larger counts are not measured).",
            STALL.as_secs()
        ));
    }
    if !skipped.is_empty() {
        out.note(format!(
            "Not measured here: {skipped:?} waiters ({} mode, or more connections than the \
             server allows).",
            plan.mode()
        ));
    }
    let rows = (held.iter().map(Held::row))
        .chain(waiters.iter().map(Waiters::row))
        .chain(groups.iter().map(Group::row));
    let reads = "Reads (and the cycle p99 while looping) / ratio";
    let columns = ["Point", "Time", "Cost", reads];
    rows.for_each(|row| out.row(columns.into_iter().zip(row.map(Cell::from)).collect()));
    let title = "Scale: how each cost grows (log-log)";
    let notes = format!("Server: {settings}.");
    let svg = curves_svg(title, &panels(&held, &waiters, &groups), 4, &[&notes])?;
    out.files.push(("scale.svg", svg));
    Ok(out.with(json!({ "held": held, "waiters": waiters, "groups": groups })))
}

/// The held-lock curve at one count (durations in ns; CPU ns a second at rest per lock).
#[derive(Debug, serde::Serialize)]
struct Held {
    count: usize,
    reach: u64,
    raw_reach: u64,
    probe: [u64; 2],
    raw_probe: [u64; 2],
    heap_per_lock: f64,
    rss_per_lock: Option<f64>,
    cpu_per_lock: f64,
    advisory: u64,
    capacity: u64,
    reads: Vec<ReadCost>,
}

impl Held {
    fn row(&self) -> [String; 4] {
        let reads: Vec<String> = (self.reads.iter())
            .map(|r| format!("{} {} (p99 ×{:.2})", r.read, fmt_ns(r.own), r.slowdown()))
            .collect();
        let (reach, raw) = (self.reach as f64 / 1e9, self.raw_reach as f64 / 1e9);
        let slower = reach / raw.max(1e-9);
        let ([p50, p99], [raw_p50, raw_p99]) = (self.probe.map(fmt_ns), self.raw_probe.map(fmt_ns));
        let (heap, cpu) = (fmt_bytes(self.heap_per_lock), self.cpu_per_lock);
        let rss = self.rss_per_lock.map_or("?".to_owned(), fmt_bytes);
        let (advisory, capacity) = (self.advisory, self.capacity);
        let share = 100.0 * advisory as f64 / capacity.max(1) as f64;
        [
            format!("{} held", self.count),
            format!(
                "reach {reach:.2} s (raw {raw:.2} s, ×{slower:.1}); cycle p50 {p50} p99 {p99} \
                 (raw {raw_p50} / {raw_p99})"
            ),
            format!(
                "{heap} heap, {rss} RSS, {cpu:.1} ns CPU/s a lock at rest; table {advisory} / \
                 {capacity} ({share:.0}%)"
            ),
            reads.join("; "),
        ]
    }
}

/// CPU nanoseconds a second this process spends at rest over `window`.
async fn cpu_at_rest(window: Duration) -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let ns = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e9 + t.tv_usec() as f64 * 1e3;
    let cpu = || {
        getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| ns(u.user_time()) + ns(u.system_time()))
    };
    let (before, wall) = (cpu(), Instant::now());
    tokio::time::sleep(window).await;
    (cpu() - before).max(0.0) / wall.elapsed().as_secs_f64()
}

/// Takes and keeps keys `from..to`, [`IN_FLIGHT`] at once: with the holding manager, or
/// raw `pg_advisory_lock` over `clients`, each pipelining its share.
async fn grow(
    holder: Result<PostgresLockManager, Arc<Vec<Raw>>>,
    run: u32,
    (from, to): (usize, usize),
) -> Result<()> {
    let stalled = || format!("an acquisition waited over {} s", STALL.as_secs());
    let grown = each(from..to, IN_FLIGHT, move |n| {
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
    });
    grown.await.map(drop)
}

/// The held-lock curve: one manager multiplexed grows to 10³, 10⁴, … `--scale-max` held
/// locks, measured at each, then raw SQL to the same counts; and where it stalled.
async fn held(db: &Database, plan: &Plan, admin: &Client) -> Result<(Vec<Held>, Option<String>)> {
    let powers = std::iter::successors(Some(1000usize), |c| c.checked_mul(10));
    let mut counts: Vec<usize> = powers.take_while(|c| *c < plan.scale_max).collect();
    counts.push(plan.scale_max);
    let holding = connections(plan.scale_max);
    let per_connection = (plan.scale_max * 3 / 2).div_ceil(holding);
    let pool = open_pool(db, holding, APP).await?;
    let holder = PostgresLockManager::builder(pool)
        .multiplex(per_connection)
        .build();
    let manager = async |size, app| {
        Ok::<_, BoxError>(PostgresLockManager::new(open_pool(db, size, app).await?))
    };
    // Another manager's cycle of one key, and raw SQL's.
    let (key, app) = ("bench:scale:probe", "lock-bench-scale-probe");
    let keys = vec![key.to_owned()];
    let probe = Op::Acquire(manager(2, app).await?, keys, AcquireOptions::new());
    let raw = Raw::connect(db, app, false).await?;
    let raw_probe = Op::RawPrepared(raw, vec![lock_id(key)], false);
    let observer = manager(3, "lock-bench-scale-observer").await?;
    // A leader holds the election the reads watch, with a board.
    locks_postgres::install_leader_board(admin).await?;
    let leader = manager(4, "lock-bench-scale-leader").await?;
    let leading = tokio::spawn(async move {
        let election = LeaderElection::new(leader.clone(), LEADER).board(leader);
        election.run(|_| std::future::pending::<()>()).await
    });
    // A member of a shard group of 4 runs, for the shard owners reads.
    locks_shard_postgres::install_shard_terms(admin).await?;
    let group = ShardGroup::new("bench:scale:shards", (0..4).map(|i| format!("s{i}")))?;
    let terms = PostgresShardTerms::new(open_pool(db, 2, "lock-bench-scale-terms").await?);
    let pool = open_pool(db, 6, "lock-bench-scale-member").await?;
    let member = PostgresLockManager::builder(pool)
        .holder_id("bench-member")
        .build();
    let member = ShardMember::new(member, terms.clone(), group.clone());
    let membering =
        tokio::spawn(async move { member.run(|_, stop| async move { _ = stop.await }).await });
    let sharded = Arc::new((group, terms));
    record(&probe, 50, Duration::ZERO).await?;
    record(&raw_probe, 50, Duration::ZERO).await?;
    let rest = Duration::from_secs(plan.pick(1, 3));
    let idle_cpu = cpu_at_rest(rest).await;
    let (heap0, rss0) = (allocated_bytes(), rss_bytes());
    let run = std::process::id();
    // p50 and p99, not the histogram (whose memory would count as the locks').
    let cycles = async |probe| {
        let latencies = record(probe, PROBE_CYCLES, Duration::ZERO).await?;
        Ok::<_, BoxError>([latencies.p50(), latencies.p99()])
    };

    let mut points = Vec::new();
    let started = Instant::now();
    // The time spent growing only, not measuring.
    let (mut reach, mut from, mut stall) = (Duration::ZERO, 0, None);
    for &count in &counts {
        let growing = Instant::now();
        let grown = grow(Ok(holder.clone()), run, (from, count)).await;
        reach += growing.elapsed();
        if let Err(error) = grown {
            let held = holder.held_lock_count();
            let after = started.elapsed().as_secs_f64();
            let message =
                format!("on the way to {count}, at {held} held after {after:.0} s: {error}");
            eprintln!("lock-bench: scale: stalled {message}");
            stall = Some(message);
            break;
        }
        from = count;
        let held = holder.held_lock_count();
        if held != count {
            return Err(format!("the holding manager holds {held} locks, expected {count}").into());
        }
        let per_lock = |bytes: f64| bytes / count as f64;
        let heap = per_lock(allocated_bytes().saturating_sub(heap0) as f64);
        let rss = (rss_bytes().zip(rss0)).map(|(now, before)| per_lock(now as f64 - before as f64));
        let cpu = per_lock(cpu_at_rest(rest).await - idle_cpu);
        let usage = locks_postgres::lock_table_usage(admin).await?;
        let (probe_at, raw_probe_at) = (cycles(&probe).await?, cycles(&raw_probe).await?);
        let reads = read_costs(&observer, &sharded, &probe).await?;
        let (took, p99) = (reach.as_secs_f64(), fmt_ns(probe_at[1]));
        let (heap_, rss_) = (fmt_bytes(heap), rss.map_or("?".to_owned(), fmt_bytes));
        eprintln!(
            "lock-bench: scale: {count} held in {took:.1} s; probe p99 {p99}; {heap_} heap, \
             {rss_} RSS a lock"
        );
        points.push(Held {
            count,
            reach: nanos(reach),
            raw_reach: 0,
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
    let (started, mut from) = (Instant::now(), 0);
    for point in &mut points {
        grow(Err(Arc::clone(&clients)), run, (from, point.count)).await?;
        point.raw_reach = nanos(started.elapsed());
        from = point.count;
    }
    drop(clients);
    db.sessions(admin, APP, 0).await?;
    Ok((points, stall))
}

/// The observation reads; the first three loop back to back.
const READS: [&str; 9] = [
    "holders(key)",
    "lock_table_usage()",
    "who_leads()",
    "watch() at its interval",
    "watch() without a board",
    "lock_table_usage() every 5 s",
    "permit acquire + release",
    "shard owners()",
    "shard owners() from pg_locks",
];

/// One call of read `name` (a watch, or the gauge, runs until aborted).
async fn read(
    name: &str,
    observer: &PostgresLockManager,
    (group, terms): &(ShardGroup, PostgresShardTerms),
) -> Result<()> {
    let election = || LeaderElection::new(observer.clone(), LEADER);
    match name {
        "holders(key)" => drop(observer.holders("bench:scale:probe").await?),
        "lock_table_usage()" => drop(observer.lock_table_usage().await?),
        "who_leads()" => drop(election().board(observer.clone()).who_leads().await?),
        "watch() at its interval" => watch(election().board(observer.clone()).watch()).await?,
        // The leader from `permit_holders` (`pg_locks`), as before the board.
        "watch() without a board" => watch(election().watch()).await?,
        "lock_table_usage() every 5 s" => loop {
            observer.lock_table_usage().await?;
            tokio::time::sleep(GAUGE_INTERVAL).await;
        },
        "permit acquire + release" => {
            let permit = observer.acquire_permit("bench:scale:permits", 2, AcquireOptions::new());
            permit.await?.release().await;
        }
        // A member's tick read: from the roster, or from `pg_locks` as before it.
        "shard owners()" => drop(locks_shard::owners(observer, terms, group).await?),
        _ => {
            drop(observer.permit_holders(&group.members_name()).await?);
            drop(terms.terms(group.name()).await?);
        }
    }
    Ok(())
}

async fn watch<S: Semaphore, B: LeaderBoard>(mut watch: LeaderWatch<'_, S, B>) -> Result<()> {
    loop {
        watch.changed().await?;
    }
}

/// One read's own p50, and the probe's cycle p99 while it looped and without it.
#[derive(Debug, serde::Serialize)]
struct ReadCost {
    read: &'static str,
    own: u64,
    calls: u64,
    probe_p99: u64,
    quiet_p99: u64,
}

impl ReadCost {
    fn slowdown(&self) -> f64 {
        self.probe_p99 as f64 / self.quiet_p99.max(1) as f64
    }
}

/// Each read's costs: windows of the cycle without the read and beside it looping,
/// alternating, so that the machine's load drifting weighs on both sides alike.
async fn read_costs(
    observer: &PostgresLockManager,
    sharded: &Arc<(ShardGroup, PostgresShardTerms)>,
    probe: &Op,
) -> Result<Vec<ReadCost>> {
    let window = OBSERVE_WINDOW / ROUNDS;
    let cycles = PROBE_CYCLES.div_ceil(ROUNDS as usize);
    let mut costs = Vec::new();
    for name in READS {
        let (mut with, mut without) = (Latencies::default(), Latencies::default());
        let (mut own, mut calls) = (Latencies::default(), 0);
        for _ in 0..ROUNDS {
            without.merge(&record(probe, cycles, window).await?);
            let (observer, sharded) = (observer.clone(), Arc::clone(sharded));
            let end = Instant::now() + window;
            let looping = tokio::spawn(harness::until(end, 1, true, async move || {
                read(name, &observer, &sharded).await
            }));
            with.merge(&record(probe, cycles, window).await?);
            if name.starts_with("watch") || name.ends_with("every 5 s") {
                looping.abort();
            } else {
                let (n, its) = looping.await??;
                own.merge(&its);
                calls += n;
            }
        }
        let (own, probe_p99, quiet_p99) = (own.p50(), with.p99(), without.p99());
        let cost = ReadCost {
            read: name,
            own,
            calls,
            probe_p99,
            quiet_p99,
        };
        let [own, with, without] = [own, probe_p99, quiet_p99].map(fmt_ns);
        let slowdown = cost.slowdown();
        eprintln!(
            "lock-bench: scale: {name}: own p50 {own} ({calls} calls); cycle p99 {with} \
             (×{slowdown:.2} of {without})"
        );
        costs.push(cost);
    }
    Ok(costs)
}

/// Handoff p99 and fairness of the library (`Queue`) and raw, `waiters` on one key.
#[derive(Debug, serde::Serialize)]
struct Waiters {
    waiters: usize,
    library: (u64, f64),
    raw: (u64, f64),
}

impl Waiters {
    fn row(&self) -> [String; 4] {
        let (library, raw) = (self.library, self.raw);
        [
            format!("{} waiters, one key", self.waiters),
            format!("handoff p99 {} (raw {})", fmt_ns(library.0), fmt_ns(raw.0)),
            format!("fairness {:.2} (raw {:.2})", library.1, raw.1),
            String::new(),
        ]
    }
}

async fn waiters(db: &Database, plan: &Plan, admin: &Client, waiters: usize) -> Result<Waiters> {
    const APP: &str = "lock-bench-scale-waiters";
    let length = plan.window().max(HOLD * u32::try_from(waiters * 12)?);
    let mut sides = [(0, 0.0); 2];
    for side in harness::order(waiters, 2) {
        let mut turns = Turns::new([Contender::Queue, Contender::Raw][side], waiters);
        let (key, hold) = ("bench:scale:waiters".to_owned(), |_, _| HOLD);
        turns.window(db, (APP, false), key, length, hold).await?;
        let gaps = Latencies::of(&turns.take().gaps);
        sides[side] = (gaps.p99(), fairness(&turns.windows[0]));
        db.sessions(admin, APP, 0).await?;
    }
    let [library, raw] = sides;
    Ok(Waiters {
        waiters,
        library,
        raw,
    })
}

/// The p50 of `acquire_many` + release of `keys` keys, and of raw's two statements.
#[derive(Debug, serde::Serialize)]
struct Group {
    keys: usize,
    library: u64,
    raw: u64,
}

impl Group {
    fn row(&self) -> [String; 4] {
        let per = |total: u64| fmt_ns(total / self.keys.max(1) as u64);
        [
            format!("acquire_many of {}", self.keys),
            format!("p50 {} (raw {})", fmt_ns(self.library), fmt_ns(self.raw)),
            format!("{} a key (raw {})", per(self.library), per(self.raw)),
            fmt_ratio(ratio(self.library as f64, self.raw as f64)),
        ]
    }
}

async fn group(db: &Database, plan: &Plan, keys: usize) -> Result<Group> {
    const APP: &str = "lock-bench-scale-groups";
    let manager = PostgresLockManager::new(open_pool(db, 1, APP).await?);
    let client = db.connect(APP).await?;
    let lock = "SELECT count(pg_advisory_lock(id)) FROM \
                (SELECT id FROM unnest($1::int8[]) AS id ORDER BY id) AS ordered";
    let lock = client.prepare(lock).await?;
    let unlock = "SELECT bool_and(pg_advisory_unlock(id)) FROM unnest($1::int8[]) AS id";
    let unlock = client.prepare(unlock).await?;
    let names = clients::keys("bench:scale:group", keys);
    let ids: Vec<i64> = names.iter().map(|k| lock_id(k)).collect();
    let sides = harness::alternate(plan.pick(2, 3), async |_, side| {
        let end = Instant::now() + plan.window() / 2;
        let (_, measured) = harness::until(end, 3, true, async || {
            if side == 0 {
                let group = manager.acquire_many(&names, AcquireOptions::new()).await?;
                group.release().await;
            } else {
                client.execute(&lock, &[&ids]).await?;
                let all: Option<bool> = client.query_one(&unlock, &[&ids]).await?.get(0);
                if all != Some(true) {
                    return Err(NOT_HELD.into());
                }
            }
            Ok(())
        })
        .await?;
        Ok(measured)
    })
    .await?;
    let [library, raw] = sides.each_ref().map(|side| Latencies::merged(side).p50());
    Ok(Group { keys, library, raw })
}

fn panels(held: &[Held], waiters: &[Waiters], groups: &[Group]) -> Vec<Panel> {
    let on_held = |label: &str, color, dashed, y: &dyn Fn(&Held) -> f64| {
        let points = held.iter().map(|h| (h.count as f64, y(h)));
        Curve(label.to_owned(), color, dashed, points.collect())
    };
    let reads = |label: &dyn Fn(&str) -> String, y: &dyn Fn(&ReadCost) -> f64| {
        let read = |(i, color)| on_held(&label(READS[i]), color, false, &|h| y(&h.reads[i]));
        (0..).zip([BLUE, ORANGE, GREEN]).map(read).collect()
    };
    let on_waiters = |label: &str, color, dashed, f: fn(&Waiters) -> u64| {
        let points = waiters.iter().map(|w| (w.waiters as f64, f(w) as f64));
        Curve(label.to_owned(), color, dashed, points.collect())
    };
    let per_key = |label: &str, color, dashed, f: fn(&Group) -> u64| {
        let points = groups
            .iter()
            .map(|g| (g.keys as f64, f(g) as f64 / g.keys as f64));
        Curve(label.to_owned(), color, dashed, points.collect())
    };
    let held_axes = |y: &'static str, unit| ("held locks", y, unit);
    vec![
        Panel(
            "time to hold N locks",
            held_axes("time", Unit::Nanos),
            vec![
                on_held("library, multiplexed", BLUE, false, &|h| h.reach as f64),
                on_held("raw pg_advisory_lock", RED, true, &|h| h.raw_reach as f64),
            ],
        ),
        Panel(
            "another session's acquire + release at N held",
            held_axes("cycle", Unit::Nanos),
            vec![
                on_held("library p99", BLUE, false, &|h| h.probe[1] as f64),
                on_held("library p50", GREEN, false, &|h| h.probe[0] as f64),
                on_held("raw p99", RED, true, &|h| h.raw_probe[1] as f64),
            ],
        ),
        Panel(
            "client bytes per held lock",
            held_axes("bytes", Unit::Plain),
            vec![
                on_held("heap", BLUE, false, &|h| h.heap_per_lock),
                on_held("RSS", ORANGE, false, &|h| h.rss_per_lock.unwrap_or(0.0)),
            ],
        ),
        Panel(
            "one observation read's own time",
            held_axes("time", Unit::Nanos),
            reads(&str::to_owned, &|r| r.own as f64),
        ),
        Panel(
            "cycle p99 while a read loops ÷ without",
            held_axes("ratio", Unit::Plain),
            reads(&|name| format!("while {name} loops"), &ReadCost::slowdown),
        ),
        Panel(
            "handoff p99, waiters on one key",
            ("waiters", "release → grant", Unit::Nanos),
            vec![
                on_waiters("library (Queue)", BLUE, false, |w| w.library.0),
                on_waiters("raw", RED, true, |w| w.raw.0),
            ],
        ),
        Panel(
            "acquire_many + release, per key",
            ("keys in the group", "per key", Unit::Nanos),
            vec![
                per_key("library", BLUE, false, |g| g.library),
                per_key("raw (one statement)", RED, true, |g| g.raw),
            ],
        ),
    ]
}
