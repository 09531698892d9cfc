//! Scenario 13: `acquire_many` over a simulated network (a delaying proxy at a ~2 ms
//! round trip). Uncontended: one key's `acquire` against `acquire_many` of 1 and of 8
//! keys, and 8 keys the old way (one try per round trip, written here on a plain
//! connection: [`OldWay`]). Contended: 4 tasks taking overlapping subsets of 6 keys, the
//! one-statement tries against the old way, in alternating windows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_conformance::Lcg;
use locks_port::{AcquireOptions, KeyDerivation};
use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Object;
use serde_json::json;

use crate::clients::Op;
use crate::db::Database;
use crate::interleave;
use crate::proxy::Proxy;
use crate::report::{Check, Outcome, Section, verdict};
use crate::stats::{Latencies, fmt_ns, fmt_rate};
use crate::{BoxError, Plan};

/// The round trip to simulate (~2 ms, as the target below is stated).
const ROUND_TRIP: Duration = Duration::from_millis(2);
/// The target: `acquire_many` of 8 uncontended keys + release at most this
/// multiple of one `acquire` + release.
const LIMIT: f64 = 1.5;
/// Keys of the contended run, and tasks taking subsets of them.
const CONTENDED_KEYS: usize = 6;
const CONTENDED_TASKS: usize = 4;

/// A library client, or the old way on `keys`.
enum Either {
    Library(Op),
    Old(OldWay, Vec<String>),
}

impl Either {
    async fn cycle(&self, n: usize) -> Result<(), BoxError> {
        match self {
            Self::Library(op) => op.cycle(n).await,
            Self::Old(old, keys) => old.cycle(keys).await,
        }
    }
}

/// `acquire_many` as it was before its tries went into one statement, on one connection:
/// the keys in the one global order, a `pg_try_advisory_lock` round trip each, a
/// `pg_advisory_lock` wait on a busy one (holding those before it, none after), then one
/// unlock each.
struct OldWay {
    client: Object,
}

impl OldWay {
    fn new(client: Object) -> Self {
        Self { client }
    }

    async fn cycle(&self, keys: &[String]) -> Result<(), BoxError> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let ids: Vec<i64> = KeyDerivation::CURRENT
            .lock_order(&keys)
            .into_keys()
            .collect();
        let try_lock = self
            .client
            .prepare_cached("SELECT pg_try_advisory_lock($1)")
            .await?;
        let lock = self
            .client
            .prepare_cached("SELECT pg_advisory_lock($1)")
            .await?;
        let unlock = self
            .client
            .prepare_cached("SELECT pg_advisory_unlock($1)")
            .await?;
        for id in &ids {
            let granted: bool = self.client.query_one(&try_lock, &[id]).await?.get(0);
            if !granted {
                self.client.execute(&lock, &[id]).await?;
            }
        }
        for id in &ids {
            let released: bool = self.client.query_one(&unlock, &[id]).await?.get(0);
            if !released {
                return Err("pg_advisory_unlock answered false".into());
            }
        }
        Ok(())
    }
}

fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|n| format!("bench:groups:{prefix}:{n}"))
        .collect()
}

/// One task's way of taking a group.
enum Way {
    New(PostgresLockManager),
    Old(Box<OldWay>),
}

/// One window of the contended run: `CONTENDED_TASKS` tasks, each with a manager of
/// its own, taking random subsets of 2 to 4 of the keys until `window` ends. Each
/// acquisition's latency, and how many there were.
async fn contended_window(
    through: &Database,
    one_by_one: bool,
    window: Duration,
    seed: u64,
) -> Result<(u64, Latencies), BoxError> {
    let keys = Arc::new(keys("contended", CONTENDED_KEYS));
    let end = Instant::now() + window;
    let mut tasks = Vec::new();
    for task in 0..CONTENDED_TASKS {
        let pool = through.pool(1, "lock-bench-groups");
        let way = if one_by_one {
            Way::Old(Box::new(OldWay::new(pool.get().await?)))
        } else {
            Way::New(PostgresLockManager::new(pool))
        };
        let keys = Arc::clone(&keys);
        let seed = seed * 16 + u64::try_from(task).unwrap_or(0) + 1;
        tasks.push(tokio::spawn(async move {
            let mut random = Lcg::new(seed);
            let mut latencies = Latencies::new();
            let mut ops = 0_u64;
            while Instant::now() < end {
                let started = Instant::now();
                let subset = random.subset(&keys, 2, 4);
                match &way {
                    Way::New(manager) => {
                        let locks = manager
                            .acquire_many(&subset, Duration::from_secs(30))
                            .await?;
                        locks.release().await;
                    }
                    Way::Old(old) => {
                        let subset: Vec<String> =
                            subset.iter().map(|key| (*key).to_owned()).collect();
                        old.cycle(&subset).await?;
                    }
                }
                latencies.record(started.elapsed());
                ops += 1;
            }
            Ok::<_, BoxError>((ops, latencies))
        }));
    }
    let mut total = 0;
    let mut latencies = Latencies::new();
    for task in tasks {
        let (ops, task_latencies) = task.await??;
        total += ops;
        latencies.merge(&task_latencies);
    }
    Ok((total, latencies))
}

/// Scenario 13.
pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let upstream = db.tcp_address()?;
    let bare = {
        let proxy = Proxy::start(upstream.clone(), Duration::ZERO)?;
        db.through(proxy.port())
            .round_trip("lock-bench-groups")
            .await?
    };
    let one_way = ROUND_TRIP.saturating_sub(Duration::from_nanos(bare)) / 2;
    let proxy = Proxy::start(upstream, one_way)?;
    let through = db.through(proxy.port());
    let rtt = through.round_trip("lock-bench-groups").await?;
    let manager = || PostgresLockManager::new(through.pool(1, "lock-bench-groups"));
    let options = AcquireOptions::new();
    let many = |count| {
        let (groups, manager) = (vec![keys(&format!("many-{count}"), count)], manager());
        Either::Library(Op::AcquireMany {
            manager,
            groups,
            options,
        })
    };
    let old = OldWay::new(through.pool(1, "lock-bench-groups").get().await?);
    let one = Op::Acquire {
        manager: manager(),
        keys: keys("one", 1),
        options,
    };
    let old = Either::Old(old, keys("many-8-old", 8));
    let variants = [
        ("acquire 1 key + release", Either::Library(one)),
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
    let measured = interleave::batches(variants.len(), counts, async |side, n| {
        variants[side].1.cycle(n).await
    })
    .await?;
    let (mut rows, mut checks, mut json_variants) = (Vec::new(), Vec::new(), Vec::new());
    let single = &measured[0];
    for (index, (batches, (name, _))) in measured.iter().zip(&variants).enumerate() {
        let (cells, ratios, mut json) = batches.against(single);
        json["name"] = json!(name);
        let (target, result) = if index == 2 {
            let measured = ratios.map_or(f64::INFINITY, |ratios| ratios.median);
            let pass = measured <= LIMIT;
            checks.push(Check::new(
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
                pass,
            ));
            (format!("≤ {LIMIT:.1}×"), verdict(pass).to_owned())
        } else if index == 0 {
            ("baseline".to_owned(), String::new())
        } else {
            (String::new(), String::new())
        };
        rows.push([vec![(*name).to_owned()], cells, vec![target, result]].concat());
        json_variants.push(json);
    }
    drop(variants);

    // Contended: alternating windows of the two ways.
    let window = plan.throughput_window;
    let mut sides = [
        (
            "tries in one statement",
            0_u64,
            Latencies::new(),
            Vec::new(),
        ),
        (
            "the old way (one try per round trip)",
            0_u64,
            Latencies::new(),
            Vec::new(),
        ),
    ];
    interleave::rounds(plan.throughput_rounds, 2, async |round, side| {
        let seed = u64::try_from(round * 2 + side).unwrap_or(0);
        let (ops, latencies) = contended_window(&through, side == 1, window, seed).await?;
        let (_, total, pooled, rates) = &mut sides[side];
        *total += ops;
        pooled.merge(&latencies);
        #[allow(clippy::cast_precision_loss)]
        rates.push(ops as f64 / window.as_secs_f64());
        Ok(())
    })
    .await?;
    let median_rate = |rates: &[f64]| crate::stats::median(rates);
    let new_rate = median_rate(&sides[0].3);
    let old_rate = median_rate(&sides[1].3);
    for (name, total, pooled, rates) in &sides {
        rows.push(vec![
            format!("contended, {name}: {total} groups"),
            fmt_ns(pooled.p50()),
            format!("{} (median of windows)", fmt_rate(median_rate(rates))),
            fmt_ns(pooled.p99()),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    let faster = new_rate >= old_rate * 0.95;
    checks.push(Check::new(
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
        "≥ 0.95× (not slower)".to_owned(),
        faster,
    ));
    Ok(Outcome {
        id: "groups",
        section: Section {
            title: "13. acquire_many over a simulated network (~2 ms round trip)".to_owned(),
            notes: vec![
                format!(
                    "Through the delaying proxy: measured round trip {} ({} added each \
                     way). Uncontended: {} rounds, the variants interleaved, batches of \
                     {batch}; ÷ one key's acquire, batch p50 by batch p50.",
                    fmt_ns(rtt),
                    fmt_ns(u64::try_from(one_way.as_nanos()).unwrap_or(u64::MAX)),
                    plan.latency_rounds
                ),
                format!(
                    "Contended: {CONTENDED_TASKS} tasks (a manager and a connection each) \
                     take random subsets of 2–4 of {CONTENDED_KEYS} keys (timeout 30 s) \
                     for {} windows of {:?} per way, alternating; p50/p99 per group.",
                    plan.throughput_rounds, window
                ),
            ],
            header: vec![
                "Variant",
                "p50",
                "run p50s",
                "p99",
                "÷ acquire",
                "runs",
                "Target",
                "Result",
            ],
            rows,
        },
        checks,
        json: json!({
            "round_trip_ns": rtt,
            "uncontended": json_variants,
            "contended": {
                "new_rate_median": new_rate,
                "old_rate_median": old_rate,
            },
        }),
        files: Vec::new(),
    })
}
