//! The table, checks and JSON of a cycle scenario: each variant's runs against the fastest
//! baseline, run by run.

use serde_json::json;

use crate::interleave::Ratios;
use crate::report::{Check, Outcome, Section, verdict};
use crate::stats::fmt_ns;
use crate::{Plan, cpu};

use super::variant::{Pass, Role, Variant};

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
        .min_by_key(|v| v.passes[pinned].batches.median())
        .expect("every cycle scenario has a baseline");
    let mut rows = Vec::new();
    let mut checks = Vec::new();
    let mut json_variants = Vec::new();
    for variant in variants {
        let is_baseline = variant.name == baseline.name;
        let ratios = |pass: usize| {
            variant.passes[pass]
                .batches
                .ratios_to(&baseline.passes[pass].batches)
        };
        let (pinned_ratio, unpinned_ratio) = (ratios(pinned), ratios(unpinned));
        let (client_cpu, server_cpu) = variant.cpu_per_cycle(Pass::Pinned);
        let micros =
            |value: Option<f64>| value.map_or_else(|| "—".to_owned(), |v| format!("{v:.0} µs"));
        let (target, result) = match variant.role {
            Role::Library => {
                let pass = pinned_ratio.is_some_and(|r| r.median <= limit);
                let (mid, spread) = Ratios::fmt(pinned_ratio);
                checks.push(Check::new(
                    format!("{}: pinned p50 vs raw", variant.name),
                    format!(
                        "{mid} (runs {spread}; {} vs {})",
                        fmt_ns(variant.passes[pinned].batches.median()),
                        fmt_ns(baseline.passes[pinned].batches.median())
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
        let (pinned_mid, pinned_spread) = Ratios::fmt(pinned_ratio);
        let (unpinned_mid, unpinned_spread) = Ratios::fmt(unpinned_ratio);
        rows.push(vec![
            variant.name.to_owned(),
            fmt_ns(variant.passes[pinned].batches.median()),
            variant.passes[pinned].batches.spread(),
            pinned_mid,
            pinned_spread,
            fmt_ns(variant.passes[pinned].batches.pooled.p99()),
            fmt_ns(variant.passes[unpinned].batches.median()),
            unpinned_mid,
            unpinned_spread,
            micros(client_cpu),
            micros(server_cpu),
            target,
            result,
        ]);
        let pass_json = |pass: Pass| {
            let data = &variant.passes[pass.index()].batches;
            let (client, server) = variant.cpu_per_cycle(pass);
            let ratio = ratios(pass.index());
            json!({
                "run_p50s_ns": data.runs,
                "median_run_p50_ns": data.median(),
                "latency": data.pooled.to_json(),
                "ratio_median": ratio.map(|r| r.median),
                "ratio_min": ratio.map(|r| r.low),
                "ratio_max": ratio.map(|r| r.high),
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
