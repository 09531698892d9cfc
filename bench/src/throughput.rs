//! Scenario `throughput`: N tasks (1 → 1,000) each on a key of its own, acquire + release
//! in a loop for a window: one manager on min(N, [`CONNECTIONS`]) connections
//! (`multiplex` when the tasks outnumber them; at 16 tasks a plain pool of 16) against raw
//! tokio-postgres on as many dedicated connections, prepared, pipelined. Library and raw
//! alternate window by window; a side's figure is the median of its windows' rates, the
//! spread that of the library ÷ raw ratios window by window. The target is at 16 tasks.

use std::sync::Arc;
use std::time::Instant;

use locks_port::{AcquireOptions, DistributedLock, LockGuard, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::json;

use crate::db::{Database, Raw};
use crate::harness::{self, Cell, Outcome, Ratios, cells};
use crate::stats::{fmt_ratio, median, ratio};
use crate::turns::open_pool;
use crate::{BoxError, Plan};

/// Concurrent tasks; the target is at [`GATED`].
const TASKS: [usize; 5] = [1, 10, 16, 100, 1000];
const GATED: usize = 16;
/// The least library throughput allowed at [`GATED`] tasks, as a fraction of raw.
const LIMIT: f64 = 0.95;
/// At most this many connections serve either side.
const CONNECTIONS: usize = 100;
const APP: &str = "lock-bench-throughput";

/// One point of the curve: the rates of each window, library and raw.
#[derive(Debug)]
struct Point {
    tasks: usize,
    connections: usize,
    rates: [Vec<f64>; 2],
}

impl Point {
    fn ratio(&self) -> Option<f64> {
        ratio(median(&self.rates[0]), median(&self.rates[1]))
    }
}

async fn point(db: &Database, plan: &Plan, tasks: usize) -> Result<Point, BoxError> {
    let connections = tasks.min(CONNECTIONS);
    let manager = PostgresLockManager::builder(open_pool(db, connections, APP).await?)
        .multiplex(tasks.div_ceil(connections))
        .build();
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Raw::connect(db, APP, false).await?);
    }
    let clients = Arc::new(clients);
    let mut rates: [Vec<f64>; 2] = Default::default();
    harness::rounds(plan.pick(3, 6), 2, async |_, side| {
        let end = Instant::now() + plan.window();
        let window = harness::window(tasks, |task| {
            let key = format!("bench:throughput:{task}");
            let (manager, clients) = (manager.clone(), Arc::clone(&clients));
            let id = lock_id(&key);
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
        .await?;
        rates[side].push(window.rate());
        Ok(())
    })
    .await?;
    Ok(Point {
        tasks,
        connections,
        rates,
    })
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    // Both sides' connections at once, with room to spare: the points the server allows.
    let admin = db.connect(APP).await?;
    let allowed: String = admin.query_one("SHOW max_connections", &[]).await?.get(0);
    let room = allowed.parse::<usize>().unwrap_or(0).saturating_sub(20) / 2;
    let (counts, skipped): (Vec<usize>, Vec<usize>) =
        TASKS.iter().partition(|&&t| t.min(CONNECTIONS) <= room);
    drop(admin);
    let mut points = Vec::new();
    for tasks in counts {
        let measured = point(db, plan, tasks).await;
        points.push(measured.map_err(|error| format!("throughput, {tasks} tasks: {error}"))?);
    }
    let header = ["Tasks", "Connections", "library", "raw", "÷ raw", "Result"];
    let title = "3. Throughput: N tasks on distinct keys";
    let mut out = Outcome::new("throughput", title, &header);
    out.note(format!(
        "{} rounds of a {:.1} s window per side, alternating; cycles/s is the median over \
         windows, ÷ raw the ratio of the medians (the windows' own ratios beside).",
        plan.pick(3, 6),
        plan.window().as_secs_f64()
    ));
    if !skipped.is_empty() {
        out.note(format!(
            "Not measured: {skipped:?} tasks (the server allows {allowed} connections)."
        ));
    }
    for p in &points {
        let per_window: Vec<f64> = (p.rates[0].iter().zip(&p.rates[1]))
            .filter_map(|(library, raw)| ratio(*library, *raw))
            .collect();
        let spread = Ratios::fmt(Ratios::of(&per_window)).1;
        let shown = Cell::new(
            format!("{} (windows {spread})", fmt_ratio(p.ratio())),
            p.ratio(),
        );
        let [library, raw] = p.rates.each_ref().map(|r| Cell::rate(median(r)));
        let result = if p.tasks == GATED {
            let pass = p.ratio().is_some_and(|r| r >= LIMIT);
            let text = format!("{}; {} vs {}", shown.text, library.text, raw.text);
            let measured = Cell::new(text, p.ratio());
            let what = format!("throughput, {GATED} tasks on distinct keys, vs raw");
            let [_, result] = out.gate(what, measured, format!("≥ {LIMIT:.2}×"), pass);
            result
        } else {
            Cell::default()
        };
        out.row(cells![p.tasks, p.connections, library, raw, shown, result]);
    }
    let windows: Vec<_> = points.iter().map(|p| &p.rates).collect();
    Ok(out.with(json!({ "per_s_by_window_library_raw": windows })))
}
