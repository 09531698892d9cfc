//! Scenario 6: the in-memory manager against a `tokio::sync::Mutex`: uncontended cycles in
//! batches, and 16 tasks on one key.

use std::sync::Arc;
use std::time::Instant;

use locks_memory::InMemoryLockManager;
use locks_port::{AcquireOptions, DistributedLock, LockGuard};
use serde_json::json;
use tokio::sync::Mutex;

use crate::harness::{self, Outcome, cells};
use crate::stats::{Latencies, as_f64, fmt_ns, fmt_rate, fmt_ratio, median, ratio};
use crate::{BoxError, Plan};

const TASKS: usize = 16;
const KEY: &str = "bench:memory";

/// One acquire + release of the library (`side` 0) or one lock of the mutex.
async fn cycle(
    side: usize,
    manager: &InMemoryLockManager,
    mutex: &Mutex<()>,
) -> Result<(), BoxError> {
    if side == 0 {
        manager
            .acquire(KEY, AcquireOptions::new())
            .await?
            .release()
            .await;
    } else {
        drop(mutex.lock().await);
    }
    Ok(())
}

/// Per-operation time of `ops` cycles, in nanoseconds.
async fn batch(
    side: usize,
    manager: &InMemoryLockManager,
    mutex: &Mutex<()>,
    ops: usize,
) -> Result<u64, BoxError> {
    let started = Instant::now();
    for _ in 0..ops {
        cycle(side, manager, mutex).await?;
    }
    Ok(u64::try_from(started.elapsed().as_nanos() / ops.max(1) as u128).unwrap_or(u64::MAX))
}

pub(crate) async fn run(plan: &Plan) -> Result<Outcome, BoxError> {
    let manager = InMemoryLockManager::new();
    let mutex = Arc::new(Mutex::new(()));
    let batch_ops = plan.memory_batch;

    // Uncontended cycles: batches, interleaved.
    let mut per_op = [Latencies::new(), Latencies::new()];
    for side in 0..2 {
        batch(side, &manager, &mutex, batch_ops).await?;
    }
    harness::rounds(plan.memory_rounds, 2, async |_, side| {
        for _ in 0..plan.memory_batches {
            per_op[side].record_ns(batch(side, &manager, &mutex, batch_ops).await?);
        }
        Ok(())
    })
    .await?;

    // Contended throughput: 16 tasks, one key, alternating rounds (untimed cycles).
    let mut rates: [Vec<f64>; 2] = Default::default();
    harness::rounds(plan.memory_windows, 2, async |_, side| {
        let end = Instant::now() + plan.memory_window;
        let window = harness::window(TASKS, |_| {
            let (manager, mutex) = (manager.clone(), Arc::clone(&mutex));
            harness::count(end, async move || cycle(side, &manager, &mutex).await)
        })
        .await?;
        rates[side].push(window.rate());
        Ok(())
    })
    .await?;
    let [library, baseline] = &per_op;
    let (library_rate, mutex_rate) = (median(&rates[0]), median(&rates[1]));
    let cycle_ratio = ratio(as_f64(library.p50()), as_f64(baseline.p50()));
    let header = [
        "Measure",
        "library p50",
        "library p99",
        "Mutex p50",
        "Mutex p99",
        "÷ Mutex",
    ];
    let mut out = Outcome::new(
        "in_memory",
        "6. In-memory manager vs tokio::sync::Mutex",
        &header,
    );
    out.note(format!(
        "Cycle: {} rounds × {} batches of {batch_ops} operations per side, interleaved; \
         each batch gives one per-operation time, and p50/p99 are over batches. \
         Contended: {TASKS} tasks looping on one key (one `Mutex`) for {:.1} s per \
         window. No target: the in-memory manager is a test double; this shows what \
         its bookkeeping (key map, `LockInfo`, timestamps) costs over a bare mutex.",
        plan.memory_rounds,
        plan.memory_batches,
        plan.memory_window.as_secs_f64()
    ));
    out.row(cells![
        format!("uncontended acquire + release (per op, batches of {batch_ops})"),
        fmt_ns(library.p50()),
        fmt_ns(library.p99()),
        fmt_ns(baseline.p50()),
        fmt_ns(baseline.p99()),
        fmt_ratio(cycle_ratio),
    ]);
    out.row(cells![
        format!("{TASKS} tasks on one key, ops/s (median of rounds)"),
        fmt_rate(library_rate),
        "",
        fmt_rate(mutex_rate),
        "",
        fmt_ratio(ratio(library_rate, mutex_rate)),
    ]);
    Ok(out.with(json!({
        "cycle": {
            "batch": batch_ops,
            "library_per_op": library.to_json(),
            "mutex_per_op": baseline.to_json(),
            "ratio_p50": cycle_ratio,
        },
        "contended": {
            "tasks": TASKS,
            "window_s": plan.memory_window.as_secs_f64(),
            "library_ops_per_s_median": library_rate,
            "library_ops_per_s_rounds": rates[0],
            "mutex_ops_per_s_median": mutex_rate,
            "mutex_ops_per_s_rounds": rates[1],
            "ratio": ratio(library_rate, mutex_rate),
        },
    })))
}
