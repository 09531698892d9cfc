//! Scenario `multiplex`: 10,000 locks held by one multiplexing manager on at most 100
//! connections (`multiplex(100)`), its acquire latency against the unmultiplexed
//! manager's in the same run, and the time `release_all` takes for all of them.

use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, LockRegistry};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::Client;
use serde_json::json;

use crate::db::{Database, granted_advisory_locks};
use crate::harness::{self, Outcome, cells};
use crate::stats::{Latencies, as_f64, fmt_ns, fmt_ratio, ratio};
use crate::{BoxError, Plan};

/// Held locks, connections, and locks per connection (the target's figures).
const LOCKS: usize = 10_000;
const CONNECTIONS: usize = 100;
const PER_CONNECTION: usize = LOCKS / CONNECTIONS;
/// Acquisitions per batch; multiplexed and plain batches alternate.
const BATCH: usize = 100;

/// The targets.
const ACQUIRE_RATIO_LIMIT: f64 = 1.2;
const RELEASE_ALL_LIMIT: Duration = Duration::from_secs(1);

const MUX_APP: &str = "lock-bench-multiplex";
const PLAIN_APP: &str = "lock-bench-multiplex-plain";

/// Times `count` acquisitions of fresh keys by `manager`, keeping the locks.
async fn acquire_batch(
    manager: &PostgresLockManager,
    prefix: &str,
    count: usize,
    histogram: &mut Latencies,
) -> Result<(), BoxError> {
    for n in 0..count {
        let key = format!("{prefix}:{n}");
        let started = Instant::now();
        let guard = manager.acquire(&key, AcquireOptions::new()).await?;
        histogram.record(started.elapsed());
        drop(guard.into_held());
    }
    Ok(())
}

/// Whether the server's lock table has room for `LOCKS` advisory locks besides others:
/// `max_locks_per_transaction × (max_connections + max_prepared_transactions)`.
async fn lock_table_capacity(admin: &Client) -> Result<u64, BoxError> {
    let show = async |setting: &str| -> Result<u64, BoxError> {
        let value: String = admin
            .query_one(&format!("SHOW {setting}"), &[])
            .await?
            .get(0);
        Ok(value.parse()?)
    };
    let per = show("max_locks_per_transaction").await?;
    Ok(per * (show("max_connections").await? + show("max_prepared_transactions").await?))
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let admin = db.connect("lock-bench-admin").await?;
    let capacity = lock_table_capacity(&admin).await?;
    if capacity < (LOCKS + LOCKS / 2) as u64 {
        return Err(format!(
            "the server's lock table holds {capacity} locks; the multiplex scenario needs \
             room for {LOCKS} and more: raise max_locks_per_transaction"
        )
        .into());
    }
    let run_id = std::process::id();
    let mux_pool = db.pool(CONNECTIONS, MUX_APP);
    let plain_pool = db.pool(BATCH, PLAIN_APP);
    db.warm(&mux_pool, CONNECTIONS).await?;
    db.warm(&plain_pool, BATCH).await?;
    let mux = PostgresLockManager::builder(mux_pool.clone())
        .multiplex(PER_CONNECTION)
        .build();
    let plain = PostgresLockManager::new(plain_pool.clone());
    // Every plain connection is set up once before anything is timed.
    acquire_batch(
        &plain,
        &format!("bench:mux-plain:{run_id}:prime"),
        BATCH,
        &mut Latencies::new(),
    )
    .await?;
    plain.release_all().await;

    let mut mux_acquire = Latencies::new();
    let mut plain_acquire = Latencies::new();
    let batches = LOCKS / BATCH;
    for batch in 0..batches {
        let mux_prefix = format!("bench:mux:{run_id}:{batch}");
        let plain_prefix = format!("bench:mux-plain:{run_id}:{batch}");
        for side in harness::order(batch, 2) {
            match side {
                0 => acquire_batch(&mux, &mux_prefix, BATCH, &mut mux_acquire).await?,
                _ => acquire_batch(&plain, &plain_prefix, BATCH, &mut plain_acquire).await?,
            }
        }
        plain.release_all().await;
    }

    let held = mux.held_lock_count();
    let pool_size = mux_pool.status().size;
    let sessions = db
        .sessions(&admin, MUX_APP, i64::try_from(CONNECTIONS)?)
        .await?;
    let granted = granted_advisory_locks(&admin, MUX_APP).await?;

    let started = Instant::now();
    let released = mux.release_all().await;
    let release_all = started.elapsed();
    let left = granted_advisory_locks(&admin, MUX_APP).await?;
    let pooled = mux_pool.status();

    let acquire_ratio = ratio(as_f64(mux_acquire.p50()), as_f64(plain_acquire.p50()));
    let few_connections = held == LOCKS
        && granted == i64::try_from(LOCKS)?
        && pool_size <= CONNECTIONS
        && sessions <= i64::try_from(CONNECTIONS)?;
    let fast_acquire = acquire_ratio.is_some_and(|r| r <= ACQUIRE_RATIO_LIMIT);
    let fast_release = released == LOCKS && left == 0 && release_all < RELEASE_ALL_LIMIT;
    let release_ns = u64::try_from(release_all.as_nanos()).unwrap_or(u64::MAX);

    let title = format!(
        "11. {LOCKS} locks held by one manager on at most {CONNECTIONS} connections \
         (`multiplex({PER_CONNECTION})`)"
    );
    let header = [
        "Measure",
        "Multiplexed",
        "Unmultiplexed",
        "Target / ratio",
        "Result",
    ];
    let mut out = Outcome::new("multiplex", title, &header);
    out.note(format!(
        "One multiplexing manager (pool of {CONNECTIONS}, warmed) acquires {LOCKS} \
         fresh keys one after another and keeps them; batches of {BATCH} alternate \
         with the same number of acquisitions by an unmultiplexed manager (pool of \
         {BATCH}, warmed and primed; its locks released after each batch, untimed). \
         Then one `release_all` of the {LOCKS} ({} mode runs the same sizes).",
        plan.mode()
    ));
    let [_, few] = out.gate(
        format!("{LOCKS} held locks on at most {CONNECTIONS} connections"),
        format!("{granted} granted on {sessions} sessions (pool {pool_size})"),
        format!("≤ {CONNECTIONS}"),
        few_connections,
    );
    let [_, fast] = out.gate(
        "multiplexed acquire p50 / unmultiplexed acquire p50",
        fmt_ratio(acquire_ratio),
        format!("≤ {ACQUIRE_RATIO_LIMIT}x"),
        fast_acquire,
    );
    let [_, quick_release] = out.gate(
        format!("release_all of {LOCKS} multiplexed locks"),
        fmt_ns(release_ns),
        "< 1 s",
        fast_release,
    );
    let p50_p99 = |l: &Latencies| format!("{} ({})", fmt_ns(l.p50()), fmt_ns(l.p99()));
    out.row(cells![
        format!("{LOCKS} held locks: held / granted in pg_locks / pool size / sessions"),
        format!("{held} / {granted} / {pool_size} / {sessions}"),
        "—",
        format!("≤ {CONNECTIONS} connections"),
        few,
    ]);
    out.row(cells![
        format!("acquire p50 (p99), uncontended, lock kept; {LOCKS} samples each"),
        p50_p99(&mux_acquire),
        p50_p99(&plain_acquire),
        fmt_ratio(acquire_ratio),
        fast,
    ]);
    out.row(cells![
        format!(
            "release_all of {LOCKS} (then granted: {left}; pool {} idle of {})",
            pooled.available, pooled.size
        ),
        fmt_ns(release_ns),
        "—",
        format!("< {}", fmt_ns(1_000_000_000)),
        quick_release,
    ]);
    Ok(out.with(json!({
        "locks": LOCKS,
        "connections": CONNECTIONS,
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
        "pool_after_release_all": { "size": pooled.size, "available": pooled.available },
    })))
}
