//! Scenario `cycle` (1): uncontended `acquire` + `release`, pinned (see [`crate::pinned`]),
//! without and with a timeout, with the settings a user may change and with an
//! OpenTelemetry pipeline, against raw tokio-postgres's prepared
//! `pg_advisory_lock($1)` + `pg_advisory_unlock($1)`.

use crate::db::Database;
use crate::harness::Outcome;
use crate::pinned::{Role, Scenario, run};
use crate::{BoxError, Plan};

/// The pinned-cycle target: the library's best run p50 at most this multiple of raw's.
const LIMIT: f64 = 1.10;

pub(crate) fn acquire(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let clients = vec![
        (
            "raw",
            "raw: prepared pg_advisory_lock($1) + unlock",
            Role::Baseline,
        ),
        (
            "library",
            "library: acquire (no timeout) + release",
            Role::Library,
        ),
        (
            "library-timeout",
            "library: acquire (timeout 5 s) + release",
            Role::Library,
        ),
        (
            "library-fencing",
            "library, fencing on: acquire (no timeout) + release",
            Role::Setting,
        ),
        (
            "library-keepalive-off",
            "library, keepalive off (and so no lease): acquire (no timeout) + release",
            Role::Setting,
        ),
        (
            "library-lease-off",
            "library, lease off (keepalive on; the server's TCP timers left alone): acquire \
             (no timeout) + release",
            Role::Setting,
        ),
        (
            "library-otel",
            "library + OpenTelemetry at INFO: acquire (no timeout) + release",
            Role::Setting,
        ),
        (
            "library-timeout-otel",
            "library + OpenTelemetry at INFO: acquire (timeout 5 s) + release",
            Role::Setting,
        ),
        (
            "library-otel-spans",
            "library + OpenTelemetry, lock spans at INFO: acquire (no timeout) + release",
            Role::Setting,
        ),
        (
            "raw-simple",
            "raw: simple-query pg_advisory_lock(n) + unlock",
            Role::Reference,
        ),
        (
            "raw-text-timeout",
            "raw: the library's SQL text, timeout 5 s",
            Role::Reference,
        ),
    ];
    let scenario = Scenario {
        id: "cycle_acquire",
        title: "1. Uncontended acquire + release cycle, pinned",
        prefix: "bench:cycle",
        limit: LIMIT,
        clients,
        notes: Vec::new(),
    };
    run(db, plan, scenario)
}
