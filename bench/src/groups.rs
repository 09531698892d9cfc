//! Scenario 13: `acquire_many` over a simulated network (a delaying proxy at a ~2 ms
//! round trip). Uncontended: one key's `acquire` against `acquire_many` of 1 and of 8
//! keys, and 8 keys the old way (one try per round trip, written here on a plain
//! connection: [`old_way`]). Contended: 4 tasks taking overlapping subsets of 6 keys, the
//! one-statement tries against the old way, in alternating windows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_conformance::Lcg;
use locks_port::{AcquireOptions, KeyDerivation};
use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Object;
use serde_json::json;

use crate::clients::Op;
use crate::db::{Database, NOT_HELD};
use crate::harness::{self, Outcome, cells};
use crate::proxy::Proxy;
use crate::stats::{Latencies, fmt_ns, fmt_rate, median};
use crate::{BoxError, Plan};

/// The round trip to simulate (~2 ms, as the target below is stated).
const ROUND_TRIP: Duration = Duration::from_millis(2);
/// The target: `acquire_many` of 8 uncontended keys + release at most this
/// multiple of one `acquire` + release.
const LIMIT: f64 = 1.5;
/// Keys of the contended run, and tasks taking subsets of them.
const CONTENDED_KEYS: usize = 6;
const CONTENDED_TASKS: usize = 4;
const APP: &str = "lock-bench-groups";

/// One way of taking a group: the library, or the old way on a connection.
enum Way {
    Library(Op),
    New(PostgresLockManager),
    Old(Object),
}

impl Way {
    /// Cycle `n` of the library's client, or the old way on `keys`.
    async fn cycle(&self, n: usize, keys: &[&str]) -> Result<(), BoxError> {
        match self {
            Self::Library(op) => op.cycle(n).await,
            Self::New(manager) => {
                let locks = manager.acquire_many(keys, Duration::from_secs(30)).await?;
                locks.release().await;
                Ok(())
            }
            Self::Old(client) => old_way(client, keys).await,
        }
    }
}

/// `acquire_many` as it was before its tries went into one statement, on one connection:
/// the keys in the one global order, a `pg_try_advisory_lock` round trip each, a
/// `pg_advisory_lock` wait on a busy one (holding those before it, none after), then one
/// unlock each.
async fn old_way(client: &Object, keys: &[&str]) -> Result<(), BoxError> {
    let ids: Vec<i64> = KeyDerivation::CURRENT
        .lock_order(keys)
        .into_keys()
        .collect();
    let try_lock = client
        .prepare_cached("SELECT pg_try_advisory_lock($1)")
        .await?;
    let lock = client.prepare_cached("SELECT pg_advisory_lock($1)").await?;
    let unlock = client
        .prepare_cached("SELECT pg_advisory_unlock($1)")
        .await?;
    for id in &ids {
        let granted: bool = client.query_one(&try_lock, &[id]).await?.get(0);
        if !granted {
            client.execute(&lock, &[id]).await?;
        }
    }
    for id in &ids {
        let released: bool = client.query_one(&unlock, &[id]).await?.get(0);
        if !released {
            return Err(NOT_HELD.into());
        }
    }
    Ok(())
}

fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|n| format!("bench:groups:{prefix}:{n}"))
        .collect()
}

/// One window of the contended run: `CONTENDED_TASKS` tasks, each with a manager (or a
/// connection) of its own, taking random subsets of 2 to 4 of the keys until `window`
/// ends.
async fn contended_window(
    through: &Database,
    one_by_one: bool,
    window: Duration,
    seed: u64,
) -> Result<harness::Window, BoxError> {
    let keys = Arc::new(keys("contended", CONTENDED_KEYS));
    let mut ways = Vec::new();
    for _ in 0..CONTENDED_TASKS {
        let pool = through.pool(1, APP);
        ways.push(Arc::new(if one_by_one {
            Way::Old(pool.get().await?)
        } else {
            Way::New(PostgresLockManager::new(pool))
        }));
    }
    let end = Instant::now() + window;
    harness::window(CONTENDED_TASKS, |task| {
        let (keys, way) = (Arc::clone(&keys), Arc::clone(&ways[task]));
        let mut random = Lcg::new(seed * 16 + u64::try_from(task).unwrap_or(0) + 1);
        harness::until(end, async move || {
            way.cycle(0, &random.subset(&keys, 2, 4)).await
        })
    })
    .await
}

/// Scenario 13.
pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let upstream = db.tcp_address()?;
    let bare = {
        let proxy = Proxy::start(upstream.clone(), Duration::ZERO)?;
        db.through(proxy.port()).round_trip(APP).await?
    };
    let one_way = ROUND_TRIP.saturating_sub(Duration::from_nanos(bare)) / 2;
    let proxy = Proxy::start(upstream, one_way)?;
    let through = db.through(proxy.port());
    let rtt = through.round_trip(APP).await?;
    let manager = || PostgresLockManager::new(through.pool(1, APP));
    let options = AcquireOptions::new();
    let many = |count| {
        let (groups, manager) = (vec![keys(&format!("many-{count}"), count)], manager());
        Way::Library(Op::AcquireMany {
            manager,
            groups,
            options,
        })
    };
    let one = Op::Acquire {
        manager: manager(),
        keys: keys("one", 1),
        options,
    };
    let old = Way::Old(through.pool(1, APP).get().await?);
    let old_keys = keys("many-8-old", 8);
    let old_keys: Vec<&str> = old_keys.iter().map(String::as_str).collect();
    let variants = [
        ("acquire 1 key + release", Way::Library(one)),
        ("acquire_many of 1 key + release", many(1)),
        (
            "acquire_many of 8 keys + release (tries in one statement)",
            many(8),
        ),
        (
            "acquire_many of 8 keys + release, the old way (one try per round trip)",
            old,
        ),
    ];
    let batch = (plan.latency_batch / 4).max(10);
    let counts = (3, plan.latency_rounds, batch);
    let measured = harness::batches(variants.len(), counts, async |side, n| {
        variants[side].1.cycle(n, &old_keys).await
    })
    .await?;
    let header = [
        "Variant",
        "p50",
        "run p50s",
        "p99",
        "÷ acquire",
        "runs",
        "Target",
        "Result",
    ];
    let title = "13. acquire_many over a simulated network (~2 ms round trip)";
    let mut out = Outcome::new("groups", title, &header);
    let mut json_variants = Vec::new();
    let single = &measured[0];
    for (index, (batches, (name, _))) in measured.iter().zip(&variants).enumerate() {
        let (cells, ratios, mut json) = batches.against(single);
        json["name"] = json!(name);
        let [target, result] = match index {
            0 => ["baseline".to_owned(), String::new()],
            2 => out.gate(
                "acquire_many of 8 uncontended keys + release vs one acquire + release, \
                 ~2 ms round trip",
                format!(
                    "{} ({} vs {}; runs {})",
                    cells[3],
                    cells[0],
                    fmt_ns(single.median()),
                    cells[4]
                ),
                format!("≤ {LIMIT:.1}×"),
                ratios.map_or(f64::INFINITY, |ratios| ratios.median) <= LIMIT,
            ),
            _ => Default::default(),
        };
        out.row([vec![(*name).to_owned()], cells, vec![target, result]].concat());
        json_variants.push(json);
    }
    drop(variants);

    // Contended: alternating windows of the two ways.
    let window = plan.throughput_window;
    let names = [
        "tries in one statement",
        "the old way (one try per round trip)",
    ];
    let mut sides: [(u64, Latencies, Vec<f64>); 2] = Default::default();
    harness::rounds(plan.throughput_rounds, 2, async |round, side| {
        let seed = u64::try_from(round * 2 + side).unwrap_or(0);
        let measured = contended_window(&through, side == 1, window, seed).await?;
        let (total, pooled, rates) = &mut sides[side];
        *total += measured.ops;
        pooled.merge(&measured.latencies);
        rates.push(crate::stats::as_f64(measured.ops) / window.as_secs_f64());
        Ok(())
    })
    .await?;
    for (name, (total, pooled, rates)) in names.iter().zip(&sides) {
        out.row(cells![
            format!("contended, {name}: {total} groups"),
            fmt_ns(pooled.p50()),
            format!("{} (median of windows)", fmt_rate(median(rates))),
            fmt_ns(pooled.p99()),
            "",
            "",
            "",
            "",
        ]);
    }
    let (new_rate, old_rate) = (median(&sides[0].2), median(&sides[1].2));
    out.gate(
        format!(
            "contended acquire_many ({CONTENDED_TASKS} tasks, overlapping subsets of \
             {CONTENDED_KEYS} keys): groups per second vs the old way"
        ),
        format!(
            "{:.2}× ({} vs {})",
            new_rate / old_rate.max(f64::MIN_POSITIVE),
            fmt_rate(new_rate),
            fmt_rate(old_rate)
        ),
        "≥ 0.95× (not slower)",
        new_rate >= old_rate * 0.95,
    );
    out.note(format!(
        "Through the delaying proxy: measured round trip {} ({} added each \
         way). Uncontended: {} rounds, the variants interleaved, batches of \
         {batch}; ÷ one key's acquire, batch p50 by batch p50.",
        fmt_ns(rtt),
        fmt_ns(crate::stats::nanos(one_way)),
        plan.latency_rounds
    ));
    out.note(format!(
        "Contended: {CONTENDED_TASKS} tasks (a manager and a connection each) \
         take random subsets of 2–4 of {CONTENDED_KEYS} keys (timeout 30 s) \
         for {} windows of {:?} per way, alternating; p50/p99 per group.",
        plan.throughput_rounds, window
    ));
    Ok(out.with(json!({
        "round_trip_ns": rtt,
        "uncontended": json_variants,
        "contended": {
            "new_rate_median": new_rate,
            "old_rate_median": old_rate,
        },
    })))
}
