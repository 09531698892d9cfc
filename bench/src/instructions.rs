//! Scenario `instructions` (7): client instructions per acquire + release cycle, counted by
//! callgrind (see [`crate::callgrind`]), the library's clients against raw tokio-postgres
//! doing the same statements; the shared lock and `acquire_many` against their own raw.

use std::path::Path;

use crate::callgrind::{Row, scenario};
use crate::harness::Outcome;
use crate::{BoxError, Plan};

/// The gate: library instructions per cycle at most this multiple of raw.
const LIBRARY_LIMIT: f64 = 1.2;
/// With a tracing + OpenTelemetry pipeline installed.
const TRACED_LIMIT: f64 = 1.5;

const fn row(name: &'static str, label: &'static str, baseline: &'static str) -> Row {
    Row {
        name,
        label,
        baseline,
        target: None,
    }
}

const fn gated(name: &'static str, label: &'static str, limit: f64) -> Row {
    Row {
        name,
        label,
        baseline: "raw",
        target: Some((limit, label)),
    }
}

const ROWS: [Row; 15] = [
    row("raw", "raw: prepared pg_advisory_lock($1) + unlock", "raw"),
    gated(
        "library",
        "library: acquire (no timeout) + release",
        LIBRARY_LIMIT,
    ),
    gated(
        "library-timeout",
        "library: acquire (timeout 5 s) + release",
        LIBRARY_LIMIT,
    ),
    row(
        "library-fencing",
        "library, fencing on: acquire (no timeout) + release",
        "raw",
    ),
    row(
        "library-keepalive-off",
        "library, keepalive off: acquire (no timeout) + release",
        "raw",
    ),
    row(
        "library-lease-off",
        "library, lease off (the server's TCP timers left alone; the default sets them in the \
         connection's set-up): acquire (no timeout) + release",
        "raw",
    ),
    gated(
        "library-otel",
        "library + OpenTelemetry at INFO: acquire (no timeout) + release",
        TRACED_LIMIT,
    ),
    gated(
        "library-timeout-otel",
        "library + OpenTelemetry at INFO: acquire (timeout 5 s) + release",
        TRACED_LIMIT,
    ),
    row(
        "library-otel-spans",
        "library + OpenTelemetry, lock spans at INFO: acquire (no timeout) + release",
        "raw",
    ),
    row(
        "library-timeout-otel-spans",
        "library + OpenTelemetry, lock spans at INFO: acquire (timeout 5 s) + release",
        "raw",
    ),
    row(
        "raw-shared",
        "raw: prepared pg_advisory_lock_shared($1) + unlock_shared",
        "raw-shared",
    ),
    row(
        "library-shared",
        "library: acquire shared (no timeout) + release",
        "raw-shared",
    ),
    row(
        "raw-many-each",
        "raw: the library's 2 group statements, prepared (8 tries in one, 8 unlocks in one)",
        "raw-many-each",
    ),
    row(
        "library-many",
        "library: acquire_many of 8 keys (no timeout) + release",
        "raw-many-each",
    ),
    row(
        "raw-many",
        "raw: 8 prepared pg_advisory_lock($1) in lock-id order + 8 unlocks",
        "raw-many-each",
    ),
];

pub(crate) fn run(url: &str, plan: &Plan, out_dir: &Path) -> Result<Outcome, BoxError> {
    let title = "7. Client instructions per acquire + release cycle (callgrind)";
    let notes = vec![
        "÷ raw: against `raw`, except the shared-lock and `acquire_many` rows, each against \
         its own raw baseline (`raw-shared`, `raw-many-each`: the same statements as \
         scenarios 9 and 10's baselines); their targets are on wall-clock time there."
            .to_owned(),
    ];
    let id = ("instructions", title, "raw", 2);
    scenario(url, plan.callgrind_cycles, out_dir, id, &ROWS, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_divided_by_a_raw_row_of_the_run() {
        for row in ROWS {
            assert!(
                row.baseline.starts_with("raw"),
                "{} ÷ {}",
                row.name,
                row.baseline
            );
            assert!(
                ROWS.iter().any(|r| r.name == row.baseline),
                "{}",
                row.baseline
            );
        }
    }
}
