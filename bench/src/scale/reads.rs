//! The observation reads curve: at each held-lock count, each read's own time while it
//! runs in a loop on the observer manager, and another manager's cycle p99 meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use locks_leader::{LeaderElection, LeaderWatch};
use locks_port::{AcquireOptions, LeaderBoard, PermitGuard, Semaphore};
use locks_postgres::PostgresLockManager;
use locks_shard::{ShardGroup, ShardTerms};
use locks_shard_postgres::PostgresShardTerms;

use super::held::{Held, on_held};
use super::{PROBE_CYCLES, record};
use crate::BoxError;
use crate::chart::{BLUE, GREEN, ORANGE, Panel, Unit, curve, panel};
use crate::clients::Op;
use crate::stats::{Latencies, as_f64, fmt_ns};

/// How long the cycle is measured beside each observer at its interval (and as long
/// without one), in [`ROUNDS`] alternating windows.
pub(super) const OBSERVE_WINDOW: Duration = Duration::from_secs(10);
/// The alternating windows with and without an observer.
pub(super) const ROUNDS: u32 = 5;
/// The interval of the lock-table gauge observer.
pub(super) const GAUGE_INTERVAL: Duration = Duration::from_secs(5);
/// The election a leader holds while the reads are measured (with a board).
pub(super) const LEADER: &str = "bench:scale";

/// The observation reads, each on the observer manager.
#[derive(Debug, Clone, Copy)]
pub(super) enum Read {
    Holders,
    LockTableUsage,
    WhoLeads,
    /// One leader watch at its default interval, for [`OBSERVE_WINDOW`], with a board
    /// (`true`), or without: naming the leader from `permit_holders` (`pg_locks`), as
    /// every watch did before the board named it.
    Watch(bool),
    /// `lock_table_usage()` every [`GAUGE_INTERVAL`], for [`OBSERVE_WINDOW`].
    Gauge,
    /// A semaphore's acquire + release in a loop, for [`OBSERVE_WINDOW`].
    Permits,
    /// A shard group's owners (what a member's tick reads, and `pglock shards`): the
    /// members from the term store's roster and the term rows (`true`), or the members
    /// from `permit_holders` (`pg_locks`), as before the roster.
    ShardOwners(bool),
}

/// The shard group a member runs while the reads are measured.
pub(super) struct Sharded {
    pub(super) group: ShardGroup,
    pub(super) terms: PostgresShardTerms,
}

/// A read in the JSON: its name.
impl serde::Serialize for Read {
    fn serialize<S: serde::Serializer>(&self, to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(self.name())
    }
}

impl Read {
    pub(super) const ALL: [Self; 9] = [
        Self::Holders,
        Self::LockTableUsage,
        Self::WhoLeads,
        Self::Watch(true),
        Self::Watch(false),
        Self::Gauge,
        Self::Permits,
        Self::ShardOwners(true),
        Self::ShardOwners(false),
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Holders => "holders(key)",
            Self::LockTableUsage => "lock_table_usage()",
            Self::WhoLeads => "who_leads()",
            Self::Watch(true) => "watch() at its interval",
            Self::Watch(false) => "watch() without a board",
            Self::Gauge => "lock_table_usage() every 5 s",
            Self::Permits => "permit acquire + release",
            Self::ShardOwners(true) => "shard owners()",
            Self::ShardOwners(false) => "shard owners() from pg_locks",
        }
    }

    /// Whether it runs until aborted (its own time is not counted).
    fn endless(self) -> bool {
        matches!(self, Self::Watch(_) | Self::Gauge)
    }

    async fn once(self, observer: &PostgresLockManager, sharded: &Sharded) -> Result<(), BoxError> {
        let election = || LeaderElection::new(observer.clone(), LEADER);
        match self {
            Self::Holders => drop(observer.holders("bench:scale:probe").await?),
            Self::LockTableUsage => drop(observer.lock_table_usage().await?),
            Self::WhoLeads => drop(election().board(observer.clone()).who_leads().await?),
            Self::Watch(true) => watch(election().board(observer.clone()).watch()).await?,
            Self::Watch(false) => watch(election().watch()).await?,
            Self::Gauge => {
                observer.lock_table_usage().await?;
                tokio::time::sleep(GAUGE_INTERVAL).await;
            }
            Self::Permits => {
                let options = AcquireOptions::new();
                let permit = observer.acquire_permit("bench:scale:permits", 2, options);
                permit.await?.release().await;
            }
            Self::ShardOwners(true) => {
                drop(locks_shard::owners(observer, &sharded.terms, &sharded.group).await?);
            }
            Self::ShardOwners(false) => {
                drop(
                    observer
                        .permit_holders(&sharded.group.members_name())
                        .await?,
                );
                drop(sharded.terms.terms(sharded.group.name()).await?);
            }
        }
        Ok(())
    }
}

/// Follows a leader watch until aborted (the leader does not change).
async fn watch<S: Semaphore, B: LeaderBoard>(
    mut watch: LeaderWatch<'_, S, B>,
) -> Result<(), BoxError> {
    loop {
        watch.changed().await?;
    }
}

/// What one read cost at one count.
#[derive(Debug, serde::Serialize)]
pub(super) struct ReadCost {
    pub(super) read: Read,
    /// The read's own time, p50 of its calls while it looped.
    pub(super) own: u64,
    pub(super) calls: usize,
    /// The probe's cycle p99 while it looped, and over as long without it.
    pub(super) probe_p99: u64,
    pub(super) quiet_p99: u64,
}

/// Each read's own time and the cycle p99 beside it ÷ without: [`ROUNDS`] windows of
/// the cycle without the read and as many beside it looping, alternating, each side's
/// cycles pooled, so that the machine's load drifting over [`OBSERVE_WINDOW`] weighs on
/// both sides alike.
pub(super) async fn read_costs(
    observer: &PostgresLockManager,
    sharded: &Arc<Sharded>,
    probe: &Op,
) -> Result<Vec<ReadCost>, BoxError> {
    let (window, cycles) = (
        OBSERVE_WINDOW / ROUNDS,
        PROBE_CYCLES.div_ceil(ROUNDS as usize),
    );
    let mut costs = Vec::new();
    for read in Read::ALL {
        let (mut with, mut without) = (Latencies::new(), Latencies::new());
        let (mut own, mut calls) = (Latencies::new(), 0);
        for _ in 0..ROUNDS {
            without.merge(&record(probe, cycles, window).await?);
            let stop = Arc::new(AtomicBool::new(false));
            let looping = {
                let (observer, stop) = (observer.clone(), Arc::clone(&stop));
                let sharded = Arc::clone(sharded);
                tokio::spawn(async move {
                    let (mut own, mut calls) = (Latencies::new(), 0);
                    while calls == 0 || !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        read.once(&observer, &sharded).await?;
                        own.record(started.elapsed());
                        calls += 1;
                    }
                    Ok::<_, BoxError>((own, calls))
                })
            };
            with.merge(&record(probe, cycles, window).await?);
            stop.store(true, Ordering::Relaxed);
            if read.endless() {
                looping.abort();
            } else {
                let (its, n) = looping.await??;
                own.merge(&its);
                calls += n;
            }
        }
        let (probe_p99, quiet_p99) = (with.p99(), without.p99());
        let cost = ReadCost {
            read,
            own: own.p50(),
            calls,
            probe_p99,
            quiet_p99,
        };
        // Said as measured: a later curve that stalls does not lose it.
        eprintln!(
            "lock-bench: scale: {}: own p50 {} ({calls} calls); cycle p99 {} (×{:.2} of {})",
            read.name(),
            fmt_ns(cost.own),
            fmt_ns(probe_p99),
            slowdown(&cost),
            fmt_ns(quiet_p99),
        );
        costs.push(cost);
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
                slowdown(r)
            )
        })
        .collect();
    reads.join("; ")
}

/// The cycle p99 beside the read ÷ without it.
fn slowdown(r: &ReadCost) -> f64 {
    as_f64(r.probe_p99) / as_f64(r.quiet_p99.max(1))
}

/// Each read's own time, and the cycle p99 while it loops ÷ without: the reads that
/// loop back to back (the observers at an interval are in the table and the JSON).
pub(super) fn panels(held: &[Held]) -> [Panel; 2] {
    let colors = [BLUE, ORANGE, GREEN];
    let curves = |label: &dyn Fn(Read) -> String, y: &dyn Fn(&ReadCost) -> f64| {
        // The reads that loop back to back: the first three.
        (Read::ALL.iter().enumerate())
            .zip(colors)
            .map(|((index, read), color)| {
                let points = on_held(held, |h| y(&h.reads[index]));
                curve(&label(*read), color, false, points)
            })
            .collect()
    };
    let axes = |y: &'static str, unit| ("held locks", y, unit);
    [
        panel(
            "one observation read's own time",
            axes("time", Unit::Nanos),
            curves(&|read| read.name().to_owned(), &|r| as_f64(r.own)),
        ),
        panel(
            "cycle p99 while a read loops ÷ without",
            axes("ratio", Unit::Plain),
            curves(&|read| format!("while {} loops", read.name()), &slowdown),
        ),
    ]
}
