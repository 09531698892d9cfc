//! Scenario `hold` (5): 500 locks (100 quick) held by one manager on a pool of as many,
//! against as many raw connections (heap per connection and per held lock, `release_all`
//! ÷ the unlocks in turn); then 10,000 multiplexed on 100 connections ([`multiplexed`]).

use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, LockRegistry, lock_id};
use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::Client;
use serde_json::{Value, json};

use crate::db::{Database, granted_advisory_locks};
use crate::harness::{self, Cell, Outcome, cells};
use crate::stats::{Latencies, allocated_bytes, as_f64, fmt_bytes, fmt_ns};
use crate::stats::{median, nanos, ratio};
use crate::turns::{OPENING, each, open_pool};
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

/// Locks held by the unmultiplexed manager (and raw connections): 100, or 500.
pub(crate) fn locks(plan: &Plan) -> usize {
    plan.pick(100, 500)
}

/// Live heap bytes per lock from `before` to now, over `count` locks.
fn heap_per(before: usize, count: usize) -> f64 {
    (as_f64(allocated_bytes() as u64) - as_f64(before as u64)) / as_f64(count as u64)
}

/// What the server and the manager say of `manager`'s locks on connections of `app`:
/// held locks, pool size, sessions (awaited up to `expected`), granted advisory locks.
async fn census(
    db: &Database,
    admin: &Client,
    (manager, pool, app): (&PostgresLockManager, &Pool, &str),
    expected: usize,
) -> Result<[i64; 4], BoxError> {
    let sessions = db.sessions(admin, app, i64::try_from(expected)?).await?;
    let granted = granted_advisory_locks(admin, app).await?;
    let held = i64::try_from(manager.held_lock_count())?;
    Ok([held, i64::try_from(pool.status().size)?, sessions, granted])
}

/// `manager.release_all()`, timed: how many it released, in how long.
async fn release_all(manager: &PostgresLockManager) -> (usize, Duration) {
    let started = Instant::now();
    let released = manager.release_all().await;
    (released, started.elapsed())
}

/// Acquires `count` fresh keys `{prefix}:{n}` with `manager`, keeping the locks, each
/// acquisition's time into `latencies`.
async fn acquire(
    manager: &PostgresLockManager,
    prefix: &str,
    count: usize,
    latencies: &mut Latencies,
) -> Result<(), BoxError> {
    for n in 0..count {
        let started = Instant::now();
        let key = format!("{prefix}:{n}");
        let guard = manager.acquire(&key, AcquireOptions::new()).await?;
        latencies.record(started.elapsed());
        drop(guard.into_held());
    }
    Ok(())
}

/// One round of the library: `count` locks held by one manager on a pool of `count`.
async fn library_round(
    db: &Database,
    admin: &Client,
    count: usize,
    round: usize,
) -> Result<Value, BoxError> {
    let empty = allocated_bytes();
    let pool = open_pool(db, count, LIBRARY_APP).await?;
    let connection = heap_per(empty, count);
    // Every connection takes and gives back one lock through the manager measured next,
    // so what a connection keeps after its first lock (its prepared statements) is
    // counted apart from the bookkeeping.
    let connected = allocated_bytes();
    let manager = PostgresLockManager::new(pool.clone());
    let prefix = format!("bench:hold:{round}");
    acquire(
        &manager,
        &format!("{prefix}:prime"),
        count,
        &mut Latencies::new(),
    )
    .await?;
    manager.release_all().await;
    let first_lock = heap_per(connected, count);

    // The guards' vector is made before counting, so that neither figure counts it.
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
    let [held, pool_size, sessions, granted] =
        census(db, admin, (&manager, &pool, LIBRARY_APP), count).await?;
    let (released, took) = release_all(&manager).await;
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

/// One round of raw SQL: `count` dedicated connections, a lock each, then the unlocks
/// one after another.
async fn raw_round(
    db: &Database,
    admin: &Client,
    count: usize,
    round: usize,
) -> Result<Value, BoxError> {
    let ids = (0..count).map(|n| lock_id(&format!("bench:hold-raw:{round}:{n}")));
    let empty = allocated_bytes();
    let opener = db.clone();
    let connect = move |_| {
        let db = opener.clone();
        async move { db.connect(RAW_APP).await }
    };
    let clients = each(0..count, OPENING, connect).await?;
    // Less the vector that holds them (made after the count began, unlike the pool's).
    let connection = heap_per(empty, count) - as_f64(std::mem::size_of::<Client>() as u64);
    let connected = allocated_bytes();
    let statements = |word: &'static str| {
        (ids.clone()).map(move |id| format!("SELECT pg_advisory_{word}({id})"))
    };
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

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let (count, rounds) = (locks(plan), plan.pick(2, 3));
    let admin = db.connect("lock-bench-admin").await?;
    let mut sides: [Vec<Value>; 2] = Default::default();
    harness::rounds(rounds, 2, async |round, side| {
        sides[side].push(if side == 0 {
            library_round(db, &admin, count, round).await?
        } else {
            raw_round(db, &admin, count, round).await?
        });
        Ok(())
    })
    .await?;
    let [library, raw] = &sides;
    // A figure's median over the rounds of a side.
    let median = |rounds: &[Value], key: &str| {
        median(
            &rounds
                .iter()
                .filter_map(|r| r[key].as_f64())
                .collect::<Vec<_>>(),
        )
    };
    let bytes = |side: &[Value], key: &str| Cell::bytes(median(side, key));
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let seconds = |side: &[Value], key: &str| Cell::ns((median(side, key) * 1e9) as u64);
    let one_each = library.iter().all(|r| {
        let keys = ["pool_size", "held_lock_count", "released", "sessions"];
        keys.into_iter()
            .chain(["granted_advisory_locks"])
            .all(|k| r[k] == json!(count))
    });
    let (last, raw_last) = (library.last(), raw.last());
    let (last, raw_last) = (last.ok_or("no round ran")?, raw_last.ok_or("no round ran")?);
    let bookkeeping = median(library, "bookkeeping_heap_bytes");
    let release_ratio = ratio(
        median(library, "release_all_s"),
        median(raw, "unlock_all_s"),
    );

    let header = ["Measure", "Library", "Baseline", "Target / ratio", "Result"];
    let title = format!(
        "5. Locks held at once by one manager: {count} (pool of {count}), and {MUX_LOCKS} \
         multiplexed on {MUX_CONNECTIONS} connections"
    );
    let mut out = Outcome::new("hold_many", title, &header);
    out.note(format!(
        "{} rounds, library and raw alternating; medians over rounds; heap = live bytes \
         (counting allocator). Multiplexed: batches of {MUX_BATCH} alternating with an \
         unmultiplexed manager's (pool of {MUX_BATCH}).",
        rounds
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
    let name = "manager bookkeeping per held lock";
    let [limit, small] = out.gate(name, Cell::bytes(bookkeeping), limit, small);
    let raw_sessions = (&raw_last["sessions"], &raw_last["granted_advisory_locks"]);
    let rows = [
        cells![
            "connections per held lock (pool size, sessions in pg_stat_activity, granted advisory locks)",
            format!("{pool} / {sessions} / {granted} for {count}"),
            format!("{} / {} for {count}", raw_sessions.0, raw_sessions.1),
            "= 1 each",
            one_each_result,
        ],
        cells![
            "client heap per connection (pool opened, no lock)",
            bytes(library, "connection_heap_bytes"),
            bytes(raw, "connection_heap_bytes"),
            "",
            "",
        ],
        cells![
            "heap a connection keeps after its first lock (library: its cached prepared statements; raw: a simple query's traces)",
            bytes(library, "connection_after_first_lock_heap_bytes"),
            bytes(raw, "locked_heap_bytes"),
            "",
            "",
        ],
        cells![
            "manager bookkeeping per held lock (heap, beyond the lock's connection)",
            Cell::bytes(bookkeeping),
            "—",
            limit,
            small,
        ],
        cells![
            "guard per held lock (heap, while the caller keeps it)",
            bytes(library, "guard_heap_bytes"),
            "—",
            "",
            "",
        ],
        cells![
            format!("release_all of {count} (raw: {count} unlocks one after another)"),
            seconds(library, "release_all_s"),
            seconds(raw, "unlock_all_s"),
            Cell::ratio(release_ratio),
            "",
        ],
    ];
    rows.into_iter().for_each(|row| out.row(row));
    multiplexed(db, &admin, &mut out).await?;
    Ok(out.with(json!({ "rounds": { "library": library, "raw": raw } })))
}

/// [`MUX_LOCKS`] locks held by one manager with `multiplex(100)` on a pool of
/// [`MUX_CONNECTIONS`], acquired in batches alternating with an unmultiplexed manager's;
/// then one `release_all`. Its rows and targets go to `out`.
async fn multiplexed(db: &Database, admin: &Client, out: &mut Outcome) -> Result<(), BoxError> {
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
    let mux = PostgresLockManager::builder(mux_pool.clone())
        .multiplex(per_connection)
        .build();
    let plain_pool = open_pool(db, MUX_BATCH, "lock-bench-multiplex-plain").await?;
    let plain = PostgresLockManager::new(plain_pool);
    // Every plain connection is set up once before anything is timed.
    let prime = format!("bench:mux-plain:{run}:prime");
    acquire(&plain, &prime, MUX_BATCH, &mut Latencies::new()).await?;
    plain.release_all().await;
    let mut sides = [Latencies::new(), Latencies::new()];
    for batch in 0..MUX_LOCKS / MUX_BATCH {
        for side in harness::order(batch, 2) {
            let manager = [&mux, &plain][side];
            let prefix = format!("bench:mux-{side}:{run}:{batch}");
            acquire(manager, &prefix, MUX_BATCH, &mut sides[side]).await?;
        }
        plain.release_all().await;
    }
    let [held, pool_size, sessions, granted] =
        census(db, admin, (&mux, &mux_pool, MUX_APP), MUX_CONNECTIONS).await?;
    let (released, took) = release_all(&mux).await;
    let left = granted_advisory_locks(admin, MUX_APP).await?;

    let [mux_acquire, plain_acquire] = &sides;
    let acquire_ratio = ratio(as_f64(mux_acquire.p50()), as_f64(plain_acquire.p50()));
    let (locks, connections) = (i64::try_from(MUX_LOCKS)?, i64::try_from(MUX_CONNECTIONS)?);
    let few = held == locks && granted == locks && pool_size <= connections;
    let [_, few] = out.gate(
        format!("{MUX_LOCKS} held locks on at most {MUX_CONNECTIONS} connections"),
        format!("{granted} granted on {sessions} sessions (pool {pool_size})"),
        format!("≤ {MUX_CONNECTIONS}"),
        few && sessions <= connections,
    );
    let [_, fast] = out.gate(
        "multiplexed acquire p50 / unmultiplexed acquire p50",
        Cell::ratio(acquire_ratio),
        format!("≤ {MUX_ACQUIRE_LIMIT}x"),
        acquire_ratio.is_some_and(|r| r <= MUX_ACQUIRE_LIMIT),
    );
    let limit = format!("< {}", fmt_ns(nanos(MUX_RELEASE_ALL_LIMIT)));
    let [_, quick] = out.gate(
        format!("release_all of {MUX_LOCKS} multiplexed locks"),
        Cell::ns(nanos(took)),
        limit.clone(),
        released == MUX_LOCKS && left == 0 && took < MUX_RELEASE_ALL_LIMIT,
    );
    let p50_p99 = |l: &Latencies| {
        let text = format!("{} ({})", fmt_ns(l.p50()), fmt_ns(l.p99()));
        Cell::new(text, [l.p50(), l.p99()])
    };
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
        Cell::ratio(acquire_ratio),
        fast,
    ]);
    out.row(cells![
        format!("multiplexed release_all of {MUX_LOCKS} (then granted: {left})"),
        Cell::ns(nanos(took)),
        "—",
        limit,
        quick,
    ]);
    Ok(())
}
