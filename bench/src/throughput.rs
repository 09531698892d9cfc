//! Scenario 3: 16 tasks on 16 distinct keys, as fast as they can, for a fixed time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::{Value, json};

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
    let mut windows: [Vec<Window>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    interleave::rounds(plan.throughput_rounds, 3, async |_, side| {
        windows[side].push(match side {
            0 => library_window(length).await?,
            1 => raw_window(length).await?,
            _ => text_window(length).await?,
        });
        Ok(())
    })
    .await?;

    // Per side: the rate of each round, their median, and every latency merged.
    let sides = windows.map(|windows| {
        let rates: Vec<f64> = windows.iter().map(Window::rate).collect();
        let mut latency = Latencies::new();
        for window in &windows {
            latency.merge(&window.latencies);
        }
        (median(&rates), rates, latency)
    });
    let [
        (library_rate, library_rates, _),
        (baseline_rate, baseline_rates, _),
        (text_rate, ..),
    ] = &sides;
    let share = ratio(*library_rate, *baseline_rate);
    let pass = share.is_some_and(|s| s >= THROUGHPUT_LIMIT);
    // The spread: library ÷ raw round by round (each round runs both, back to back).
    let per_round: Vec<f64> = library_rates
        .iter()
        .zip(baseline_rates)
        .filter_map(|(library, raw)| ratio(*library, *raw))
        .collect();
    let low = per_round.iter().copied().fold(f64::INFINITY, f64::min);
    let high = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let spread = format!("rounds {low:.2}–{high:.2}×");
    let names = [
        format!("library: {TASKS} tasks, one manager, pool of {TASKS}"),
        format!("raw: {TASKS} tasks, {TASKS} dedicated connections, prepared"),
        "raw: as above, the library's SQL text (simple query)".to_owned(),
    ];
    let ratios = [
        format!("{} ({spread})", fmt_ratio(share)),
        "baseline".to_owned(),
        fmt_ratio(ratio(*text_rate, *baseline_rate)),
    ];
    let mut rows = Vec::new();
    let mut json_sides = Vec::new();
    for (index, (rate, rates, latency)) in sides.iter().enumerate() {
        let (target, result) = if index == 0 {
            (
                format!("≥ {THROUGHPUT_LIMIT:.2}×"),
                verdict(pass).to_owned(),
            )
        } else {
            (String::new(), String::new())
        };
        rows.push(vec![
            names[index].clone(),
            fmt_rate(*rate),
            fmt_ns(latency.p50()),
            fmt_ns(latency.p99()),
            ratios[index].clone(),
            target,
            result,
        ]);
        json_sides.push(json!({
            "ops_per_s_median": rate,
            "ops_per_s_rounds": rates,
            "latency": latency.to_json(),
        }));
    }
    let [library_json, raw_json, text_json] =
        <[Value; 3]>::try_from(json_sides).map_err(|_| "three sides")?;
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
                fmt_rate(*library_rate),
                fmt_rate(*baseline_rate)
            ),
            format!("≥ {THROUGHPUT_LIMIT:.2}×"),
            pass,
        )],
        json: json!({
            "tasks": TASKS,
            "rounds": plan.throughput_rounds,
            "window_s": plan.throughput_window.as_secs_f64(),
            "library": library_json,
            "raw": raw_json,
            "raw_library_sql_text": text_json,
            "ratio": share,
        }),
        files: Vec::new(),
    })
}
