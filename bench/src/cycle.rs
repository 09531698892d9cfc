//! Scenario `cycle` (1): uncontended `acquire` + `release`, pinned (see [`crate::pinned`]),
//! without and with a timeout, with the settings a user may change and with an
//! OpenTelemetry pipeline, against raw tokio-postgres's prepared
//! `pg_advisory_lock($1)` + `pg_advisory_unlock($1)`.

use crate::db::Database;
use crate::harness::Outcome;
use crate::pinned::{
    Role::{Baseline, Library, Reference, Setting},
    Scenario, run,
};
use crate::{BoxError, Plan};

/// The pinned-cycle target: the library's best run p50 at most this multiple of raw's.
const LIMIT: f64 = 1.10;

pub(crate) fn acquire(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let scenario = Scenario {
        id: "cycle_acquire",
        title: "1. Uncontended acquire + release cycle, pinned",
        prefix: "bench:cycle",
        limit: LIMIT,
        clients: vec![
            ("raw", Baseline),
            ("library", Library),
            ("library-timeout", Library),
            ("library-fencing", Setting),
            ("library-keepalive-off", Setting),
            ("library-lease-off", Setting),
            ("library-otel", Setting),
            ("library-timeout-otel", Setting),
            ("library-otel-spans", Setting),
            ("raw-simple", Reference),
            ("raw-text-timeout", Reference),
        ],
        notes: Vec::new(),
    };
    run(db, plan, scenario)
}
