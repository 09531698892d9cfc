//! Scenario `scale`: how each cost grows, one curve a file ([`held`], [`reads`],
//! [`waiters`], [`groups`]), beside raw tokio-postgres where there is an equivalent. It
//! needs a server sized for it (`cargo xtask bench --only scale` starts one).

mod groups;
mod held;
mod reads;
mod waiters;

use std::time::{Duration, Instant};

use serde_json::json;

use crate::chart::curves_svg;
use crate::clients::Op;
use crate::db::Database;
use crate::harness::{self, Outcome};
use crate::stats::{Latencies, as_f64, fmt_ns, nanos};
use crate::{BoxError, Plan};

/// Connections of the holding manager (and of the raw holder) up to 100,000 held locks.
const CONNECTIONS: usize = 50;
/// The most locks a connection of the holding manager holds (on average) past 100,000:
/// each statement costs the server more the more locks its session holds
/// (`LockReleaseAll` walks them at every transaction's end: about 1.4 ms of server CPU
/// an acquisition at 4,500 a connection), so larger counts take more connections.
const LOCKS_PER_CONNECTION: usize = 2_000;

/// Connections of the holding manager (and of the raw holder) for `max` held locks.
fn connections(max: usize) -> usize {
    max.div_ceil(LOCKS_PER_CONNECTION).max(CONNECTIONS)
}
/// Acquisitions in flight while growing to a count.
const IN_FLIGHT: usize = 32;
/// Probe cycles at each count (and while each read loops).
const PROBE_CYCLES: usize = 300;
const APP: &str = "lock-bench-scale";
const SETTINGS: [&str; 6] = [
    "max_locks_per_transaction",
    "max_connections",
    "max_prepared_transactions",
    "shared_buffers",
    "shared_memory_size",
    "server_version",
];

/// p50 and p99 of a histogram, in nanoseconds (kept instead of the histogram, whose
/// memory would count against the held locks').
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct P50P99(u64, u64);

/// A duration in the JSON: its nanoseconds.
fn ns<S: serde::Serializer>(duration: &Duration, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_u64(nanos(*duration))
}

/// At least `count` cycles of `probe` (another manager's or raw SQL's acquire + release
/// of one key), and for at least `window`: each one's time.
async fn record(probe: &Op, count: usize, window: Duration) -> Result<Latencies, BoxError> {
    let (end, count) = (Instant::now() + window, u64::try_from(count)?);
    let cycle = async || probe.cycle(0).await;
    Ok(harness::until(end, count, true, cycle).await?.1)
}

/// [`record`]'s p50 and p99.
async fn cycles(probe: &Op, count: usize, window: Duration) -> Result<P50P99, BoxError> {
    let latencies = record(probe, count, window).await?;
    Ok(P50P99(latencies.p50(), latencies.p99()))
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let admin = db.connect("lock-bench-admin").await?;
    let mut server = Vec::new();
    for name in SETTINGS {
        let value: String = admin.query_one(&format!("SHOW {name}"), &[]).await?.get(0);
        server.push((name, value));
    }
    let usage = locks_postgres::lock_table_usage(&admin).await?;
    let max_connections: usize = server[1].1.parse().unwrap_or(0);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let needed = as_f64(plan.scale_max as u64).mul_add(1.2, 10_000.0) as u64;
    let holding = connections(plan.scale_max);
    if usage.capacity < needed || max_connections < holding * 2 + 20 {
        return Err(format!(
            "the server's lock table holds {} entries and it allows {max_connections} \
             connections; the scale scenario holds {} locks and opens up to {} connections: \
             run it with `cargo xtask bench --only scale`, which starts a server sized for it",
            usage.capacity,
            plan.scale_max,
            waiters::WAITERS[3] + 20
        )
        .into());
    }
    let (held, stall) = held::measure(db, plan, &admin)
        .await
        .map_err(|error| format!("scale, held locks: {error}"))?;
    // Each waiter has its own connection: as many as the server allows, with room to spare.
    let room = max_connections.saturating_sub(40);
    let (waiter_counts, skipped): (Vec<usize>, Vec<usize>) = waiters::WAITERS
        .iter()
        .partition(|w| **w <= room && (!plan.quick || **w <= 256));
    let mut waiters = Vec::new();
    for count in waiter_counts {
        let point = waiters::point(db, plan, &admin, count).await;
        waiters.push(point.map_err(|error| format!("scale, {count} waiters: {error}"))?);
    }
    let mut groups = Vec::new();
    for size in groups::GROUPS {
        let point = groups::point(db, plan, size).await;
        groups.push(point.map_err(|error| format!("scale, a group of {size}: {error}"))?);
    }

    let settings_line = server
        .iter()
        .map(|(name, value)| format!("{name} = {value}"))
        .collect::<Vec<_>>()
        .join(", ");
    let per_connection = (plan.scale_max * 3 / 2).div_ceil(holding);
    let title = "17. Scale: held locks, observation reads, waiters, groups";
    let header = [
        "Point",
        "Time",
        "Cost",
        "Reads (and the cycle p99 while looping) / ratio",
    ];
    let mut out = Outcome::new("scale", title, &header);
    out.note(format!(
        "Server: {settings_line}. One manager holds the locks, multiplexed \
         (`multiplex({per_connection})`) on {holding} connections, {IN_FLIGHT} \
         acquisitions in flight; raw: `pg_advisory_lock` over {holding} \
         connections, {IN_FLIGHT} in flight. Cycle: another manager's (raw: another \
         connection's) acquire + release of one key, {PROBE_CYCLES} at each count. \
         Bytes and CPU a lock: the process's heap (counting allocator) and RSS growth \
         since the warmed, empty manager, and CPU a second at rest minus that with \
         nothing held. Reads (a leader holds the election `who_leads` reads, with a \
         board; observers at an interval: a leader watch, the gauge every {} s, a \
         semaphore of 2 acquired and released in a loop; a shard group's `owners()`, what \
         a member's tick reads, with a member of 4 shards running: from the roster, and \
         from `pg_locks` as before it): each one's own p50 while it loops, and the cycle p99 over {} s beside it ÷ over {} s without, in {} \
         alternating windows a side, pooled.",
        reads::GAUGE_INTERVAL.as_secs(),
        reads::OBSERVE_WINDOW.as_secs(),
        reads::OBSERVE_WINDOW.as_secs(),
        reads::ROUNDS
    ));
    out.note(format!(
        "Waiters: N tasks (each its own connection, library `Queue`, no timeout) acquire \
         / hold {} / release one key; handoff = release → next grant; fairness = most ÷ \
         fewest turns. Groups: `acquire_many` + release against one `pg_advisory_lock` \
         over `unnest` + one unlock statement, p50.",
        fmt_ns(nanos(waiters::HOLD))
    ));
    if let Some(stall) = &stall {
        out.note(format!(
            "**The held-lock curve stalled** {stall} (no acquisition returned within {} s; \
             the larger counts are not measured).",
            held::STALL.as_secs()
        ));
    }
    if !skipped.is_empty() {
        out.note(format!(
            "Not measured here: {skipped:?} waiters ({} mode, or more connections than the \
             server allows).",
            plan.mode()
        ));
    }
    held.iter().for_each(|h| out.row(held::row(h)));
    waiters.iter().for_each(|w| out.row(waiters::row(w)));
    groups.iter().for_each(|g| out.row(groups::row(g)));
    let panels: Vec<_> = (held::panels(&held).into_iter())
        .chain(reads::panels(&held))
        .chain([waiters::chart(&waiters), groups::chart(&groups)])
        .collect();
    let chart_notes = [format!("Server: {settings_line}.")];
    let title = "Scale: how each cost grows (log-log)";
    out.files
        .push(("scale.svg", curves_svg(title, &panels, 4, &chart_notes)?));
    Ok(out.with(json!({ "held": held, "waiters": waiters, "groups": groups })))
}
