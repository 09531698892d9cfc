//! Scenario `throughput`: N tasks each on a key of its own, one manager on min(N, 100)
//! connections (`multiplex` beyond) against as many raw connections, windows alternating.

use std::sync::Arc;

use locks_port::{AcquireOptions, DistributedLock, LockGuard, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::json;

use crate::db::{Database, Raw, open_pool, show};
use crate::harness::{self, Cell, Outcome, Ratios, row};
use crate::stats::{fmt_ratio, median, ratio};
use crate::{Plan, Result};

/// Concurrent tasks; the target is at [`GATED`]: at least [`LIMIT`] × raw.
const TASKS: [usize; 5] = [1, 10, 16, 100, 1000];
const GATED: usize = 16;
const LIMIT: f64 = 0.95;
const CONNECTIONS: usize = 100;
const APP: &str = "lock-bench-throughput";

async fn point(db: &Database, plan: &Plan, tasks: usize) -> Result<[Vec<f64>; 2]> {
    let connections = tasks.min(CONNECTIONS);
    let manager = PostgresLockManager::builder(open_pool(db, connections, APP).await?)
        .multiplex(tasks.div_ceil(connections))
        .build();
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Raw::connect(db, APP, false).await?);
    }
    let clients = Arc::new(clients);
    harness::rates(plan.pick(3, 6), plan.window(), tasks, |side, task, end| {
        let key = format!("bench:throughput:{task}");
        let (manager, clients, id) = (manager.clone(), Arc::clone(&clients), lock_id(&key));
        harness::until(end, 0, false, async move || {
            if side == 0 {
                let guard = manager.acquire(&key, AcquireOptions::new()).await?;
                guard.release().await;
                Ok(())
            } else {
                clients[task % clients.len()].cycle(id).await
            }
        })
    })
    .await
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome> {
    // Both sides' connections at once: the points the server allows.
    let allowed = show(&db.connect(APP).await?, "max_connections").await?;
    let room = allowed.parse::<usize>().unwrap_or(0).saturating_sub(20) / 2;
    let (counts, skipped): (Vec<usize>, Vec<usize>) =
        TASKS.iter().partition(|&&t| t.min(CONNECTIONS) <= room);
    let mut out = Outcome::new("throughput", "3. Throughput: N tasks on distinct keys");
    let (rounds, window) = (plan.pick(3, 6), plan.window().as_secs_f64());
    out.note(format!(
        "{rounds} rounds of a {window:.1} s window per side, alternating; cycles/s is the \
         median over windows, ÷ raw the ratio of the medians (the windows' own ratios beside)."
    ));
    if !skipped.is_empty() {
        out.note(format!(
            "Not measured: {skipped:?} tasks (the server allows {allowed} connections)."
        ));
    }
    let mut windows = Vec::new();
    for tasks in counts {
        let rates = point(db, plan, tasks).await;
        let rates = rates.map_err(|error| format!("throughput, {tasks} tasks: {error}"))?;
        let per_window = (rates[0].iter().zip(&rates[1])).filter_map(|(l, r)| ratio(*l, *r));
        let spread = Ratios::fmt(Ratios::of(&per_window.collect::<Vec<_>>())).1;
        let [library, raw] = rates.each_ref().map(|r| median(r.iter().copied()));
        let ratio = ratio(library, raw);
        let shown = Cell::new(format!("{} (windows {spread})", fmt_ratio(ratio)), ratio);
        let [library, raw] = [library, raw].map(Cell::rate);
        let result = if tasks == GATED {
            let text = format!("{}; {} vs {}", shown.text, library.text, raw.text);
            let what = format!("throughput, {GATED} tasks on distinct keys, vs raw");
            let pass = ratio.is_some_and(|r| r >= LIMIT);
            out.gate(what, Cell::new(text, ratio), format!("≥ {LIMIT:.2}×"), pass)[1].clone()
        } else {
            Cell::default()
        };
        out.row(row![
            "Tasks" => tasks,
            "Connections" => tasks.min(CONNECTIONS),
            "library" => library,
            "raw" => raw,
            "÷ raw" => shown,
            "Result" => result,
        ]);
        windows.push(rates);
    }
    Ok(out.with(json!({ "per_s_by_window_library_raw": windows })))
}
