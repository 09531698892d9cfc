//! Scenario `instructions` (7): client instructions per acquire + release cycle, counted by
//! callgrind (see [`crate::callgrind`]), the library's clients against raw tokio-postgres
//! doing the same statements; the shared lock and `acquire_many` against their own raw.

use std::path::Path;

use crate::callgrind::{Row, scenario};
use crate::clients::label;
use crate::harness::Outcome;
use crate::{BoxError, Plan};

/// The gate: library instructions per cycle at most this multiple of raw.
const LIBRARY_LIMIT: f64 = 1.2;
/// With a tracing + OpenTelemetry pipeline installed.
const TRACED_LIMIT: f64 = 1.5;

/// Each counted client, the client it is divided by, and its limit if it is gated.
const ROWS: [(&str, &str, Option<f64>); 16] = [
    ("raw", "raw", None),
    ("library", "raw", Some(LIBRARY_LIMIT)),
    ("library-timeout", "raw", Some(LIBRARY_LIMIT)),
    (LIBRARY_ON_TIMERS, "raw", None),
    ("library-fencing", "raw", None),
    ("library-keepalive-off", "raw", None),
    ("library-lease-off", "raw", None),
    ("library-otel", "raw", Some(TRACED_LIMIT)),
    ("library-timeout-otel", "raw", Some(TRACED_LIMIT)),
    ("library-otel-spans", "raw", None),
    ("library-timeout-otel-spans", "raw", None),
    ("raw-shared", "raw-shared", None),
    ("library-shared", "raw-shared", None),
    ("raw-many-each", "raw-many-each", None),
    ("library-many", "raw-many-each", None),
    ("raw-many", "raw-many-each", None),
];

/// `library` with the statement watchdog off (ADR 0015's verdict is this row against
/// `library`).
const LIBRARY_ON_TIMERS: &str = "library+timers";

/// The rows, labelled as the pinned cycle's tables label them; a gated row's check is
/// named by its label.
fn rows() -> Vec<Row> {
    let row = |(name, baseline, limit): (&'static str, &'static str, Option<f64>)| Row {
        name,
        label: if name == LIBRARY_ON_TIMERS {
            "library, statement watchdog off (tokio timers, ADR 0015): acquire (no timeout) + release"
        } else {
            label(name)
        },
        baseline,
        target: limit.map(|limit| (limit, label(name))),
    };
    ROWS.into_iter().map(row).collect()
}

pub(crate) fn run(url: &str, plan: &Plan, out_dir: &Path) -> Result<Outcome, BoxError> {
    let title = "7. Client instructions per acquire + release cycle (callgrind)";
    let notes = vec![
        "÷ raw: against `raw`, except the shared-lock and `acquire_many` rows, each against \
         its own raw baseline (`raw-shared`, `raw-many-each`: the same statements as \
         scenarios 9 and 10's baselines); their targets are on wall-clock time there."
            .to_owned(),
    ];
    let id = ("instructions", title, "raw", 2);
    scenario(url, plan.callgrind_cycles, out_dir, id, &rows(), notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callgrind::TIMERS;

    #[test]
    fn every_row_is_divided_by_a_raw_row_of_the_run() {
        let rows = rows();
        for row in &rows {
            assert!(
                row.baseline.starts_with("raw"),
                "{} ÷ {}",
                row.name,
                row.baseline
            );
            assert!(
                rows.iter().any(|r| r.name == row.baseline),
                "{}",
                row.baseline
            );
            assert_ne!(row.label, row.name, "{} has a label", row.name);
        }
        assert_eq!(LIBRARY_ON_TIMERS.strip_suffix(TIMERS), Some("library"));
    }
}
