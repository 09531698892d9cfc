//! Scenario `hold`: 500 locks (100 quick) held by one manager on a pool of as many,
//! against as many raw connections; then 10,000 multiplexed on 100 ([`multiplexed`]).

use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, LockRegistry, lock_id};
use locks_postgres::PostgresLockManager as Manager;
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::Client;
use serde_json::{Value, json};

use crate::db::{Database, OPENING, each, granted_advisory_locks, open_pool};
use crate::harness::{self, Cell, Outcome, row};
use crate::stats::{Latencies, allocated_bytes, fmt_bytes, fmt_ns, median, nanos, ratio};
use crate::{Plan, Result};

/// The manager's bookkeeping per held lock, on top of the lock's connection.
const BOOKKEEPING_LIMIT: f64 = 1024.0;
const LIBRARY_APP: &str = "lock-bench-hold-library";
const RAW_APP: &str = "lock-bench-hold-raw";
const MUX_LOCKS: usize = 10_000;
const MUX_CONNECTIONS: usize = 100;
const MUX_BATCH: usize = 100;
const MUX_ACQUIRE_LIMIT: f64 = 1.2;
const MUX_RELEASE_ALL_LIMIT: Duration = Duration::from_secs(1);
const MUX_APP: &str = "lock-bench-multiplex";

pub(crate) fn locks(plan: &Plan) -> usize {
    plan.pick(100, 500)
}

fn heap_per(before: usize, count: usize) -> f64 {
    (allocated_bytes() as f64 - before as f64) / count as f64
}

/// `manager`'s held locks, pool size, sessions (awaited to be `expected`), granted locks;
/// then `release_all`: how many it released, in how long.
async fn census(
    (db, admin): (&Database, &Client),
    (manager, pool, app): (&Manager, &Pool, &str),
    expected: usize,
) -> Result<([i64; 4], usize, Duration)> {
    let sessions = db.sessions(admin, app, i64::try_from(expected)?).await?;
    let granted = granted_advisory_locks(admin, app).await?;
    let held = i64::try_from(manager.held_lock_count())?;
    let pool_size = i64::try_from(pool.status().size)?;
    let started = Instant::now();
    let released = manager.release_all().await;
    Ok((
        [held, pool_size, sessions, granted],
        released,
        started.elapsed(),
    ))
}

/// Acquires and keeps `count` fresh keys: each acquisition's time.
async fn acquire(manager: &Manager, prefix: &str, count: usize) -> Result<Latencies> {
    let mut latencies = Latencies::default();
    for n in 0..count {
        let acquire = async || {
            let key = format!("{prefix}:{n}");
            manager.acquire(&key, AcquireOptions::new()).await
        };
        drop(latencies.time(acquire).await?.into_held());
    }
    Ok(latencies)
}

async fn library_round(db: &Database, admin: &Client, count: usize, round: usize) -> Result<Value> {
    let empty = allocated_bytes();
    let pool = open_pool(db, count, LIBRARY_APP).await?;
    let connection = heap_per(empty, count);
    // What a connection keeps after its first lock (its statements), apart.
    let connected = allocated_bytes();
    let manager = Manager::new(pool.clone());
    let prefix = format!("bench:hold:{round}");
    acquire(&manager, &format!("{prefix}:prime"), count).await?;
    manager.release_all().await;
    let first_lock = heap_per(connected, count);
    let mut guards = Vec::with_capacity(count);
    let before_locks = allocated_bytes();
    for n in 0..count {
        let key = format!("{prefix}:{n}");
        guards.push(manager.acquire(&key, AcquireOptions::new()).await?);
    }
    let with_guards = allocated_bytes();
    // The locks stay with the manager; only the bookkeeping entries remain.
    guards.drain(..).for_each(|guard| drop(guard.into_held()));
    let (bookkeeping, guard) = (heap_per(before_locks, count), -heap_per(with_guards, count));
    let census = census((db, admin), (&manager, &pool, LIBRARY_APP), count).await?;
    let ([held, pool_size, sessions, granted], released, took) = census;
    drop((manager, pool));
    db.sessions(admin, LIBRARY_APP, 0).await?;
    Ok(json!({
        "connection_heap_bytes": connection,
        "connection_after_first_lock_heap_bytes": first_lock,
        "bookkeeping_heap_bytes": bookkeeping,
        "guard_heap_bytes": guard,
        "pool_size": pool_size,
        "held_lock_count": held,
        "sessions": sessions,
        "granted_advisory_locks": granted,
        "released": released,
        "release_all_s": took.as_secs_f64(),
    }))
}

/// `count` raw connections, a lock each, then the unlocks one after another.
async fn raw_round(db: &Database, admin: &Client, count: usize, round: usize) -> Result<Value> {
    let ids = (0..count).map(|n| lock_id(&format!("bench:hold-raw:{round}:{n}")));
    let statements = |word: &'static str| {
        ids.clone()
            .map(move |id| format!("SELECT pg_advisory_{word}({id})"))
    };
    let empty = allocated_bytes();
    let opener = db.clone();
    let connect = move |_| {
        let db = opener.clone();
        async move { db.connect(RAW_APP).await }
    };
    let clients = each(0..count, OPENING, connect).await?;
    // Less the vector that holds them (made after the count began, unlike the pool's).
    let connection = heap_per(empty, count) - std::mem::size_of::<Client>() as f64;
    let connected = allocated_bytes();
    for (client, lock) in clients.iter().zip(statements("lock")) {
        client.simple_query(&lock).await?;
    }
    let locked = heap_per(connected, count);
    let sessions = db.sessions(admin, RAW_APP, i64::try_from(count)?).await?;
    let granted = granted_advisory_locks(admin, RAW_APP).await?;
    let started = Instant::now();
    for (client, unlock) in clients.iter().zip(statements("unlock")) {
        client.simple_query(&unlock).await?;
    }
    let unlocked = started.elapsed();
    drop(clients);
    db.sessions(admin, RAW_APP, 0).await?;
    Ok(json!({
        "connection_heap_bytes": connection,
        "locked_heap_bytes": locked,
        "sessions": sessions,
        "granted_advisory_locks": granted,
        "unlock_all_s": unlocked.as_secs_f64(),
    }))
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome> {
    let (count, rounds) = (locks(plan), plan.pick(2, 3));
    let admin = db.connect("lock-bench-admin").await?;
    let sides = harness::alternate(rounds, async |round, side| match side {
        0 => library_round(db, &admin, count, round).await,
        _ => raw_round(db, &admin, count, round).await,
    })
    .await?;
    let [library, raw] = &sides;
    // A figure's median over the rounds of a side.
    let median =
        |rounds: &[Value], key: &str| median(rounds.iter().filter_map(|r| r[key].as_f64()));
    let bytes = |side: &[Value], key: &str| Cell::bytes(median(side, key));
    let seconds = |side: &[Value], key: &str| Cell::ns((median(side, key) * 1e9) as u64);
    let keys = [
        "pool_size",
        "held_lock_count",
        "released",
        "sessions",
        "granted_advisory_locks",
    ];
    let each_is_count = |round: &Value| keys.iter().all(|&k| round[k] == json!(count));
    let one_each = library.iter().all(each_is_count);
    let [last, raw_last] = sides.each_ref().map(|side| side.last().ok_or("no round"));
    let (last, raw_last) = (last?, raw_last?);
    let bookkeeping = median(library, "bookkeeping_heap_bytes");
    let release = median(library, "release_all_s");
    let release_ratio = ratio(release, median(raw, "unlock_all_s"));

    let title = format!(
        "5. Locks held at once by one manager: {count} (pool of {count}), and {MUX_LOCKS} \
         multiplexed on {MUX_CONNECTIONS} connections"
    );
    let mut out = Outcome::new("hold_many", title);
    out.note(format!(
        "{rounds} rounds, library and raw alternating; medians over rounds; heap = live bytes \
         (counting allocator). Multiplexed: batches of {MUX_BATCH} alternating with an \
         unmultiplexed manager's (pool of {MUX_BATCH})."
    ));
    let (pool, sessions) = (&last["pool_size"], &last["sessions"]);
    let granted = &last["granted_advisory_locks"];
    let name = format!("{count} held locks: one connection each");
    let measured = format!("pool {pool} / sessions {sessions} / granted {granted}");
    let [_, one_each_result] = out.gate(name, measured, format!("{count} each"), one_each);
    let limit = format!("≤ {}", fmt_bytes(BOOKKEEPING_LIMIT));
    let small = bookkeeping <= BOOKKEEPING_LIMIT;
    let name = "manager bookkeeping per held lock";
    let [limit, small] = out.gate(name, Cell::bytes(bookkeeping), limit, small);
    let raw_sessions = (&raw_last["sessions"], &raw_last["granted_advisory_locks"]);
    out.row(row![
        "Measure" => "connections per held lock (pool size, sessions in pg_stat_activity, \
                      granted advisory locks)",
        "Library" => format!("{pool} / {sessions} / {granted} for {count}"),
        "Baseline" => format!("{} / {} for {count}", raw_sessions.0, raw_sessions.1),
        "Target / ratio" => "= 1 each",
        "Result" => one_each_result,
    ]);
    let heap = |measure, key, raw_key: Option<&str>| {
        let raw = raw_key.map_or(Cell::from("—"), |key| bytes(raw, key));
        row!["Measure" => measure, "Library" => bytes(library, key), "Baseline" => raw]
    };
    let (connection, locked) = ("connection_heap_bytes", Some("locked_heap_bytes"));
    let measure = "client heap per connection (pool opened, no lock)";
    out.row(heap(measure, connection, Some(connection)));
    let measure = "heap a connection keeps after its first lock (library: its cached prepared \
                   statements; raw: a simple query's traces)";
    let after_first_lock = heap(measure, "connection_after_first_lock_heap_bytes", locked);
    out.row(after_first_lock);
    out.row(row![
        "Measure" => "manager bookkeeping per held lock (heap, beyond the lock's connection)",
        "Library" => Cell::bytes(bookkeeping),
        "Baseline" => "—",
        "Target / ratio" => limit,
        "Result" => small,
    ]);
    let guard = "guard per held lock (heap, while the caller keeps it)";
    out.row(heap(guard, "guard_heap_bytes", None));
    out.row(row![
        "Measure" => format!("release_all of {count} (raw: {count} unlocks one after another)"),
        "Library" => seconds(library, "release_all_s"),
        "Baseline" => seconds(raw, "unlock_all_s"),
        "Target / ratio" => Cell::ratio(release_ratio),
    ]);
    multiplexed(db, &admin, &mut out).await?;
    Ok(out.with(json!({ "rounds": { "library": library, "raw": raw } })))
}

/// [`MUX_LOCKS`] locks held by one manager on [`MUX_CONNECTIONS`], acquired in batches
/// alternating with an unmultiplexed manager's; then one `release_all`.
async fn multiplexed(db: &Database, admin: &Client, out: &mut Outcome) -> Result<()> {
    let capacity = locks_postgres::lock_table_usage(admin).await?.capacity;
    if capacity < (MUX_LOCKS + MUX_LOCKS / 2) as u64 {
        return Err(format!(
            "the server's lock table holds {capacity} locks; {MUX_LOCKS} multiplexed locks \
             need room for more: raise max_locks_per_transaction"
        )
        .into());
    }
    let run = std::process::id();
    let mux_pool = open_pool(db, MUX_CONNECTIONS, MUX_APP).await?;
    let per_connection = MUX_LOCKS / MUX_CONNECTIONS;
    let mux = Manager::builder(mux_pool.clone())
        .multiplex(per_connection)
        .build();
    let plain = Manager::new(open_pool(db, MUX_BATCH, "lock-bench-multiplex-plain").await?);
    acquire(&plain, &format!("bench:mux-plain:{run}:prime"), MUX_BATCH).await?;
    plain.release_all().await;
    let mut sides = [Latencies::default(), Latencies::default()];
    for batch in 0..MUX_LOCKS / MUX_BATCH {
        for side in harness::order(batch, 2) {
            let prefix = format!("bench:mux-{side}:{run}:{batch}");
            sides[side].merge(&acquire([&mux, &plain][side], &prefix, MUX_BATCH).await?);
        }
        plain.release_all().await;
    }
    let census = census((db, admin), (&mux, &mux_pool, MUX_APP), MUX_CONNECTIONS).await?;
    let ([held, pool_size, sessions, granted], released, took) = census;
    let left = granted_advisory_locks(admin, MUX_APP).await?;

    let [mux_acquire, plain_acquire] = &sides;
    let acquire_ratio = ratio(mux_acquire.p50() as f64, plain_acquire.p50() as f64);
    let (locks, connections) = (i64::try_from(MUX_LOCKS)?, i64::try_from(MUX_CONNECTIONS)?);
    let few = held == locks && granted == locks && pool_size <= connections;
    let name = format!("{MUX_LOCKS} held locks on at most {MUX_CONNECTIONS} connections");
    let measured = format!("{granted} granted on {sessions} sessions (pool {pool_size})");
    let few = few && sessions <= connections;
    let [_, few] = out.gate(name, measured, format!("≤ {MUX_CONNECTIONS}"), few);
    let name = "multiplexed acquire p50 / unmultiplexed acquire p50";
    let fast = acquire_ratio.is_some_and(|r| r <= MUX_ACQUIRE_LIMIT);
    let limit = format!("≤ {MUX_ACQUIRE_LIMIT}x");
    let [_, fast] = out.gate(name, Cell::ratio(acquire_ratio), limit, fast);
    let name = format!("release_all of {MUX_LOCKS} multiplexed locks");
    let limit = format!("< {}", fmt_ns(nanos(MUX_RELEASE_ALL_LIMIT)));
    let quick = released == MUX_LOCKS && left == 0 && took < MUX_RELEASE_ALL_LIMIT;
    let [limit, quick] = out.gate(name, Cell::ns(nanos(took)), limit, quick);
    let p50_p99 = |l: &Latencies| {
        let text = format!("{} ({})", fmt_ns(l.p50()), fmt_ns(l.p99()));
        Cell::new(text, [l.p50(), l.p99()])
    };
    out.row(row![
        "Measure" => format!("`multiplex({per_connection})`: {MUX_LOCKS} held / granted in \
                              pg_locks / pool size / sessions"),
        "Library" => format!("{held} / {granted} / {pool_size} / {sessions}"),
        "Baseline" => "—",
        "Target / ratio" => format!("≤ {MUX_CONNECTIONS} connections"),
        "Result" => few,
    ]);
    out.row(row![
        "Measure" => format!("multiplexed acquire p50 (p99), uncontended, lock kept; \
                              {MUX_LOCKS} samples each"),
        "Library" => p50_p99(mux_acquire),
        "Baseline" => p50_p99(plain_acquire),
        "Target / ratio" => Cell::ratio(acquire_ratio),
        "Result" => fast,
    ]);
    out.row(row![
        "Measure" => format!("multiplexed release_all of {MUX_LOCKS} (then granted: {left})"),
        "Library" => Cell::ns(nanos(took)),
        "Baseline" => "—",
        "Target / ratio" => limit,
        "Result" => quick,
    ]);
    Ok(())
}
