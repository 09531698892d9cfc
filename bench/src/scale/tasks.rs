//! The tasks curve: N tasks (1 → 1,000) each on its own key, acquire + release in a loop;
//! the library multiplexed on min(N, [`TASK_CONNECTIONS`]) connections against raw
//! pipelined on as many: throughput ÷ raw.

use std::sync::Arc;
use std::time::Instant;

use locks_port::{AcquireOptions, DistributedLock, LockGuard, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::{Value, json};

use super::{BLUE, curve, open_pool, x};
use crate::chart::{Panel, Unit};
use crate::db::{Database, Raw};
use crate::harness::{self, cells};
use crate::stats::{fmt_ratio, median, ratio};
use crate::{BoxError, Plan};

/// Concurrent tasks.
pub(super) const TASKS: [usize; 4] = [1, 10, 100, 1000];
/// At most this many connections serve the curve (either side).
pub(super) const TASK_CONNECTIONS: usize = 100;
const APP: &str = "lock-bench-scale-tasks";

/// Throughput of `tasks` tasks on distinct keys, library and raw, medians of rounds.
#[derive(Debug)]
pub(super) struct Tasks {
    tasks: usize,
    connections: usize,
    library: f64,
    raw: f64,
}

pub(super) async fn point(db: &Database, plan: &Plan, tasks: usize) -> Result<Tasks, BoxError> {
    let connections = tasks.min(TASK_CONNECTIONS);
    let pool = open_pool(db, connections, APP).await?;
    let manager = PostgresLockManager::builder(pool)
        .multiplex(tasks.div_ceil(connections))
        .build();
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(Raw::connect(db, APP, false).await?);
    }
    let clients = Arc::new(clients);
    let mut rates: [Vec<f64>; 2] = Default::default();
    harness::rounds(plan.scale_rounds, 2, async |_, side| {
        let end = Instant::now() + plan.scale_window;
        let window = harness::window(tasks, |task| {
            let key = format!("bench:scale:tasks:{task}");
            let (manager, clients) = (manager.clone(), Arc::clone(&clients));
            let id = lock_id(&key);
            harness::count(end, async move || {
                if side == 0 {
                    manager
                        .acquire(&key, AcquireOptions::new())
                        .await?
                        .release()
                        .await;
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
    Ok(Tasks {
        tasks,
        connections,
        library: median(&rates[0]),
        raw: median(&rates[1]),
    })
}

pub(super) fn row(t: &Tasks) -> Vec<String> {
    cells![
        format!("{} tasks, distinct keys", t.tasks),
        format!(
            "{:.0} cycles/s (raw {:.0}), {} connections each",
            t.library, t.raw, t.connections
        ),
        format!("÷ raw {}", fmt_ratio(ratio(t.library, t.raw))),
        "",
    ]
}

pub(super) fn json(t: &Tasks) -> Value {
    json!({
        "tasks": t.tasks, "connections": t.connections,
        "library_per_s": t.library, "raw_per_s": t.raw,
        "ratio": ratio(t.library, t.raw),
    })
}

pub(super) fn panel(tasks: &[Tasks]) -> Panel {
    let points = tasks
        .iter()
        .map(|t| (x(t.tasks), ratio(t.library, t.raw).unwrap_or(0.0)))
        .collect();
    Panel {
        title: "throughput ÷ raw, distinct keys".to_owned(),
        x_desc: "concurrent tasks",
        y_desc: "ratio",
        y_unit: Unit::Plain,
        curves: vec![curve("library ÷ raw", BLUE, false, points)],
    }
}
