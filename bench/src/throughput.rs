//! Scenario 3: 16 tasks on 16 distinct keys, as fast as they can, for a fixed time: the
//! library (one manager, a pool of 16) against raw tokio-postgres (16 dedicated
//! connections, prepared) and raw sending the library's SQL text, each task a client of
//! [`crate::clients`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::json;

use crate::clients::{Op, keys, library_text};
use crate::db::{Database, Raw};
use crate::harness::{self, Outcome, Ratios, Window, cells};
use crate::stats::{Latencies, fmt_ns, fmt_rate, fmt_ratio, median, ratio};
use crate::{BoxError, Plan};

/// The least library throughput allowed, as a fraction of raw.
const THROUGHPUT_LIMIT: f64 = 0.95;
const TASKS: usize = 16;
const APP: &str = "lock-bench-throughput";

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let pool = db.pool(TASKS, APP);
    db.warm(&pool, TASKS).await?;
    let manager = PostgresLockManager::new(pool);
    // Side 0 the library, 1 raw prepared, 2 raw with the library's SQL text: per task a
    // client on a key of its own.
    let mut clients: [Vec<Arc<Op>>; 3] = Default::default();
    for task in 0..TASKS {
        let keys = keys(&format!("bench:throughput:{task}"), 1);
        let id = lock_id(&keys[0]);
        let ops = [
            Op::Acquire {
                manager: manager.clone(),
                keys,
                options: AcquireOptions::new(),
            },
            Op::RawPrepared {
                raw: Raw::connect(db, APP, false).await?,
                ids: vec![id],
                try_lock: false,
            },
            Op::RawText {
                client: db.connect(APP).await?,
                texts: vec![library_text(id)],
            },
        ];
        for (side, op) in ops.into_iter().enumerate() {
            clients[side].push(Arc::new(op));
        }
    }
    let window = async |side: usize, length: Duration| {
        let end = Instant::now() + length;
        harness::window(TASKS, |task| {
            let (op, mut n) = (Arc::clone(&clients[side][task]), 0);
            harness::until(end, async move || {
                n += 1;
                op.cycle(n).await
            })
        })
        .await
    };
    // A short unrecorded window of the first two, then rounds, the order rotating.
    window(0, plan.throughput_window / 4).await?;
    window(1, plan.throughput_window / 4).await?;
    let mut windows: [Vec<Window>; 3] = Default::default();
    harness::rounds(plan.throughput_rounds, 3, async |_, side| {
        windows[side].push(window(side, plan.throughput_window).await?);
        Ok(())
    })
    .await?;
    // Per side: the rate of each round, their median, and every latency merged.
    let sides = windows.map(|windows| {
        let rates: Vec<f64> = windows.iter().map(Window::rate).collect();
        let mut latency = Latencies::new();
        windows.iter().for_each(|w| latency.merge(&w.latencies));
        (median(&rates), rates, latency)
    });
    let [
        (library, library_rates, _),
        (baseline, baseline_rates, _),
        (text, ..),
    ] = &sides;
    let share = ratio(*library, *baseline);
    // The spread: library ÷ raw round by round (each round runs both, back to back).
    let per_round: Vec<f64> = library_rates
        .iter()
        .zip(baseline_rates)
        .filter_map(|(library, raw)| ratio(*library, *raw))
        .collect();
    let spread = Ratios::of(&per_round).map_or("—".to_owned(), |r| {
        format!("rounds {:.2}–{:.2}×", r.low, r.high)
    });
    let mut out = Outcome::new(
        "throughput",
        format!("3. Throughput: {TASKS} tasks on {TASKS} distinct keys"),
        &[
            "Variant", "ops/s", "p50", "p99", "÷ raw", "Target", "Result",
        ],
    );
    out.note(format!(
        "{} rounds of {:.1} s per variant, the order rotating; ops/s is the median over \
         rounds; latencies are per acquire+release, all rounds merged.",
        plan.throughput_rounds,
        plan.throughput_window.as_secs_f64()
    ));
    let measured = format!(
        "{} ({} vs {}; {spread})",
        fmt_ratio(share),
        fmt_rate(*library),
        fmt_rate(*baseline)
    );
    let limit = format!("≥ {THROUGHPUT_LIMIT:.2}×");
    let pass = share.is_some_and(|s| s >= THROUGHPUT_LIMIT);
    let gate = out.gate(
        "throughput, 16 tasks on distinct keys, vs raw",
        measured,
        limit,
        pass,
    );
    let names = [
        format!("library: {TASKS} tasks, one manager, pool of {TASKS}"),
        format!("raw: {TASKS} tasks, {TASKS} dedicated connections, prepared"),
        "raw: as above, the library's SQL text with a 5 s timeout (simple query)".to_owned(),
    ];
    let ratios = [
        format!("{} ({spread})", fmt_ratio(share)),
        "baseline".to_owned(),
        fmt_ratio(ratio(*text, *baseline)),
    ];
    let mut json_sides = Vec::new();
    for (index, (rate, rates, latency)) in sides.iter().enumerate() {
        let [target, result] = if index == 0 {
            gate.clone()
        } else {
            Default::default()
        };
        out.row(cells![
            names[index],
            fmt_rate(*rate),
            fmt_ns(latency.p50()),
            fmt_ns(latency.p99()),
            ratios[index],
            target,
            result
        ]);
        json_sides.push(json!({
            "ops_per_s_median": rate,
            "ops_per_s_rounds": rates,
            "latency": latency.to_json(),
        }));
    }
    Ok(out.with(json!({
        "tasks": TASKS,
        "rounds": plan.throughput_rounds,
        "window_s": plan.throughput_window.as_secs_f64(),
        "library": json_sides[0],
        "raw": json_sides[1],
        "raw_library_sql_text": json_sides[2],
        "ratio": share,
    })))
}
