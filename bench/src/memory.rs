//! Scenario 6: the in-memory manager against a `tokio::sync::Mutex`: uncontended cycles in
//! batches, and 16 tasks on one key.

use std::sync::Arc;

use locks_memory::InMemoryLockManager;
use locks_port::{AcquireOptions, DistributedLock, LockGuard};
use serde_json::json;
use tokio::sync::Mutex;

use crate::harness::{self, Cell, Outcome, row};
use crate::stats::{median, ratio};
use crate::{Plan, Result};

const TASKS: usize = 16;
const KEY: &str = "bench:memory";

async fn cycle(side: usize, manager: &InMemoryLockManager, mutex: &Mutex<()>) -> Result<()> {
    if side == 0 {
        let guard = manager.acquire(KEY, AcquireOptions::new()).await?;
        guard.release().await;
    } else {
        drop(mutex.lock().await);
    }
    Ok(())
}

pub(crate) async fn run(plan: &Plan) -> Result<Outcome> {
    let manager = InMemoryLockManager::new();
    let mutex = Arc::new(Mutex::new(()));
    let (ops, rounds, batches) = (1000, plan.pick(4, 10), plan.pick(20, 50));
    // Uncontended cycles: a timed call is `ops` of them (one is too short to time alone).
    let calls = harness::batches(2, (1, rounds, batches), async |side, _| {
        for _ in 0..ops {
            cycle(side, &manager, &mutex).await?;
        }
        Ok(())
    })
    .await?;
    // Contended throughput: 16 tasks, one key, alternating rounds (untimed cycles).
    let (window, seconds) = (plan.window(), plan.window().as_secs_f64());
    let rates = harness::rates(plan.pick(4, 6), window, TASKS, |side, _, end| {
        let (manager, mutex) = (manager.clone(), Arc::clone(&mutex));
        harness::until(end, 0, false, async move || {
            cycle(side, &manager, &mutex).await
        })
    })
    .await?;
    let (library, baseline) = (&calls[0].pooled, &calls[1].pooled);
    let per_op = |nanos: u64| Cell::ns(nanos / ops as u64);
    let [library_rate, mutex_rate] = rates.each_ref().map(|r| median(r.iter().copied()));
    let cycle_ratio = calls[0].ratios_to(&calls[1]).map(|r| r.median);
    let mut out = Outcome::new("in_memory", "6. In-memory manager vs tokio::sync::Mutex");
    out.note(format!(
        "Cycle: {rounds} rounds × {batches} batches of {ops} operations per side, \
         interleaved; each batch gives one per-operation time, and p50/p99 are over batches; \
         ÷ Mutex round by round. \
         Contended: {TASKS} tasks looping on one key (one `Mutex`) for {seconds:.1} s per \
         window. No target: the in-memory manager is a test double; this shows what \
         its bookkeeping (key map, `LockInfo`, timestamps) costs over a bare mutex."
    ));
    out.row(row![
        "Measure" => format!("uncontended acquire + release (per op, batches of {ops})"),
        "library p50" => per_op(library.p50()),
        "library p99" => per_op(library.p99()),
        "Mutex p50" => per_op(baseline.p50()),
        "Mutex p99" => per_op(baseline.p99()),
        "÷ Mutex" => Cell::ratio(cycle_ratio),
    ]);
    out.row(row![
        "Measure" => format!("{TASKS} tasks on one key, ops/s (median of rounds)"),
        "library p50" => Cell::rate(library_rate),
        "Mutex p50" => Cell::rate(mutex_rate),
        "÷ Mutex" => Cell::ratio(ratio(library_rate, mutex_rate)),
    ]);
    Ok(out.with(json!({ "ops_per_s_rounds": { "library": rates[0], "mutex": rates[1] } })))
}
