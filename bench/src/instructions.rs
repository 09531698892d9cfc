//! Scenario `instructions` (7): client instructions per acquire + release cycle, counted by
//! callgrind (see [`crate::callgrind`]), the library's clients against raw tokio-postgres
//! doing the same statements; the shared lock and `acquire_many` against their own raw.

use std::path::Path;

use crate::callgrind::{Row, TIMERS, scenario};
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
    ("library+timers", "raw", None),
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

/// The rows, labelled as the pinned cycle's tables label them (`library+timers`: ADR
/// 0015's verdict is that row against `library`); a gated row's check is named by its label.
fn rows() -> Vec<Row> {
    let row = |(name, baseline, limit): (&'static str, &'static str, Option<f64>)| Row {
        name,
        label: match name.strip_suffix(TIMERS) {
            Some("library") => {
                "library, statement watchdog off (tokio timers, ADR 0015): acquire (no \
                 timeout) + release"
            }
            _ => label(name),
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
    scenario(url, plan, out_dir, id, &rows(), notes)
}
