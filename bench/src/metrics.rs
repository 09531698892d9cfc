//! Scenario `metrics` (7b): what the OpenTelemetry metrics cost the lock cycle, in client
//! instructions counted by callgrind as in scenario 7 (see [`crate::callgrind`]).
//!
//! The baseline is the same build with the instruments turned off (`builder.metrics(false)`:
//! no instrument made, no clock read for them), measured in the same run. Against it: the
//! default manager with no meter provider installed (the instruments are OpenTelemetry's
//! no-ops; target ≤ 1.02×), and with the metrics SDK installed as the global provider (a
//! periodic reader and an exporter that counts and drops; shown, no target).

use std::path::Path;

use crate::callgrind::{Row, scenario};
use crate::harness::Outcome;
use crate::{BoxError, Plan};

/// The gate: instructions per cycle with no meter provider, at most this multiple of
/// the same build with metrics off.
const NOOP_LIMIT: f64 = 1.02;

const OFF: &str = "library-metrics-off";

const ROWS: [Row; 3] = [
    Row {
        name: OFF,
        label: "library, metrics off (`metrics(false)`): acquire (no timeout) + release",
        baseline: OFF,
        target: None,
    },
    Row {
        name: "library",
        label: "library, metrics on, no meter provider installed (no-op instruments)",
        baseline: OFF,
        target: Some((NOOP_LIMIT, "metrics with no meter provider")),
    },
    Row {
        name: "library-metrics-sdk",
        label: "library, metrics SDK installed (periodic reader, exporter that drops)",
        baseline: OFF,
        target: None,
    },
];

pub(crate) fn run(url: &str, plan: &Plan, out_dir: &Path) -> Result<Outcome, BoxError> {
    let title = "7b. What the metrics cost the cycle: client instructions (callgrind)";
    let notes = vec![
        "÷ off: against the same build with `metrics(false)`, measured in this run. The SDK \
         row counts the periodic reader's thread too."
            .to_owned(),
    ];
    let id = ("metrics", title, "metrics off", 3);
    scenario(url, plan, out_dir, id, &ROWS, notes)
}
