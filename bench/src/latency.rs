//! Scenario `latency` (8): the caller-visible cycle through a delaying TCP proxy
//! ([`Proxy`]), batches interleaved, each variant ÷ the first of its round trip: at ~1 ms
//! the library's acquire + release (default, and `release_in_background(true)`) ÷ raw's
//! two statements; at ~2 ms `acquire_many` of 8 keys ÷ one key's cycle, then contended,
//! 4 tasks on overlapping subsets of 6 keys, ÷ the old way (one try per round trip).

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_conformance::Lcg;
use locks_port::KeyDerivation;
use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Object;

use crate::clients::{client, keys, label};
use crate::db::{Database, NOT_HELD};
use crate::harness::{self, Cell, Outcome, cells};
use crate::proxy::Proxy;
use crate::stats::{Latencies, fmt_ns, fmt_rate, median, nanos};
use crate::{BoxError, Plan};

/// A round trip to simulate, its variants (the first is what the others are divided
/// by), and its target: a variant's ratio at most a limit.
struct Delay {
    round_trip: Duration,
    variants: &'static [&'static str],
    target: Option<(&'static str, f64, &'static str)>,
}

const DELAYS: [Delay; 2] = [
    // Only a release in the background can meet it; the default release waits for the
    // unlock's answer, as raw does.
    Delay {
        round_trip: Duration::from_millis(1),
        variants: &["raw", "library", "library-background"],
        target: Some(("library-background", 0.6, "under a 1 ms round trip vs raw")),
    },
    Delay {
        round_trip: Duration::from_millis(2),
        variants: &["library", "library-many"],
        target: Some((
            "library-many",
            1.5,
            "vs one acquire + release, ~2 ms round trip",
        )),
    },
];
/// Keys of the contended run, and tasks taking subsets of them.
const CONTENDED_KEYS: usize = 6;
const CONTENDED_TASKS: usize = 4;
const APP: &str = "lock-bench-latency";

/// `acquire_many` as it was before its tries went into one statement, on one connection:
/// the keys in the one global order, a `pg_try_advisory_lock` round trip each, a
/// `pg_advisory_lock` wait on a busy one (holding those before it, none after), then one
/// unlock each.
async fn old_way(client: &Object, keys: &[&str]) -> Result<(), BoxError> {
    let ids: Vec<i64> = KeyDerivation::CURRENT
        .lock_order(keys)
        .into_keys()
        .collect();
    let statement = async |name: &str| client.prepare_cached(&format!("SELECT {name}($1)")).await;
    let try_lock = statement("pg_try_advisory_lock").await?;
    let lock = statement("pg_advisory_lock").await?;
    let unlock = statement("pg_advisory_unlock").await?;
    for id in &ids {
        let granted: bool = client.query_one(&try_lock, &[id]).await?.get(0);
        if !granted {
            client.execute(&lock, &[id]).await?;
        }
    }
    for id in &ids {
        let released: bool = client.query_one(&unlock, &[id]).await?.get(0);
        if !released {
            return Err(NOT_HELD.into());
        }
    }
    Ok(())
}

/// One window of the contended run: `CONTENDED_TASKS` tasks, each with a manager (or a
/// connection) of its own, taking random subsets of 2 to 4 of the keys until `window`
/// ends.
async fn contended_window(
    through: &Database,
    old: bool,
    window: Duration,
    seed: u64,
) -> Result<harness::Window, BoxError> {
    let keys = Arc::new(keys("bench:latency:contended", CONTENDED_KEYS));
    let mut ways = Vec::new();
    for _ in 0..CONTENDED_TASKS {
        let pool = through.pool(1, APP);
        ways.push(Arc::new(if old {
            Err(pool.get().await?)
        } else {
            Ok(PostgresLockManager::new(pool))
        }));
    }
    let end = Instant::now() + window;
    harness::window(CONTENDED_TASKS, |task| {
        let (keys, way) = (Arc::clone(&keys), Arc::clone(&ways[task]));
        let mut random = Lcg::new(seed * 16 + u64::try_from(task).unwrap_or(0) + 1);
        harness::until(end, 0, true, async move || {
            let keys = random.subset(&keys, 2, 4);
            match &*way {
                Ok(manager) => {
                    let locks = manager.acquire_many(&keys, Duration::from_secs(30)).await?;
                    locks.release().await;
                }
                Err(client) => old_way(client, &keys).await?,
            }
            Ok(())
        })
    })
    .await
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let upstream = db.tcp_address()?;
    let direct = db.round_trip(APP).await?;
    let bare = {
        let proxy = Proxy::start(upstream.clone(), Duration::ZERO)?;
        db.through(proxy.port()).round_trip(APP).await?
    };
    let header = [
        "Round trip",
        "Variant",
        "p50",
        "runs",
        "p99",
        "÷ first",
        "÷ first, runs",
        "Target",
        "Result",
    ];
    let title = "8. Acquire + release over a simulated network (delaying proxy)";
    let mut out = Outcome::new("latency", title, &header);
    let mut last = None;
    for delay in DELAYS {
        // Half of what the proxy must add to its own cost each way: its thread hand-offs
        // cost a few hundred microseconds on a busy two-core VM.
        let one_way = delay.round_trip.saturating_sub(Duration::from_nanos(bare)) / 2;
        let proxy = Proxy::start(upstream.clone(), one_way)?;
        let through = db.through(proxy.port());
        let rtt = through.round_trip(APP).await?;
        let mut variants = Vec::new();
        for &name in delay.variants {
            let prefix = format!("bench:latency:{name}");
            variants.push((label(name), client(&through, name, &prefix, APP).await?));
        }
        let counts = (5, plan.pick(5, 10), plan.pick(40, 200));
        let measured = harness::batches(variants.len(), counts, async |side, n| {
            variants[side].1.cycle(n).await
        })
        .await?;
        let rtt_label = Cell::new(
            format!(
                "{} (aimed at {}; {} added each way)",
                fmt_ns(rtt),
                fmt_ns(nanos(delay.round_trip)),
                fmt_ns(nanos(one_way))
            ),
            rtt,
        );
        let first = &measured[0];
        for (index, (batches, (name, _))) in measured.iter().zip(&variants).enumerate() {
            let (cells, ratios) = batches.against(first);
            let [target, result] = match delay.target {
                _ if index == 0 => [Cell::from("baseline"), Cell::default()],
                Some((gated, limit, what)) if delay.variants[index] == gated => out.gate(
                    format!("{name} {what}"),
                    Cell::new(
                        format!(
                            "{} ({} vs {})",
                            cells[3].text,
                            cells[0].text,
                            fmt_ns(first.median())
                        ),
                        ratios.map(|r| r.median),
                    ),
                    format!("≤ {limit:.1}×"),
                    ratios.is_some_and(|r| r.median <= limit),
                ),
                _ => Default::default(),
            };
            let head = cells![rtt_label.clone(), *name];
            out.row([head, cells, vec![target, result]].concat());
        }
        drop(variants);
        last = Some((proxy, through));
    }
    let (_proxy, through) = last.ok_or("no delay")?;

    // Contended, at the last round trip: alternating windows of the two ways.
    let window = plan.ms(600, 3000);
    let mut sides: [Vec<harness::Window>; 2] = Default::default();
    harness::rounds(plan.pick(3, 6), 2, async |round, side| {
        let seed = u64::try_from(round * 2 + side).unwrap_or(0);
        sides[side].push(contended_window(&through, side == 1, window, seed).await?);
        Ok(())
    })
    .await?;
    let rates = sides.each_ref().map(|windows| {
        let rates: Vec<f64> = windows.iter().map(harness::Window::rate).collect();
        median(&rates)
    });
    let names = [
        "tries in one statement",
        "the old way (one try per round trip)",
    ];
    for ((name, windows), rate) in names.iter().zip(&sides).zip(rates) {
        let mut pooled = Latencies::new();
        windows.iter().for_each(|w| pooled.merge(&w.latencies));
        let groups = format!(
            "{name}: {} groups, {} (median of windows)",
            pooled.count(),
            fmt_rate(rate)
        );
        let (p50, p99) = (Cell::ns(pooled.p50()), Cell::ns(pooled.p99()));
        let mut row = cells!["~2 ms, contended", groups, p50, "", p99];
        row.resize(header.len(), Cell::default());
        out.row(row);
    }
    let [new_rate, old_rate] = rates;
    out.gate(
        format!(
            "contended acquire_many ({CONTENDED_TASKS} tasks, overlapping subsets of \
             {CONTENDED_KEYS} keys): groups per second vs the old way"
        ),
        {
            let ratio = new_rate / old_rate.max(f64::MIN_POSITIVE);
            let (new, old) = (fmt_rate(new_rate), fmt_rate(old_rate));
            Cell::new(format!("{ratio:.2}× ({new} vs {old})"), ratio)
        },
        "≥ 0.95× (not slower)",
        new_rate >= old_rate * 0.95,
    );
    out.note(format!(
        "Round trip = p50 of a prepared `SELECT 1` through the proxy ({} without it, {} \
         through it with no delay); {} interleaved runs a variant, the ratio run by run. \
         Contended: {} alternating windows of {window:?} a way.",
        fmt_ns(direct),
        fmt_ns(bare),
        plan.pick(5, 10),
        plan.pick(3, 6)
    ));
    Ok(out)
}
