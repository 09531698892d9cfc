//! Scenario 7b (`--only metrics`): what the OpenTelemetry metrics cost the lock cycle, in
//! client instructions counted by callgrind as in scenario 7 (see
//! [`crate::instructions`]: N and 2N cycles, the difference per cycle).
//!
//! The baseline is the same build with the instruments turned off
//! (`builder.metrics(false)`: no instrument made, no clock read for them), measured in the
//! same run. Against it: the default manager with no meter provider installed (the
//! instruments are OpenTelemetry's no-ops; target ≤ 1.02×), and with the metrics SDK
//! installed as the global provider (a periodic reader and an exporter that counts and
//! drops; shown, no target).

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use crate::instructions::{WARMUP, count, valgrind_version};
use crate::report::{Check, Outcome, Section, verdict};
use crate::stats::{as_f64, ratio};
use crate::{BoxError, Plan};

/// The gate: instructions per cycle with no meter provider, at most this multiple of
/// the same build with metrics off.
const NOOP_LIMIT: f64 = 1.02;

/// The baseline variant: `metrics(false)`.
pub(crate) const OFF: &str = "library-metrics-off";
/// The variant with the SDK installed.
pub(crate) const SDK: &str = "library-metrics-sdk";

/// The variants of this scenario, baseline first (`library` is scenario 7's default
/// manager: metrics on, no provider installed).
pub(crate) const VARIANTS: [(&str, &str); 3] = [
    (
        OFF,
        "library, metrics off (`metrics(false)`): acquire (no timeout) + release",
    ),
    (
        "library",
        "library, metrics on, no meter provider installed (no-op instruments)",
    ),
    (
        SDK,
        "library, metrics SDK installed (periodic reader, exporter that drops)",
    ),
];

/// `1.013×`: three decimals, for a 2 % target.
fn fmt_ratio3(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.3}×"))
}

/// Scenario 7b.
pub(crate) fn run(url: &str, plan: &Plan, out_dir: &Path) -> Result<Outcome, BoxError> {
    let version = valgrind_version()?;
    let dir = out_dir.join("callgrind");
    std::fs::create_dir_all(&dir)?;
    let cycles = plan.callgrind_cycles;
    let started = Instant::now();
    let mut measured = Vec::new();
    for (variant, name) in VARIANTS {
        let once = count(url, variant, cycles, &dir)?;
        let twice = count(url, variant, 2 * cycles, &dir)?;
        let per_cycle = as_f64(twice.saturating_sub(once)) / as_f64(cycles as u64);
        measured.push((variant, name, once, twice, per_cycle));
    }
    let baseline = measured[0].4;
    let mut rows = Vec::new();
    let mut checks = Vec::new();
    let mut json_variants = Vec::new();
    for &(variant, name, once, twice, per_cycle) in &measured {
        let ratio = ratio(per_cycle, baseline);
        let (target, result) = match variant {
            OFF => ("baseline".to_owned(), String::new()),
            "library" => {
                let pass = ratio.is_some_and(|r| r <= NOOP_LIMIT);
                checks.push(Check::new(
                    "metrics with no meter provider: instructions per cycle vs metrics off",
                    format!("{} ({per_cycle:.0} vs {baseline:.0})", fmt_ratio3(ratio)),
                    format!("≤ {NOOP_LIMIT:.2}×"),
                    pass,
                ));
                (format!("≤ {NOOP_LIMIT:.2}×"), verdict(pass).to_owned())
            }
            _ => (String::new(), String::new()),
        };
        rows.push(vec![
            name.to_owned(),
            once.to_string(),
            twice.to_string(),
            format!("{per_cycle:.0}"),
            fmt_ratio3(ratio),
            target,
            result,
        ]);
        json_variants.push(json!({
            "variant": variant,
            "name": name,
            "instructions_n": once,
            "instructions_2n": twice,
            "instructions_per_cycle": per_cycle,
            "ratio": ratio,
            "baseline": OFF,
        }));
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(Outcome {
        id: "metrics",
        section: Section {
            title: "7b. What the metrics cost the cycle: client instructions (callgrind)"
                .to_owned(),
            notes: vec![format!(
                "{version}, as scenario 7: {WARMUP} warm-up cycles, then N = {cycles} and 2N \
                 cycles of acquire (no timeout) + release on a current-thread runtime; per \
                 cycle = (total(2N) − total(N)) / N. ÷ off: against the same build with \
                 `metrics(false)`, measured in this run. The SDK row counts the periodic \
                 reader's thread too. {elapsed:.0} s."
            )],
            header: vec![
                "Variant",
                "total, N cycles",
                "total, 2N cycles",
                "per cycle",
                "÷ off",
                "Target",
                "Result",
            ],
            rows,
        },
        checks,
        json: json!({
            "valgrind": version,
            "cycles": cycles,
            "warmup": WARMUP,
            "variants": json_variants,
        }),
    })
}
