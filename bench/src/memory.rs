//! Scenario 6: the in-memory manager against a `tokio::sync::Mutex`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_memory::InMemoryLockManager;
use locks_port::{AcquireOptions, DistributedLock, LockGuard};
use serde_json::json;
use tokio::sync::Mutex;

use crate::report::{Outcome, Section};
use crate::stats::{Latencies, as_f64, fmt_ns, fmt_rate, fmt_ratio, median, ratio};
use crate::{BoxError, Plan, interleave};

const TASKS: usize = 16;
const KEY: &str = "bench:memory";

async fn library_batch(manager: &InMemoryLockManager, ops: usize) -> Result<Duration, BoxError> {
    let started = Instant::now();
    for _ in 0..ops {
        let guard = manager.acquire(KEY, AcquireOptions::new()).await?;
        guard.release().await;
    }
    Ok(started.elapsed())
}

async fn mutex_batch(mutex: &Mutex<()>, ops: usize) -> Duration {
    let started = Instant::now();
    for _ in 0..ops {
        let guard = mutex.lock().await;
        drop(guard);
    }
    started.elapsed()
}

/// Per-operation time of a batch, in nanoseconds.
fn per_op(elapsed: Duration, ops: usize) -> u64 {
    u64::try_from(elapsed.as_nanos() / ops.max(1) as u128).unwrap_or(u64::MAX)
}

/// `TASKS` tasks on one lock for `length`; operations per second.
async fn contended<F, Fut>(length: Duration, task: F) -> Result<f64, BoxError>
where
    F: Fn(Instant) -> Fut,
    Fut: Future<Output = Result<u64, BoxError>> + Send + 'static,
{
    let started = Instant::now();
    let end = started + length;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        tasks.spawn(task(end));
    }
    let mut ops = 0;
    while let Some(joined) = tasks.join_next().await {
        ops += joined??;
    }
    Ok(as_f64(ops) / started.elapsed().as_secs_f64())
}

pub(crate) async fn run(plan: &Plan) -> Result<Outcome, BoxError> {
    let manager = InMemoryLockManager::new();
    let mutex = Arc::new(Mutex::new(()));
    let batch = plan.memory_batch;

    // Uncontended cycles: batches, interleaved.
    library_batch(&manager, batch).await?;
    mutex_batch(&mutex, batch).await;
    let mut library = Latencies::new();
    let mut baseline = Latencies::new();
    interleave::rounds(plan.memory_rounds, 2, async |_, side| {
        for _ in 0..plan.memory_batches {
            match side {
                0 => library.record_ns(per_op(library_batch(&manager, batch).await?, batch)),
                _ => baseline.record_ns(per_op(mutex_batch(&mutex, batch).await, batch)),
            }
        }
        Ok(())
    })
    .await?;

    // Contended throughput: 16 tasks, one key, alternating rounds.
    let (mut library_rates, mut mutex_rates) = (Vec::new(), Vec::new());
    interleave::rounds(plan.memory_windows, 2, async |_, side| {
        let (manager, mutex) = (manager.clone(), Arc::clone(&mutex));
        let rate = contended(plan.memory_window, move |end| {
            let (manager, mutex) = (manager.clone(), Arc::clone(&mutex));
            async move {
                let mut ops = 0;
                while Instant::now() < end {
                    if side == 0 {
                        let guard = manager.acquire(KEY, AcquireOptions::new()).await?;
                        guard.release().await;
                    } else {
                        drop(mutex.lock().await);
                    }
                    ops += 1;
                }
                Ok(ops)
            }
        })
        .await?;
        if side == 0 {
            &mut library_rates
        } else {
            &mut mutex_rates
        }
        .push(rate);
        Ok(())
    })
    .await?;
    let (library_rate, mutex_rate) = (median(&library_rates), median(&mutex_rates));

    let cycle_ratio = ratio(as_f64(library.p50()), as_f64(baseline.p50()));
    let rows = vec![
        vec![
            "uncontended acquire + release (per op, batches of ".to_owned()
                + &batch.to_string()
                + ")",
            fmt_ns(library.p50()),
            fmt_ns(library.p99()),
            fmt_ns(baseline.p50()),
            fmt_ns(baseline.p99()),
            fmt_ratio(cycle_ratio),
        ],
        vec![
            format!("{TASKS} tasks on one key, ops/s (median of rounds)"),
            fmt_rate(library_rate),
            String::new(),
            fmt_rate(mutex_rate),
            String::new(),
            fmt_ratio(ratio(library_rate, mutex_rate)),
        ],
    ];
    Ok(Outcome {
        id: "in_memory",
        section: Section {
            title: "6. In-memory manager vs tokio::sync::Mutex".to_owned(),
            notes: vec![format!(
                "Cycle: {} rounds × {} batches of {batch} operations per side, interleaved; \
                 each batch gives one per-operation time, and p50/p99 are over batches. \
                 Contended: {TASKS} tasks looping on one key (one `Mutex`) for {:.1} s per \
                 window. No target: the in-memory manager is a test double; this shows what \
                 its bookkeeping (key map, `LockInfo`, timestamps) costs over a bare mutex.",
                plan.memory_rounds,
                plan.memory_batches,
                plan.memory_window.as_secs_f64()
            )],
            header: vec![
                "Measure",
                "library p50",
                "library p99",
                "Mutex p50",
                "Mutex p99",
                "÷ Mutex",
            ],
            rows,
        },
        checks: Vec::new(),
        json: json!({
            "cycle": {
                "batch": batch,
                "library_per_op": library.to_json(),
                "mutex_per_op": baseline.to_json(),
                "ratio_p50": cycle_ratio,
            },
            "contended": {
                "tasks": TASKS,
                "window_s": plan.memory_window.as_secs_f64(),
                "library_ops_per_s_median": library_rate,
                "library_ops_per_s_rounds": library_rates,
                "mutex_ops_per_s_median": mutex_rate,
                "mutex_ops_per_s_rounds": mutex_rates,
                "ratio": ratio(library_rate, mutex_rate),
            },
        }),
        files: Vec::new(),
    })
}
