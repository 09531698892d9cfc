//! The table, checks and JSON of a cycle scenario: each variant's runs against the fastest
//! baseline, run by run.

use serde_json::json;

use crate::report::{Check, Outcome, Section, verdict};
use crate::stats::{as_f64, fmt_ns, median};
use crate::{Plan, cpu};

use super::variant::{Pass, Role, Variant};

/// Median and (min, max) of some ratios.
fn summary(values: &[f64]) -> Option<(f64, f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((median(values), low, high))
}

/// `lib / base` run by run (the runs of one round are neighbours in time).
fn run_ratios(lib: &[u64], base: &[u64]) -> Vec<f64> {
    lib.iter()
        .zip(base)
        .filter(|(_, b)| **b > 0)
        .map(|(l, b)| as_f64(*l) / as_f64(*b))
        .collect()
}

/// The median of some nanosecond figures.
pub(crate) fn median_ns(runs: &[u64]) -> u64 {
    let values: Vec<f64> = runs.iter().map(|&v| as_f64(v)).collect();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let value = median(&values).round() as u64;
    value
}

fn fmt_spread_ns(runs: &[u64]) -> String {
    match (runs.iter().min(), runs.iter().max()) {
        (Some(&low), Some(&high)) => format!("{}–{}", fmt_ns(low), fmt_ns(high)),
        _ => "—".to_owned(),
    }
}

fn fmt_summary(summary: Option<(f64, f64, f64)>) -> (String, String) {
    summary.map_or_else(
        || ("—".to_owned(), "—".to_owned()),
        |(mid, low, high)| (format!("{mid:.2}×"), format!("{low:.2}–{high:.2}×")),
    )
}

pub(super) fn report(
    title: &str,
    id: &'static str,
    variants: &[Variant],
    plan: &Plan,
    placements: &[String],
    limit: f64,
) -> Outcome {
    let pinned = Pass::Pinned.index();
    let unpinned = Pass::Unpinned.index();
    let baseline = variants
        .iter()
        .filter(|v| v.role == Role::Baseline)
        .min_by_key(|v| median_ns(&v.passes[pinned].runs))
        .expect("every cycle scenario has a baseline");
    let mut rows = Vec::new();
    let mut checks = Vec::new();
    let mut json_variants = Vec::new();
    for variant in variants {
        let is_baseline = variant.name == baseline.name;
        let ratios = |pass: usize| {
            summary(&run_ratios(
                &variant.passes[pass].runs,
                &baseline.passes[pass].runs,
            ))
        };
        let (pinned_ratio, unpinned_ratio) = (ratios(pinned), ratios(unpinned));
        let (client_cpu, server_cpu) = variant.cpu_per_cycle(Pass::Pinned);
        let micros =
            |value: Option<f64>| value.map_or_else(|| "—".to_owned(), |v| format!("{v:.0} µs"));
        let (target, result) = match variant.role {
            Role::Library => {
                let pass = pinned_ratio.is_some_and(|(mid, _, _)| mid <= limit);
                let (mid, spread) = fmt_summary(pinned_ratio);
                checks.push(Check::new(
                    format!("{}: pinned p50 vs raw", variant.name),
                    format!(
                        "{mid} (runs {spread}; {} vs {})",
                        fmt_ns(median_ns(&variant.passes[pinned].runs)),
                        fmt_ns(median_ns(&baseline.passes[pinned].runs))
                    ),
                    format!("≤ {limit:.2}×"),
                    pass,
                ));
                (format!("≤ {limit:.2}×"), verdict(pass).to_owned())
            }
            Role::Baseline if is_baseline => ("baseline".to_owned(), String::new()),
            Role::Traced => ("on instructions (7)".to_owned(), String::new()),
            Role::Baseline | Role::Reference | Role::Setting => (String::new(), String::new()),
        };
        let (pinned_mid, pinned_spread) = fmt_summary(pinned_ratio);
        let (unpinned_mid, unpinned_spread) = fmt_summary(unpinned_ratio);
        rows.push(vec![
            variant.name.to_owned(),
            fmt_ns(median_ns(&variant.passes[pinned].runs)),
            fmt_spread_ns(&variant.passes[pinned].runs),
            pinned_mid,
            pinned_spread,
            fmt_ns(variant.passes[pinned].pooled.p99()),
            fmt_ns(median_ns(&variant.passes[unpinned].runs)),
            unpinned_mid,
            unpinned_spread,
            micros(client_cpu),
            micros(server_cpu),
            target,
            result,
        ]);
        let pass_json = |pass: Pass| {
            let data = &variant.passes[pass.index()];
            let (client, server) = variant.cpu_per_cycle(pass);
            let ratio = ratios(pass.index());
            json!({
                "run_p50s_ns": data.runs,
                "median_run_p50_ns": median_ns(&data.runs),
                "latency": data.pooled.to_json(),
                "ratio_median": ratio.map(|r| r.0),
                "ratio_min": ratio.map(|r| r.1),
                "ratio_max": ratio.map(|r| r.2),
                "client_cpu_us_per_cycle": client,
                "server_cpu_us_per_cycle": server,
            })
        };
        json_variants.push(json!({
            "name": variant.name,
            "role": format!("{:?}", variant.role).to_lowercase(),
            "is_baseline": is_baseline,
            "pinned": pass_json(Pass::Pinned),
            "unpinned": pass_json(Pass::Unpinned),
        }));
    }
    Outcome {
        id,
        section: Section {
            title: title.to_owned(),
            notes: vec![
                format!(
                    "{} runs × {} cycles per variant and pass, variants interleaved run by run \
                     (the order rotating); one cycle = lock + unlock, timed from the call to the \
                     return of the release, on one thread with a current-thread runtime. A \
                     run's figure is its p50; shown are the median of the runs and their spread \
                     (min–max), and the ratio to **{}** taken run by run (the median and the \
                     spread of those ratios). p99 is over all pinned cycles. CPU per cycle \
                     (pinned pass): this process, and the variant's server backend, from \
                     `/proc/<pid>/stat` ({} ms ticks).",
                    plan.cycle_rounds,
                    plan.cycle_batch,
                    baseline.name,
                    cpu::TICK_MS
                ),
                format!("Placement: {}.", placements.join("; ")),
            ],
            header: vec![
                "Variant",
                "pinned p50",
                "runs",
                "÷ raw",
                "÷ raw, runs",
                "pinned p99",
                "unpinned p50",
                "÷ raw",
                "÷ raw, runs",
                "client CPU",
                "server CPU",
                "Target (pinned)",
                "Result",
            ],
            rows,
        },
        checks,
        json: json!({
            "rounds": plan.cycle_rounds,
            "cycles_per_round": plan.cycle_batch,
            "baseline": baseline.name,
            "placements": placements,
            "variants": json_variants,
        }),
    }
}
