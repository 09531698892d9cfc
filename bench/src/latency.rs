//! Scenario 8: the caller-visible acquire + release time over a simulated network, the
//! library against the raw two-statement cycle, through the same delaying proxy.

use std::time::Duration;

use locks_port::AcquireOptions;
use locks_postgres::PostgresLockManager;
use serde_json::json;

use crate::clients::{KEYS, Op, client, keys};
use crate::db::Database;
use crate::harness;
use crate::harness::Outcome;
use crate::proxy::Proxy;
use crate::stats::{fmt_ns, nanos};
use crate::{BoxError, Plan};

/// The round trips to simulate. Each one-way delay is set to half of what the proxy must
/// add to its own cost (measured with no delay): the proxy's thread hand-offs cost a
/// few hundred microseconds on a busy two-core VM.
const ROUND_TRIPS: [Duration; 2] = [Duration::from_micros(500), Duration::from_millis(1)];
/// The target at a 1 ms round trip: the library's cycle at most this multiple of
/// raw's two statements. Only a release in the background can meet it (ADR 0010: the
/// unlock off the caller's path); the default release waits for the unlock's answer, as
/// raw does, so those variants are shown beside it without the target.
const LIMIT: f64 = 0.6;

/// Scenario 8.
pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let upstream = db.tcp_address()?;
    let direct = db.round_trip("lock-bench-latency").await?;
    let bare = {
        let proxy = Proxy::start(upstream.clone(), Duration::ZERO)?;
        db.through(proxy.port())
            .round_trip("lock-bench-latency")
            .await?
    };
    let header = [
        "Round trip",
        "Variant",
        "p50",
        "runs",
        "p99",
        "÷ raw",
        "÷ raw, runs",
        "Target",
        "Result",
    ];
    let title = "8. Acquire + release over a simulated network (delaying proxy)";
    let mut out = Outcome::new("latency", title, &header);
    let mut json_delays = Vec::new();
    for (index, target_rtt) in ROUND_TRIPS.into_iter().enumerate() {
        let one_way = target_rtt.saturating_sub(Duration::from_nanos(bare)) / 2;
        let is_last = index + 1 == ROUND_TRIPS.len();
        let proxy = Proxy::start(upstream.clone(), one_way)?;
        let through = db.through(proxy.port());
        let rtt = through.round_trip("lock-bench-latency").await?;
        let app = "lock-bench-latency";
        let variant = async |name, label, n: usize| {
            let op = client(&through, name, &format!("bench:latency:{n}"), app).await?;
            Ok::<_, BoxError>((label, op))
        };
        let raw = "raw: prepared pg_advisory_lock($1), then pg_advisory_unlock($1)";
        // ADR 0010: release returns once the unlock is sent; a pool of 2, so the next
        // acquire need not wait for the first connection's answer. The last variant, and
        // the only one the target applies to.
        let background = Op::Acquire {
            manager: PostgresLockManager::builder(through.pool(2, app))
                .release_in_background(true)
                .build(),
            keys: keys("bench:latency:3", KEYS),
            options: AcquireOptions::new(),
        };
        let variants = [
            variant("raw", raw, 0).await?,
            variant("library", "library: acquire (no timeout) + release", 1).await?,
            variant(
                "library-timeout",
                "library: acquire (timeout 5 s) + release",
                2,
            )
            .await?,
            (
                "library, release in background: acquire (no timeout) + release",
                background,
            ),
        ];
        let counts = (5, plan.latency_rounds, plan.latency_batch);
        let measured = harness::batches(variants.len(), counts, async |side, n| {
            variants[side].1.cycle(n).await
        })
        .await?;
        let rtt_label = format!(
            "{} (aimed at {}; {} added each way)",
            fmt_ns(rtt),
            fmt_ns(nanos(target_rtt)),
            fmt_ns(nanos(one_way))
        );
        let mut json_variants = Vec::new();
        let raw = &measured[0];
        for (index, (batches, (name, _))) in measured.iter().zip(&variants).enumerate() {
            let (cells, ratios, mut json) = batches.against(raw);
            json["name"] = json!(name);
            let [target, result] = if index == 0 {
                ["baseline".to_owned(), String::new()]
            } else if is_last && index + 1 == variants.len() {
                let pass = ratios.is_some_and(|r| r.median <= LIMIT);
                out.gate(
                    format!("{name} under a 1 ms round trip vs raw"),
                    format!("{} ({} vs {})", cells[3], cells[0], fmt_ns(raw.median())),
                    format!("≤ {LIMIT:.1}×"),
                    pass,
                )
            } else {
                Default::default()
            };
            out.row(
                [
                    vec![rtt_label.clone(), (*name).to_owned()],
                    cells,
                    vec![target, result],
                ]
                .concat(),
            );
            json_variants.push(json);
        }
        json_delays.push(json!({
            "target_round_trip_ns": nanos(target_rtt),
            "one_way_ns": nanos(one_way),
            "round_trip_p50_ns": rtt,
            "variants": json_variants,
        }));
        drop(variants);
        drop(proxy);
    }
    out.note(format!(
        "Every connection goes through a TCP proxy in this process that delays each \
         direction by the given amount (order kept). Round trip = p50 of a prepared \
         `SELECT 1` through the proxy ({} without it, {} through it with no delay). {} runs × {} cycles per \
         variant and delay, interleaved; a run's figure is its p50; shown are the \
         median of the runs, their spread, p99 over all cycles, and the ratio to raw \
         taken run by run. The raw cycle is two statements, two round trips.",
        fmt_ns(direct),
        fmt_ns(bare),
        plan.latency_rounds,
        plan.latency_batch
    ));
    Ok(out.with(json!({
        "rounds": plan.latency_rounds,
        "cycles_per_round": plan.latency_batch,
        "direct_round_trip_p50_ns": direct,
        "proxy_no_delay_round_trip_p50_ns": bare,
        "delays": json_delays,
    })))
}
