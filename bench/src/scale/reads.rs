//! The observation reads curve: at each held-lock count, each read's own time while it
//! runs in a loop on the observer manager, and another manager's cycle p99 meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use locks_leader::LeaderElection;
use locks_postgres::PostgresLockManager;

use serde_json::{Value, json};

use super::held::{Held, on_held};
use super::{BLUE, GREEN, ORANGE, PROBE_CYCLES, Prober, curve};
use crate::BoxError;
use crate::chart::{Panel, Unit};
use crate::stats::{Latencies, as_f64, fmt_ns};

/// The observation reads, each on the observer manager.
#[derive(Debug, Clone, Copy)]
pub(super) enum Read {
    Holders,
    LockTableUsage,
    WhoLeads,
}

impl Read {
    pub(super) const ALL: [Self; 3] = [Self::Holders, Self::LockTableUsage, Self::WhoLeads];

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Holders => "holders(key)",
            Self::LockTableUsage => "lock_table_usage()",
            Self::WhoLeads => "who_leads()",
        }
    }

    async fn once(self, observer: &PostgresLockManager) -> Result<(), BoxError> {
        match self {
            Self::Holders => drop(observer.holders("bench:scale:probe").await?),
            Self::LockTableUsage => drop(observer.lock_table_usage().await?),
            Self::WhoLeads => {
                drop(
                    LeaderElection::new(observer.clone(), "bench:scale")
                        .who_leads()
                        .await?,
                );
            }
        }
        Ok(())
    }
}

/// What one read cost at one count.
#[derive(Debug)]
pub(super) struct ReadCost {
    pub(super) read: Read,
    /// The read's own time, p50 of its calls while it looped.
    pub(super) own: u64,
    pub(super) calls: usize,
    /// The probe's cycle p99 while it looped.
    pub(super) probe_p99: u64,
}

/// Each read's own time and the probe's p99 while it loops.
pub(super) async fn read_costs(
    observer: &PostgresLockManager,
    probe: &Prober,
) -> Result<Vec<ReadCost>, BoxError> {
    let mut costs = Vec::new();
    for read in Read::ALL {
        let stop = Arc::new(AtomicBool::new(false));
        let looping = {
            let (observer, stop) = (observer.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut own = Latencies::new();
                let mut calls = 0;
                while calls < 3 || !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    read.once(&observer).await?;
                    own.record(started.elapsed());
                    calls += 1;
                }
                Ok::<_, BoxError>((own.p50(), calls))
            })
        };
        let during = probe.cycles(PROBE_CYCLES).await?;
        stop.store(true, Ordering::Relaxed);
        let (own, calls) = looping.await??;
        costs.push(ReadCost {
            read,
            own,
            calls,
            probe_p99: during.1,
        });
    }
    Ok(costs)
}

/// The reads' cell of a held-lock row: each one's own time, and the cycle p99 while it
/// looped ÷ the p99 without it.
pub(super) fn cell(h: &Held) -> String {
    let reads: Vec<String> = h
        .reads
        .iter()
        .map(|r| {
            format!(
                "{} {} (p99 ×{:.2})",
                r.read.name(),
                fmt_ns(r.own),
                slowdown(h, r)
            )
        })
        .collect();
    reads.join("; ")
}

fn slowdown(h: &Held, r: &ReadCost) -> f64 {
    as_f64(r.probe_p99) / as_f64(h.probe.1.max(1))
}

pub(super) fn json(h: &Held) -> Vec<Value> {
    h.reads
        .iter()
        .map(|r| {
            json!({
                "read": r.read.name(),
                "own_p50_ns": r.own,
                "calls": r.calls,
                "cycle_p99_ns_while_looping": r.probe_p99,
                "ratio_to_cycle_p99": slowdown(h, r),
            })
        })
        .collect()
}

/// Each read's own time, and the cycle p99 while it loops ÷ without.
pub(super) fn panels(held: &[Held]) -> [Panel; 2] {
    let colors = [BLUE, ORANGE, GREEN];
    let curves = |label: &dyn Fn(Read) -> String, y: &dyn Fn(&Held, &ReadCost) -> f64| {
        (Read::ALL.iter().zip(colors).enumerate())
            .map(|(index, (read, color))| {
                let points = on_held(held, |h| y(h, &h.reads[index]));
                curve(&label(*read), color, false, points)
            })
            .collect()
    };
    [
        Panel {
            title: "one observation read's own time".to_owned(),
            x_desc: "held locks",
            y_desc: "time",
            y_unit: Unit::Nanos,
            curves: curves(&|read| read.name().to_owned(), &|_, r| as_f64(r.own)),
        },
        Panel {
            title: "cycle p99 while a read loops ÷ without".to_owned(),
            x_desc: "held locks",
            y_desc: "ratio",
            y_unit: Unit::Plain,
            curves: curves(&|read| format!("while {} loops", read.name()), &slowdown),
        },
    ]
}
