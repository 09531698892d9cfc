//! Scenarios 1 and 2: one uncontended acquire+release after another, the library against
//! raw `tokio-postgres` on one dedicated connection.
//!
//! Each scenario runs on a thread of its own with a current-thread Tokio runtime (the
//! connections' drivers run there too), twice: first left to the scheduler (**unpinned**),
//! then with that thread and every variant's server backend on one CPU (**pinned**). In each
//! pass the variants take turns, one batch each per round, the order rotating; a round's
//! p50 is one run, and the tables show the median of the runs with their spread.

mod report;
mod schedule;
mod variant;

use std::sync::Arc;
use std::time::Duration;

use locks_port::{AcquireOptions, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::{Value, json};

use crate::db::{Database, RawStatements};
use crate::ops::Op;
use crate::otel::Pipeline;
use crate::report::Outcome;
use crate::{BoxError, Plan};

pub(crate) use self::schedule::{on_cycle_thread, run};
pub(crate) use self::variant::{Role, Variant};

/// The most a pinned library `acquire` cycle may cost, as a multiple of the raw cycle's
/// (median of the per-run ratios): the pinned-cycle target.
const CYCLE_LIMIT: f64 = 1.10;
/// The same for `try_acquire` (no pinned-cycle target of its own: the earlier one).
const TRY_LIMIT: f64 = 1.15;

/// The timeout of the bounded variants.
pub(crate) const BOUNDED: Duration = Duration::from_secs(5);

/// A manager handing out fencing tokens (the token table must exist).
pub(crate) fn fencing_manager(db: &Database) -> PostgresLockManager {
    PostgresLockManager::builder(db.pool(1, "lock-bench-cycle"))
        .fencing(true)
        .build()
}

/// A manager whose lock spans are at INFO, so that an INFO subscriber records them (the
/// default level is DEBUG).
pub(crate) fn traced_manager(db: &Database, application_name: &str) -> PostgresLockManager {
    PostgresLockManager::builder(db.pool(1, application_name))
        .span_level(tracing::Level::INFO)
        .build()
}

/// A manager without keepalives (the default sends one every 10 s per held lock).
pub(crate) fn quiet_manager(db: &Database) -> PostgresLockManager {
    PostgresLockManager::builder(db.pool(1, "lock-bench-cycle"))
        .keepalive(None)
        .build()
}

/// Scenario 1: `acquire` (without and with a timeout, and with an OpenTelemetry pipeline)
/// + `release`.
pub(crate) async fn acquire(db: Database, plan: Plan) -> Result<Outcome, BoxError> {
    let key = |n: usize| format!("bench:cycle:{n}");
    let manager = || PostgresLockManager::new(db.pool(1, "lock-bench-cycle"));
    let raw = || db.connect("lock-bench-cycle");
    let text_id = lock_id(&key(5));
    let bounded_ms = BOUNDED.as_millis();
    let pipeline = Arc::new(Pipeline::new());
    locks_postgres::install_fencing(&db.connect("lock-bench-cycle").await?).await?;
    let variants = vec![
        Variant::new(
            "library: acquire (no timeout) + release",
            Role::Library,
            Op::library(manager(), key(0), AcquireOptions::new()),
        ),
        Variant::new(
            "library: acquire (timeout 5 s) + release",
            Role::Library,
            Op::library(
                manager(),
                key(1),
                AcquireOptions::new().with_timeout(BOUNDED),
            ),
        ),
        Variant::new(
            "library, fencing on: acquire (no timeout) + release",
            Role::Setting,
            Op::library(fencing_manager(&db), key(9), AcquireOptions::new()),
        ),
        Variant::new(
            "library, keepalive off (and so no lease): acquire (no timeout) + release",
            Role::Setting,
            Op::library(quiet_manager(&db), key(10), AcquireOptions::new()),
        ),
        Variant::new(
            "library, lease off (keepalive on; the server's TCP timers left alone): acquire \
             (no timeout) + release",
            Role::Setting,
            Op::library(
                PostgresLockManager::builder(db.pool(1, "lock-bench-cycle"))
                    .lease(None)
                    .build(),
                key(12),
                AcquireOptions::new(),
            ),
        ),
        Variant::new(
            "library + OpenTelemetry at INFO: acquire (no timeout) + release",
            Role::Traced,
            Op::library(manager(), key(7), AcquireOptions::new()),
        )
        .traced(&pipeline),
        Variant::new(
            "library + OpenTelemetry at INFO: acquire (timeout 5 s) + release",
            Role::Traced,
            Op::library(
                manager(),
                key(8),
                AcquireOptions::new().with_timeout(BOUNDED),
            ),
        )
        .traced(&pipeline),
        Variant::new(
            "library + OpenTelemetry, lock spans at INFO: acquire (no timeout) + release",
            Role::Setting,
            Op::library(
                traced_manager(&db, "lock-bench-cycle"),
                key(11),
                AcquireOptions::new(),
            ),
        )
        .traced(&pipeline),
        Variant::new(
            "raw: prepared pg_advisory_lock($1) + unlock",
            Role::Baseline,
            Op::raw_prepared(raw().await?, lock_id(&key(2))).await?,
        ),
        Variant::new(
            "raw: simple-query pg_advisory_lock(n) + unlock",
            Role::Baseline,
            Op::RawSimple {
                client: raw().await?,
                id: lock_id(&key(3)),
                try_lock: false,
            },
        ),
        Variant::new(
            "raw: the library's SQL text, timeout 5 s",
            Role::Reference,
            Op::RawText {
                client: raw().await?,
                lock: format!(
                    "SELECT pg_advisory_lock({text_id}) \
                     FROM (SELECT set_config('lock_timeout', '{bounded_ms}', true)) AS options"
                ),
                unlock: format!("SELECT pg_advisory_unlock({text_id})"),
            },
        ),
    ];
    let mut outcome = run(
        "1. Uncontended acquire + release cycle, pinned and unpinned",
        "cycle_acquire",
        variants,
        &plan,
        CYCLE_LIMIT,
    )
    .await?;
    let exported = pipeline.flush();
    outcome.section.notes.push(format!(
        "OpenTelemetry: tracing-opentelemetry's layer on the SDK's batch span processor behind \
         an INFO filter, with an exporter that counts and drops; it was handed {exported} \
         spans (the lock spans are at DEBUG unless the manager says INFO)."
    ));
    if let Value::Object(map) = &mut outcome.json {
        map.insert("otel_spans_exported".into(), json!(exported));
    }
    if exported == 0 {
        return Err(
            "the OpenTelemetry variants exported no span: the pipeline is not wired".into(),
        );
    }
    Ok(outcome)
}

/// Scenario 2: `try_acquire` + `release`.
pub(crate) async fn try_acquire(db: Database, plan: Plan) -> Result<Outcome, BoxError> {
    let key = |n: usize| format!("bench:try:{n}");
    let client = db.connect("lock-bench-cycle").await?;
    let statements = RawStatements::prepare(&client).await?;
    let variants = vec![
        Variant::new(
            "library: try_acquire + release",
            Role::Library,
            Op::TryAcquire {
                manager: PostgresLockManager::new(db.pool(1, "lock-bench-cycle")),
                key: key(0),
            },
        ),
        Variant::new(
            "raw: prepared pg_try_advisory_lock($1) + unlock",
            Role::Baseline,
            Op::RawPrepared {
                client,
                statements,
                id: lock_id(&key(1)),
                try_lock: true,
            },
        ),
        Variant::new(
            "raw: simple-query pg_try_advisory_lock(n) + unlock",
            Role::Baseline,
            Op::RawSimple {
                client: db.connect("lock-bench-cycle").await?,
                id: lock_id(&key(2)),
                try_lock: true,
            },
        ),
    ];
    run(
        "2. Uncontended try_acquire + release cycle, pinned and unpinned",
        "cycle_try_acquire",
        variants,
        &plan,
        TRY_LIMIT,
    )
    .await
}
