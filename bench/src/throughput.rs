//! Scenario 3: 16 tasks on 16 distinct keys, as fast as they can, for a fixed time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::json;

use crate::db::{Database, RawStatements};
use crate::report::{Check, Outcome, Section, verdict};
use crate::stats::{Latencies, as_f64, fmt_ns, fmt_rate, fmt_ratio, median, ratio};
use crate::{BoxError, Plan, interleave};

/// The least library throughput allowed, as a fraction of raw (0.95×; the
/// earlier target was 0.9×).
const THROUGHPUT_LIMIT: f64 = 0.95;
const TASKS: usize = 16;

/// One window's result: operations, wall time, latencies.
struct Window {
    ops: u64,
    elapsed: Duration,
    latencies: Latencies,
}

impl Window {
    fn rate(&self) -> f64 {
        as_f64(self.ops) / self.elapsed.as_secs_f64()
    }
}

/// Runs `TASKS` copies of `task` until `window` has passed and adds up what they did.
async fn window<F, Fut>(window: Duration, task: F) -> Result<Window, BoxError>
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = Result<(u64, Latencies), BoxError>> + Send + 'static,
{
    let started = Instant::now();
    let end = started + window;
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..TASKS {
        tasks.spawn(task(index, end));
    }
    let mut total = Window {
        ops: 0,
        elapsed: Duration::ZERO,
        latencies: Latencies::new(),
    };
    while let Some(joined) = tasks.join_next().await {
        let (ops, latencies) = joined??;
        total.ops += ops;
        total.latencies.merge(&latencies);
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let pool = db.pool(TASKS, "lock-bench-throughput");
    db.warm(&pool, TASKS).await?;
    let manager = PostgresLockManager::new(pool);
    let mut raw = Vec::with_capacity(TASKS);
    for _ in 0..TASKS {
        let client = db.connect("lock-bench-throughput").await?;
        let statements = RawStatements::prepare(&client, false).await?;
        raw.push(Arc::new((client, statements)));
    }
    let keys: Vec<String> = (0..TASKS)
        .map(|n| format!("bench:throughput:{n}"))
        .collect();

    let library_window = |length: Duration| {
        window(length, |index, end| {
            let manager = manager.clone();
            let key = keys[index].clone();
            interleave::until(end, async move || {
                let guard = manager.acquire(&key, AcquireOptions::new()).await?;
                guard.release().await;
                Ok(())
            })
        })
    };
    let raw_window = |length: Duration| {
        window(length, |index, end| {
            let connection = Arc::clone(&raw[index]);
            let id = lock_id(&keys[index]);
            interleave::until(end, async move || {
                let (client, statements) = &*connection;
                client.execute(&statements.lock, &[&id]).await?;
                let released: bool = client.query_one(&statements.unlock, &[&id]).await?.get(0);
                if !released {
                    return Err("pg_advisory_unlock answered false".into());
                }
                Ok(())
            })
        })
    };

    let text_window = |length: Duration| {
        window(length, |index, end| {
            let connection = Arc::clone(&raw[index]);
            let id = lock_id(&keys[index]);
            let lock = format!(
                "SELECT pg_advisory_lock({id}) \
                 FROM (SELECT set_config('lock_timeout', '0', true)) AS options"
            );
            let unlock = format!("SELECT pg_advisory_unlock({id})");
            interleave::until(end, async move || {
                let (client, _) = &*connection;
                client.simple_query(&lock).await?;
                client.simple_query(&unlock).await?;
                Ok(())
            })
        })
    };

    // A short unrecorded window of each first, then rounds, the order rotating.
    let warmup = plan.throughput_window / 4;
    library_window(warmup).await?;
    raw_window(warmup).await?;
    let length = plan.throughput_window;
    let mut library = Vec::new();
    let mut baseline = Vec::new();
    let mut text = Vec::new();
    interleave::rounds(plan.throughput_rounds, 3, async |_, side| {
        match side {
            0 => library.push(library_window(length).await?),
            1 => baseline.push(raw_window(length).await?),
            _ => text.push(text_window(length).await?),
        }
        Ok(())
    })
    .await?;

    let rates = |windows: &[Window]| windows.iter().map(Window::rate).collect::<Vec<_>>();
    let merged = |windows: &[Window]| {
        let mut all = Latencies::new();
        for window in windows {
            all.merge(&window.latencies);
        }
        all
    };
    let (library_rates, baseline_rates, text_rates) =
        (rates(&library), rates(&baseline), rates(&text));
    let (library_rate, baseline_rate, text_rate) = (
        median(&library_rates),
        median(&baseline_rates),
        median(&text_rates),
    );
    let (library_latency, baseline_latency, text_latency) =
        (merged(&library), merged(&baseline), merged(&text));
    let share = ratio(library_rate, baseline_rate);
    let pass = share.is_some_and(|s| s >= THROUGHPUT_LIMIT);
    // The spread: library ÷ raw round by round (each round runs both, back to back).
    let per_round: Vec<f64> = library_rates
        .iter()
        .zip(&baseline_rates)
        .filter_map(|(library, raw)| ratio(*library, *raw))
        .collect();
    let spread = if per_round.is_empty() {
        "—".to_owned()
    } else {
        let low = per_round.iter().copied().fold(f64::INFINITY, f64::min);
        let high = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("rounds {low:.2}–{high:.2}×")
    };

    let rows = vec![
        vec![
            format!("library: {TASKS} tasks, one manager, pool of {TASKS}"),
            fmt_rate(library_rate),
            fmt_ns(library_latency.p50()),
            fmt_ns(library_latency.p99()),
            format!("{} ({spread})", fmt_ratio(share)),
            format!("≥ {THROUGHPUT_LIMIT:.2}×"),
            verdict(pass).to_owned(),
        ],
        vec![
            format!("raw: {TASKS} tasks, {TASKS} dedicated connections, prepared"),
            fmt_rate(baseline_rate),
            fmt_ns(baseline_latency.p50()),
            fmt_ns(baseline_latency.p99()),
            "baseline".to_owned(),
            String::new(),
            String::new(),
        ],
        vec![
            format!("raw: as above, the library's SQL text (simple query)"),
            fmt_rate(text_rate),
            fmt_ns(text_latency.p50()),
            fmt_ns(text_latency.p99()),
            fmt_ratio(ratio(text_rate, baseline_rate)),
            String::new(),
            String::new(),
        ],
    ];
    Ok(Outcome {
        id: "throughput",
        section: Section {
            title: format!("3. Throughput: {TASKS} tasks on {TASKS} distinct keys"),
            notes: vec![format!(
                "{} rounds of {:.1} s per variant, the order rotating; ops/s is the median over rounds; \
                 latencies are per acquire+release, all rounds merged.",
                plan.throughput_rounds,
                plan.throughput_window.as_secs_f64()
            )],
            header: vec![
                "Variant", "ops/s", "p50", "p99", "÷ raw", "Target", "Result",
            ],
            rows,
        },
        checks: vec![Check::new(
            "throughput, 16 tasks on distinct keys, vs raw",
            format!(
                "{} ({} vs {}; {spread})",
                fmt_ratio(share),
                fmt_rate(library_rate),
                fmt_rate(baseline_rate)
            ),
            format!("≥ {THROUGHPUT_LIMIT:.2}×"),
            pass,
        )],
        json: json!({
            "tasks": TASKS,
            "rounds": plan.throughput_rounds,
            "window_s": plan.throughput_window.as_secs_f64(),
            "library": {
                "ops_per_s_median": library_rate,
                "ops_per_s_rounds": library_rates,
                "latency": library_latency.to_json(),
            },
            "raw": {
                "ops_per_s_median": baseline_rate,
                "ops_per_s_rounds": baseline_rates,
                "latency": baseline_latency.to_json(),
            },
            "raw_library_sql_text": {
                "ops_per_s_median": text_rate,
                "ops_per_s_rounds": text_rates,
                "latency": text_latency.to_json(),
            },
            "ratio": share,
        }),
        files: Vec::new(),
    })
}
