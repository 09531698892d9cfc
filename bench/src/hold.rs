//! Scenario `hold` (5): many locks held at once by one manager. Unmultiplexed, 500 locks
//! (100 in quick mode) on a pool of as many, against as many raw connections: client
//! memory per held lock, connections per held lock, and `release_all` against the unlocks
//! one after another. Multiplexed ([`multiplexed`]), 10,000 locks on at most 100
//! connections (`multiplex(100)`): its acquire against the unmultiplexed manager's in the
//! same run, and `release_all` of them all.

use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, LockRegistry, lock_id};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::Client;
use serde_json::{Value, json};

use crate::db::{Database, granted_advisory_locks};
use crate::harness::{self, Outcome, cells};
use crate::stats::{Latencies, allocated_bytes, rss_bytes};
use crate::stats::{as_f64, fmt_bytes, fmt_ns, fmt_ratio, median, nanos, ratio};
use crate::{BoxError, Plan};

/// "A small client-side footprint": the manager's own bookkeeping per held lock, on top
/// of the connection the lock needs anyway.
const BOOKKEEPING_LIMIT: f64 = 1024.0;

const LIBRARY_APP: &str = "lock-bench-hold-library";
const RAW_APP: &str = "lock-bench-hold-raw";

/// The multiplexed manager's held locks and connections, its batches of acquisitions
/// (alternating with the unmultiplexed manager's), and its targets.
const MUX_LOCKS: usize = 10_000;
const MUX_CONNECTIONS: usize = 100;
const MUX_BATCH: usize = 100;
const MUX_ACQUIRE_LIMIT: f64 = 1.2;
const MUX_RELEASE_ALL_LIMIT: Duration = Duration::from_secs(1);
const MUX_APP: &str = "lock-bench-multiplex";

/// Live heap bytes and resident memory at one point.
#[derive(Debug, Clone, Copy)]
struct Memory {
    heap: usize,
    rss: Option<usize>,
}

impl Memory {
    fn now() -> Self {
        Self {
            heap: allocated_bytes(),
            rss: rss_bytes(),
        }
    }

    /// Heap bytes per lock from `self` to `later`.
    fn heap_per(self, later: Self, count: usize) -> f64 {
        (as_f64(later.heap as u64) - as_f64(self.heap as u64)) / as_f64(count as u64)
    }

    fn rss_per(self, later: Self, count: usize) -> Option<f64> {
        Some((as_f64(later.rss? as u64) - as_f64(self.rss? as u64)) / as_f64(count as u64))
    }
}

/// The median over `rounds` of each of their figures, as `{figure}_median` (null where a
/// round lacks it), and the rounds themselves.
fn summary(rounds: &[Value]) -> Value {
    let mut out = serde_json::Map::new();
    for key in rounds
        .first()
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|r| r.keys())
    {
        let values: Option<Vec<f64>> = rounds.iter().map(|r| r[key].as_f64()).collect();
        out.insert(format!("{key}_median"), json!(values.map(|v| median(&v))));
    }
    out.insert("rounds".to_owned(), json!(rounds));
    Value::Object(out)
}

async fn library_round(
    db: &Database,
    admin: &Client,
    count: usize,
    round: usize,
) -> Result<Value, BoxError> {
    let keys: Vec<String> = (0..count)
        .map(|n| format!("bench:hold:{round}:{n}"))
        .collect();
    let mut guards = Vec::with_capacity(count);
    let pool = db.pool(count, LIBRARY_APP);

    let empty = Memory::now();
    db.warm(&pool, count).await?;
    let connected = Memory::now();
    // Every connection takes and gives back one lock (of keys of its own) through the
    // manager measured next, so what a connection keeps after its first lock (its set-up
    // and prepared statements, which the manager knows per connection) is counted apart
    // from the bookkeeping. (A throwaway manager for this, as before, left the measured
    // manager to prepare every statement again on every connection, and credited that
    // to its bookkeeping: 1.2 KiB "per held lock" with 500 locks, 0.7 KiB with 100.)
    let manager = PostgresLockManager::new(pool.clone());
    for n in 0..count {
        manager
            .acquire(
                &format!("bench:hold:{round}:prime:{n}"),
                AcquireOptions::new(),
            )
            .await?
            .into_held();
    }
    manager.release_all().await;
    let primed = Memory::now();

    let before_locks = Memory::now();
    for key in &keys {
        guards.push(manager.acquire(key, AcquireOptions::new()).await?);
    }
    let with_guards = Memory::now();
    for guard in guards.drain(..) {
        // The lock stays with the manager; only the bookkeeping entry remains.
        drop(guard.into_held());
    }
    let held = Memory::now();

    let pool_size = pool.status().size;
    let held_count = manager.held_lock_count();
    let sessions = db
        .sessions(admin, LIBRARY_APP, i64::try_from(count)?)
        .await?;
    let granted = granted_advisory_locks(admin, LIBRARY_APP).await?;

    let started = Instant::now();
    let released = manager.release_all().await;
    let release_all = started.elapsed();

    drop(manager);
    drop(pool);
    db.sessions(admin, LIBRARY_APP, 0).await?;
    Ok(json!({
        "connection_heap_bytes": empty.heap_per(connected, count),
        "connection_rss_bytes": empty.rss_per(connected, count),
        "connection_after_first_lock_heap_bytes": connected.heap_per(primed, count),
        "bookkeeping_heap_bytes": before_locks.heap_per(held, count),
        "guard_heap_bytes": held.heap_per(with_guards, count),
        "pool_size": pool_size,
        "held_lock_count": held_count,
        "sessions": sessions,
        "granted_advisory_locks": granted,
        "released": released,
        "release_all_s": release_all.as_secs_f64(),
    }))
}

async fn raw_round(
    db: &Database,
    admin: &Client,
    count: usize,
    round: usize,
) -> Result<Value, BoxError> {
    let ids: Vec<i64> = (0..count)
        .map(|n| lock_id(&format!("bench:hold-raw:{round}:{n}")))
        .collect();
    let mut clients = Vec::with_capacity(count);
    let empty = Memory::now();
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..count {
        let db = db.clone();
        opening.spawn(async move { db.connect(RAW_APP).await });
    }
    while let Some(joined) = opening.join_next().await {
        clients.push(joined??);
    }
    let connected = Memory::now();
    for (client, id) in clients.iter().zip(&ids) {
        client
            .simple_query(&format!("SELECT pg_advisory_lock({id})"))
            .await?;
    }
    let locked = Memory::now();
    let sessions = db.sessions(admin, RAW_APP, i64::try_from(count)?).await?;
    let granted = granted_advisory_locks(admin, RAW_APP).await?;

    let started = Instant::now();
    for (client, id) in clients.iter().zip(&ids) {
        client
            .simple_query(&format!("SELECT pg_advisory_unlock({id})"))
            .await?;
    }
    let release_all = started.elapsed();
    drop(clients);
    db.sessions(admin, RAW_APP, 0).await?;
    Ok(json!({
        "connection_heap_bytes": empty.heap_per(connected, count),
        "connection_rss_bytes": empty.rss_per(connected, count),
        "locked_heap_bytes": connected.heap_per(locked, count),
        "sessions": sessions,
        "granted_advisory_locks": granted,
        "unlock_all_s": release_all.as_secs_f64(),
    }))
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let count = plan.hold_locks;
    let admin = db.connect("lock-bench-admin").await?;
    let mut library = Vec::new();
    let mut raw = Vec::new();
    harness::rounds(plan.hold_rounds, 2, async |round, side| {
        match side {
            0 => library.push(library_round(db, &admin, count, round).await?),
            _ => raw.push(raw_round(db, &admin, count, round).await?),
        }
        Ok(())
    })
    .await?;

    let expected = json!(count);
    let one_each = library.iter().all(|r| {
        let keys = ["pool_size", "held_lock_count", "released", "sessions"];
        keys.into_iter()
            .chain(["granted_advisory_locks"])
            .all(|k| r[k] == expected)
    });
    let (last, raw_last) = (
        library.last().ok_or("no round ran")?.clone(),
        raw.last().ok_or("no round ran")?.clone(),
    );
    let (library, raw) = (summary(&library), summary(&raw));
    let median = |side: &Value, key: &str| side[format!("{key}_median")].as_f64().unwrap_or(0.0);
    let bookkeeping = median(&library, "bookkeeping_heap_bytes");
    let bytes = |side: &Value, key: &str| fmt_bytes(median(side, key));
    let (release_all, raw_release_all) = (
        median(&library, "release_all_s"),
        median(&raw, "unlock_all_s"),
    );
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let as_ns = |s: f64| fmt_ns((s * 1e9) as u64);

    let header = ["Measure", "Library", "Baseline", "Target / ratio", "Result"];
    let title = format!(
        "5. Locks held at once by one manager: {count} (pool of {count}), and {MUX_LOCKS} \
         multiplexed on {MUX_CONNECTIONS} connections"
    );
    let mut out = Outcome::new("hold_many", title, &header);
    out.note(format!(
        "{} rounds, library and raw alternating; medians over rounds. Heap = live \
         bytes from a counting global allocator (RSS deltas, in the JSON, are \
         unreliable: pages freed by an earlier round are reused). \
         Connection cost: warming the pool ({count} connections, one query each); \
         then every connection takes and gives back one lock (through a throwaway \
         manager); bookkeeping: a fresh manager acquiring {count} locks, the guards \
         turned into held entries (`into_held`); guard: what the guards add while \
         kept. Baseline: {count} raw connections; for the multiplexed rows, an \
         unmultiplexed manager (pool of {MUX_BATCH}, warmed and primed; its locks released \
         after each batch, untimed) acquiring as many in batches of {MUX_BATCH} alternating \
         with the multiplexed manager's.",
        plan.hold_rounds
    ));
    let (pool, sessions) = (&last["pool_size"], &last["sessions"]);
    let granted = &last["granted_advisory_locks"];
    let [_, one_each_result] = out.gate(
        format!("{count} held locks: one connection each"),
        format!("pool {pool} / sessions {sessions} / granted {granted}"),
        format!("{count} each"),
        one_each,
    );
    let limit = format!("≤ {}", fmt_bytes(BOOKKEEPING_LIMIT));
    let small = bookkeeping <= BOOKKEEPING_LIMIT;
    let small = out.gate(
        "manager bookkeeping per held lock",
        fmt_bytes(bookkeeping),
        limit,
        small,
    );
    out.row(cells![
        "connections per held lock (pool size, sessions in pg_stat_activity, granted advisory locks)",
        format!("{pool} / {sessions} / {granted} for {count}"),
        format!(
            "{} / {} for {count}",
            raw_last["sessions"], raw_last["granted_advisory_locks"]
        ),
        "= 1 each",
        one_each_result,
    ]);
    out.row(cells![
        "client heap per connection (pool warmed, no lock)",
        bytes(&library, "connection_heap_bytes"),
        bytes(&raw, "connection_heap_bytes"),
        "",
        "",
    ]);
    out.row(cells![
        "heap a connection keeps after its first lock (library: its cached prepared statements; raw: a simple query's traces)",
        bytes(&library, "connection_after_first_lock_heap_bytes"),
        bytes(&raw, "locked_heap_bytes"),
        "",
        "",
    ]);
    out.row(cells![
        "manager bookkeeping per held lock (heap, beyond the lock's connection)",
        fmt_bytes(bookkeeping),
        "—",
        small[0],
        small[1],
    ]);
    out.row(cells![
        "guard per held lock (heap, while the caller keeps it)",
        bytes(&library, "guard_heap_bytes"),
        "—",
        "",
        "",
    ]);
    out.row(cells![
        format!("release_all of {count} (raw: {count} unlocks one after another)"),
        as_ns(release_all),
        as_ns(raw_release_all),
        fmt_ratio(ratio(release_all, raw_release_all)),
        "",
    ]);
    let multiplex = multiplexed(db, &admin, &mut out).await?;
    Ok(out.with(json!({
        "locks": count,
        "rounds": plan.hold_rounds,
        "library": library,
        "raw": raw,
        "multiplex": multiplex,
    })))
}

/// Acquires `count` fresh keys `{prefix}:{n}` with `manager`, keeping the locks, into
/// `latencies`.
async fn acquire_batch(
    manager: &PostgresLockManager,
    prefix: &str,
    count: usize,
    latencies: &mut Latencies,
) -> Result<(), BoxError> {
    for n in 0..count {
        let started = Instant::now();
        let guard = manager
            .acquire(&format!("{prefix}:{n}"), AcquireOptions::new())
            .await?;
        latencies.record(started.elapsed());
        drop(guard.into_held());
    }
    Ok(())
}

/// [`MUX_LOCKS`] locks held by one manager with `multiplex(100)` on a pool of
/// [`MUX_CONNECTIONS`], acquired in batches alternating with an unmultiplexed manager's;
/// then one `release_all`. Its rows and targets go to `out`; its JSON is returned.
async fn multiplexed(db: &Database, admin: &Client, out: &mut Outcome) -> Result<Value, BoxError> {
    let capacity = locks_postgres::lock_table_usage(admin).await?.capacity;
    if capacity < (MUX_LOCKS + MUX_LOCKS / 2) as u64 {
        return Err(format!(
            "the server's lock table holds {capacity} locks; {MUX_LOCKS} multiplexed locks \
             need room for more: raise max_locks_per_transaction"
        )
        .into());
    }
    let run = std::process::id();
    let (mux_pool, plain_pool) = (
        db.pool(MUX_CONNECTIONS, MUX_APP),
        db.pool(MUX_BATCH, "lock-bench-multiplex-plain"),
    );
    db.warm(&mux_pool, MUX_CONNECTIONS).await?;
    db.warm(&plain_pool, MUX_BATCH).await?;
    let per_connection = MUX_LOCKS / MUX_CONNECTIONS;
    let mux = PostgresLockManager::builder(mux_pool.clone())
        .multiplex(per_connection)
        .build();
    let plain = PostgresLockManager::new(plain_pool);
    // Every plain connection is set up once before anything is timed.
    let prime = format!("bench:mux-plain:{run}:prime");
    acquire_batch(&plain, &prime, MUX_BATCH, &mut Latencies::new()).await?;
    plain.release_all().await;
    let mut sides = [Latencies::new(), Latencies::new()];
    for batch in 0..MUX_LOCKS / MUX_BATCH {
        for side in harness::order(batch, 2) {
            let (manager, name) = if side == 0 {
                (&mux, "mux")
            } else {
                (&plain, "mux-plain")
            };
            let prefix = format!("bench:{name}:{run}:{batch}");
            acquire_batch(manager, &prefix, MUX_BATCH, &mut sides[side]).await?;
        }
        plain.release_all().await;
    }
    let held = mux.held_lock_count();
    let pool_size = mux_pool.status().size;
    let sessions = db
        .sessions(admin, MUX_APP, i64::try_from(MUX_CONNECTIONS)?)
        .await?;
    let granted = granted_advisory_locks(admin, MUX_APP).await?;
    let started = Instant::now();
    let released = mux.release_all().await;
    let release_all = started.elapsed();
    let left = granted_advisory_locks(admin, MUX_APP).await?;

    let [mux_acquire, plain_acquire] = &sides;
    let acquire_ratio = ratio(as_f64(mux_acquire.p50()), as_f64(plain_acquire.p50()));
    let few = held == MUX_LOCKS
        && granted == i64::try_from(MUX_LOCKS)?
        && pool_size <= MUX_CONNECTIONS
        && sessions <= i64::try_from(MUX_CONNECTIONS)?;
    let [_, few] = out.gate(
        format!("{MUX_LOCKS} held locks on at most {MUX_CONNECTIONS} connections"),
        format!("{granted} granted on {sessions} sessions (pool {pool_size})"),
        format!("≤ {MUX_CONNECTIONS}"),
        few,
    );
    let [_, fast] = out.gate(
        "multiplexed acquire p50 / unmultiplexed acquire p50",
        fmt_ratio(acquire_ratio),
        format!("≤ {MUX_ACQUIRE_LIMIT}x"),
        acquire_ratio.is_some_and(|r| r <= MUX_ACQUIRE_LIMIT),
    );
    let [_, quick] = out.gate(
        format!("release_all of {MUX_LOCKS} multiplexed locks"),
        fmt_ns(nanos(release_all)),
        format!("< {}", fmt_ns(nanos(MUX_RELEASE_ALL_LIMIT))),
        released == MUX_LOCKS && left == 0 && release_all < MUX_RELEASE_ALL_LIMIT,
    );
    let p50_p99 = |l: &Latencies| format!("{} ({})", fmt_ns(l.p50()), fmt_ns(l.p99()));
    out.row(cells![
        format!("`multiplex({per_connection})`: {MUX_LOCKS} held / granted in pg_locks / pool size / sessions"),
        format!("{held} / {granted} / {pool_size} / {sessions}"),
        "—",
        format!("≤ {MUX_CONNECTIONS} connections"),
        few,
    ]);
    out.row(cells![
        format!("multiplexed acquire p50 (p99), uncontended, lock kept; {MUX_LOCKS} samples each"),
        p50_p99(mux_acquire),
        p50_p99(plain_acquire),
        fmt_ratio(acquire_ratio),
        fast,
    ]);
    out.row(cells![
        format!("multiplexed release_all of {MUX_LOCKS} (then granted: {left})"),
        fmt_ns(nanos(release_all)),
        "—",
        format!("< {}", fmt_ns(nanos(MUX_RELEASE_ALL_LIMIT))),
        quick,
    ]);
    Ok(json!({
        "locks": MUX_LOCKS,
        "connections": MUX_CONNECTIONS,
        "held_lock_count": held,
        "granted_advisory_locks": granted,
        "pool_size": pool_size,
        "sessions": sessions,
        "acquire_multiplexed": mux_acquire.to_json(),
        "acquire_unmultiplexed": plain_acquire.to_json(),
        "acquire_p50_ratio": acquire_ratio,
        "release_all_s": release_all.as_secs_f64(),
        "released": released,
        "granted_after_release_all": left,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_each_figure_s_median_and_the_rounds() {
        let rounds = [
            json!({ "heap": 10.0, "rss": null, "sessions": 3 }),
            json!({ "heap": 30.0, "rss": 5.0, "sessions": 3 }),
            json!({ "heap": 20.0, "rss": 7.0, "sessions": 3 }),
        ];
        let summary = summary(&rounds);
        assert_eq!(summary["heap_median"], json!(20.0));
        assert_eq!(summary["rss_median"], Value::Null);
        assert_eq!(summary["sessions_median"], json!(3.0));
        assert_eq!(summary["rounds"], json!(rounds));
        assert_eq!(
            json!(3_i64),
            json!(3_usize),
            "counts compare across integer types"
        );
    }
}
