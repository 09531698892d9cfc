//! Scenario `latency`: the caller-visible cycle through a delaying TCP proxy ([`Proxy`]),
//! each variant ÷ the first of its round trip; then `acquire_many` contended, ÷ the old
//! way (one try per round trip).

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_conformance::Lcg;
use locks_port::KeyDerivation;
use locks_postgres::PostgresLockManager;

use crate::clients::{Names, client, keys, label};
use crate::db::{Database, Raw};
use crate::harness::{self, Cell, Outcome, row};
use crate::proxy::Proxy;
use crate::stats::{Latencies, fmt_ns, fmt_rate, median, nanos};
use crate::{Plan, Result};

/// Each round trip (ms), its variants (the others ÷ the first), and its target.
type Delay = (u64, Names, (&'static str, f64, &'static str));
const DELAYS: [Delay; 2] = [
    (
        1,
        &["raw", "library", "library-background"],
        ("library-background", 0.6, "under a 1 ms round trip vs raw"),
    ),
    (
        2,
        &["library", "library-many"],
        (
            "library-many",
            1.5,
            "vs one acquire + release, ~2 ms round trip",
        ),
    ),
];
const CONTENDED_KEYS: usize = 6;
const CONTENDED_TASKS: usize = 4;
const APP: &str = "lock-bench-latency";

/// `acquire_many` before its tries went into one statement: the keys in the one global
/// order, a try each, a wait on a busy one, then one unlock each.
async fn old_way(raw: &Raw, keys: &[&str]) -> Result<()> {
    let ids: Vec<i64> = KeyDerivation::CURRENT
        .lock_order(keys)
        .into_keys()
        .collect();
    for &id in &ids {
        if !raw.try_lock(id).await? {
            raw.lock(id).await?;
        }
    }
    for &id in &ids {
        raw.unlock(id).await?;
    }
    Ok(())
}

/// One window of tasks, each with a manager (or a connection, the `old` way) of its own,
/// taking random subsets of 2 to 4 of the keys.
async fn contended_window(
    through: &Database,
    old: bool,
    window: Duration,
    seed: u64,
) -> Result<harness::Window> {
    let keys = Arc::new(keys("bench:latency:contended", CONTENDED_KEYS));
    let mut ways = Vec::new();
    for _ in 0..CONTENDED_TASKS {
        ways.push(Arc::new(match old {
            true => Err(Raw::connect(through, APP, false).await?),
            false => Ok(PostgresLockManager::new(through.pool(1, APP))),
        }));
    }
    let end = Instant::now() + window;
    harness::window(CONTENDED_TASKS, |task| {
        let (keys, way) = (Arc::clone(&keys), Arc::clone(&ways[task]));
        let mut random = Lcg::new(seed * 16 + task as u64 + 1);
        harness::until(end, 0, true, async move || {
            let keys = random.subset(&keys, 2, 4);
            match &*way {
                Ok(manager) => {
                    let locks = manager.acquire_many(&keys, Duration::from_secs(30)).await?;
                    locks.release().await;
                }
                Err(raw) => old_way(raw, &keys).await?,
            }
            Ok(())
        })
    })
    .await
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome> {
    let upstream = db.tcp_address()?;
    let direct = db.round_trip(APP).await?;
    let bare = {
        let proxy = Proxy::start(upstream.clone(), Duration::ZERO)?;
        db.through(proxy.port()).round_trip(APP).await?
    };
    let title = "8. Acquire + release over a simulated network (delaying proxy)";
    let mut out = Outcome::new("latency", title);
    let (mut last, runs, windows) = (None, plan.pick(5, 10), plan.pick(3, 6));
    for (round_trip, names, (gated, limit, what)) in DELAYS {
        // What the proxy adds each way, less its own cost (a few hundred microseconds).
        let aimed = Duration::from_millis(round_trip);
        let one_way = aimed.saturating_sub(Duration::from_nanos(bare)) / 2;
        let proxy = Proxy::start(upstream.clone(), one_way)?;
        let through = db.through(proxy.port());
        let rtt = through.round_trip(APP).await?;
        let mut variants = Vec::new();
        for &name in names {
            variants.push(client(&through, name, &format!("bench:latency:{name}"), APP).await?);
        }
        let counts = (5, runs, plan.pick(40, 200));
        let measured = harness::batches(variants.len(), counts, async |side, n| {
            variants[side].cycle(n).await
        })
        .await?;
        let [aimed, added, shown] = [nanos(aimed), nanos(one_way), rtt].map(fmt_ns);
        let shown = format!("{shown} (aimed at {aimed}; {added} added each way)");
        let rtt = Cell::new(shown, rtt);
        let first = &measured[0];
        for (index, (batches, &name)) in measured.iter().zip(names).enumerate() {
            let ratios = batches.ratios_to(first);
            let (ratio, spread) = harness::Ratios::fmt(ratios);
            let median = ratios.map(|r| r.median);
            let p50 = Cell::ns(batches.median());
            let vs = format!("{} vs {}", p50.text, fmt_ns(first.median()));
            let measured = Cell::new(format!("{ratio} ({vs})"), median);
            let check = format!("{} {what}", label(name));
            let pass = median.is_some_and(|r| r <= limit);
            let [target, result] = match () {
                () if index == 0 => [Cell::from("baseline"), Cell::default()],
                () if name == gated => out.gate(check, measured, format!("≤ {limit:.1}×"), pass),
                () => Default::default(),
            };
            out.row(row![
                "Round trip" => rtt.clone(),
                "Variant" => label(name),
                "p50" => p50,
                "runs" => batches.spread(),
                "p99" => Cell::ns(batches.pooled.p99()),
                "÷ first" => Cell::new(ratio, median),
                "÷ first, runs" => Cell::new(spread, ratios.map(|r| vec![r.low, r.high])),
                "Target" => target,
                "Result" => result,
            ]);
        }
        drop(variants);
        last = Some((proxy, through));
    }
    let (_proxy, through) = last.ok_or("no delay")?;

    // Contended, at the last round trip: alternating windows of the two ways.
    let window = plan.ms(600, 3000);
    let sides = harness::alternate(windows, async |round, side| {
        let seed = (round * 2 + side) as u64;
        contended_window(&through, side == 1, window, seed).await
    })
    .await?;
    let rate = |windows: &Vec<harness::Window>| median(windows.iter().map(harness::Window::rate));
    let rates = sides.each_ref().map(rate);
    let names = [
        "tries in one statement",
        "the old way (one try per round trip)",
    ];
    for ((name, windows), rate) in names.iter().zip(&sides).zip(rates) {
        let pooled = Latencies::merged(windows.iter().map(|w| &w.latencies));
        let (count, rate) = (pooled.count(), fmt_rate(rate));
        let groups = format!("{name}: {count} groups, {rate} (median of windows)");
        let (p50, p99) = (Cell::ns(pooled.p50()), Cell::ns(pooled.p99()));
        out.row(row!["Round trip" => "~2 ms, contended", "Variant" => groups, "p50" => p50, "p99" => p99]);
    }
    let [new_rate, old_rate] = rates;
    let ratio = new_rate / old_rate.max(f64::MIN_POSITIVE);
    let (new, old) = (fmt_rate(new_rate), fmt_rate(old_rate));
    out.gate(
        format!(
            "contended acquire_many ({CONTENDED_TASKS} tasks, overlapping subsets of \
             {CONTENDED_KEYS} keys): groups per second vs the old way"
        ),
        Cell::new(format!("{ratio:.2}× ({new} vs {old})"), ratio),
        "≥ 0.95× (not slower)",
        new_rate >= old_rate * 0.95,
    );
    let [direct, bare] = [direct, bare].map(fmt_ns);
    out.note(format!(
        "Round trip = p50 of a prepared `SELECT 1` through the proxy ({direct} without it, \
         {bare} through it with no delay); {runs} interleaved runs a variant, the ratio run by \
         run. Contended: {windows} alternating windows of {window:?} a way."
    ));
    Ok(out)
}
