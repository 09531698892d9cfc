//! Scenarios 1 and 2: one uncontended acquire+release after another, the library against
//! raw `tokio-postgres` on one dedicated connection.
//!
//! Each scenario runs on a thread of its own with a current-thread Tokio runtime (the
//! connections' drivers run there too), twice: first left to the scheduler (**unpinned**),
//! then with that thread and every variant's server backend on one CPU (**pinned**). In each
//! pass the variants take turns, one batch each per round, the order rotating; a round's
//! p50 is one run, and the tables show the median of the runs with their spread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::{Value, json};

use crate::db::{Database, RawStatements};
use crate::ops::Op;
use crate::otel::Pipeline;
use crate::report::{Check, Outcome, Section, verdict};
use crate::stats::{Latencies, as_f64, fmt_ns, median};
use crate::{BoxError, Plan, cpu, pin};

/// The most a pinned library `acquire` cycle may cost, as a multiple of the raw cycle's
/// (median of the per-run ratios): issue 12's target.
const CYCLE_LIMIT: f64 = 1.10;
/// The same for `try_acquire` (no target of its own in issue 12: the earlier one).
const TRY_LIMIT: f64 = 1.15;

/// The timeout of the bounded variants.
pub(crate) const BOUNDED: Duration = Duration::from_secs(5);

/// What a variant is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The library, checked against the baseline.
    Library,
    /// The library with an OpenTelemetry pipeline installed: shown, the target is on
    /// instructions (scenario 7).
    Traced,
    /// The library with a setting changed (fencing on, keepalive off): shown, no target.
    Setting,
    /// A candidate for the baseline: the faster of these is the physical limit.
    Baseline,
    /// Shown for reading the figures (the library's own SQL text on a raw connection).
    Reference,
}

/// Left to the scheduler, or on one CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Unpinned,
    Pinned,
}

impl Pass {
    const ALL: [Self; 2] = [Self::Unpinned, Self::Pinned];

    fn index(self) -> usize {
        self as usize
    }
}

/// What one pass measured of one variant.
#[derive(Debug)]
struct PassData {
    pooled: Latencies,
    /// The p50 of each round's batch, in nanoseconds.
    runs: Vec<u64>,
    client_ticks: u64,
    server_ticks: u64,
}

impl PassData {
    fn new() -> Self {
        Self {
            pooled: Latencies::new(),
            runs: Vec::new(),
            client_ticks: 0,
            server_ticks: 0,
        }
    }
}

pub(crate) struct Variant {
    name: &'static str,
    role: Role,
    op: Op,
    /// Installed (thread-locally) around this variant's batches.
    tracing: Option<tracing::Dispatch>,
    /// The server process of this variant's connection, when the server runs here.
    backend: Option<u32>,
    passes: [PassData; 2],
}

impl Variant {
    pub(crate) fn new(name: &'static str, role: Role, op: Op) -> Self {
        Self {
            name,
            role,
            op,
            tracing: None,
            backend: None,
            passes: [PassData::new(), PassData::new()],
        }
    }

    fn traced(mut self, pipeline: &Pipeline) -> Self {
        self.tracing = Some(tracing::Dispatch::new(pipeline.subscriber()));
        self
    }

    async fn find_backend(&mut self) -> Result<(), BoxError> {
        let pid = self.op.backend_pid().await?;
        self.backend = u32::try_from(pid)
            .ok()
            .filter(|&pid| is_local_postgres(pid));
        Ok(())
    }

    /// One batch of `cycles`, recorded in `pass`.
    async fn batch(&mut self, pass: Pass, cycles: usize) -> Result<(), BoxError> {
        let _tracing = self.tracing.as_ref().map(tracing::dispatcher::set_default);
        let data = &mut self.passes[pass.index()];
        let mut batch = Latencies::new();
        let client_before = cpu::process_ticks(None).unwrap_or(0);
        let server_before = self.backend.and_then(|pid| cpu::process_ticks(Some(pid)));
        for _ in 0..cycles {
            let started = Instant::now();
            self.op.cycle().await?;
            batch.record(started.elapsed());
        }
        let client_after = cpu::process_ticks(None).unwrap_or(0);
        data.client_ticks += client_after.saturating_sub(client_before);
        if let (Some(pid), Some(before)) = (self.backend, server_before) {
            let after = cpu::process_ticks(Some(pid)).unwrap_or(before);
            data.server_ticks += after.saturating_sub(before);
        }
        data.runs.push(batch.p50());
        data.pooled.merge(&batch);
        Ok(())
    }

    /// CPU per cycle in microseconds in `pass`: (client, server).
    fn cpu_per_cycle(&self, pass: Pass) -> (Option<f64>, Option<f64>) {
        let data = &self.passes[pass.index()];
        let cycles = data.pooled.count();
        let per = |ticks: u64| cpu::ticks_to_micros(ticks) / as_f64(cycles.max(1));
        let client = cpu::process_ticks(None).map(|_| per(data.client_ticks));
        let server = self.backend.map(|_| per(data.server_ticks));
        (client, server)
    }
}

/// Runs `scenario` on a thread of its own with a current-thread runtime, so that pinning
/// that thread pins everything the client does for a cycle.
pub(crate) fn on_own_thread<F, Fut>(scenario: F) -> Result<Outcome, BoxError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Outcome, BoxError>>,
{
    std::thread::Builder::new()
        .name("lock-bench-cycle".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(scenario())
        })?
        .join()
        .map_err(|_| "the cycle thread panicked")?
}

/// Runs `scenario` with its own copies of `db` and `plan` through [`on_own_thread`],
/// from a task of the multi-threaded runtime (which it blocks meanwhile).
pub(crate) fn on_cycle_thread<F, Fut>(
    db: &Database,
    plan: &Plan,
    scenario: F,
) -> Result<Outcome, BoxError>
where
    F: FnOnce(Database, Plan) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Outcome, BoxError>>,
{
    let (db, plan) = (db.clone(), plan.clone());
    tokio::task::block_in_place(|| on_own_thread(move || scenario(db, plan)))
}

/// Whether `pid` is a PostgreSQL process on this machine (the server is local).
fn is_local_postgres(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres")
}

/// A manager handing out fencing tokens (the token table must exist).
pub(crate) fn fencing_manager(db: &Database) -> PostgresLockManager {
    PostgresLockManager::builder(db.pool(1, "lock-bench-cycle"))
        .fencing(true)
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
            "library, keepalive off: acquire (no timeout) + release",
            Role::Setting,
            Op::library(quiet_manager(&db), key(10), AcquireOptions::new()),
        ),
        Variant::new(
            "library + OpenTelemetry: acquire (no timeout) + release",
            Role::Traced,
            Op::library(manager(), key(7), AcquireOptions::new()),
        )
        .traced(&pipeline),
        Variant::new(
            "library + OpenTelemetry: acquire (timeout 5 s) + release",
            Role::Traced,
            Op::library(
                manager(),
                key(8),
                AcquireOptions::new().with_timeout(BOUNDED),
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
        "OpenTelemetry: tracing-opentelemetry's layer on the SDK's batch span processor, with \
         an exporter that counts and drops; it was handed {exported} spans."
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

/// Sets the affinity of this thread and of every variant's backend for `pass`; what the
/// report says about it.
fn apply(pass: Pass, variants: &[Variant], all: &[usize], one: usize) -> Result<String, BoxError> {
    let cpus: &[usize] = match pass {
        Pass::Unpinned => all,
        Pass::Pinned => std::slice::from_ref(&one),
    };
    pin::this_thread(cpus)?;
    let mut local = 0;
    for pid in variants.iter().filter_map(|v| v.backend) {
        pin::process(pid, cpus)?;
        local += 1;
    }
    let shown = variants
        .iter()
        .find_map(|v| v.backend)
        .and_then(pin::process_cpus)
        .unwrap_or_else(|| "—".to_owned());
    Ok(match pass {
        Pass::Unpinned => format!("unpinned: client thread and backends on CPUs {all:?}"),
        Pass::Pinned if local == variants.len() => format!(
            "pinned: the client thread and the {local} backends on CPU {one} (taskset shows `{shown}`)"
        ),
        Pass::Pinned => format!(
            "pinned: the client thread on CPU {one}; {local} of {} backends pinned (the others \
             are not on this machine)",
            variants.len()
        ),
    })
}

/// Warms every variant, then runs each pass in rounds, one batch per variant per round,
/// the order rotating from round to round so that none always runs first or last.
pub(crate) async fn run(
    title: &str,
    id: &'static str,
    mut variants: Vec<Variant>,
    plan: &Plan,
    limit: f64,
) -> Result<Outcome, BoxError> {
    let all = pin::allowed_cpus()?;
    let one = *all.last().ok_or("no CPU is allowed")?;
    for variant in &mut variants {
        variant.find_backend().await?;
    }
    let count = variants.len();
    let mut placements = Vec::new();
    for pass in Pass::ALL {
        placements.push(apply(pass, &variants, &all, one)?);
        for variant in &mut variants {
            let _tracing = variant
                .tracing
                .as_ref()
                .map(tracing::dispatcher::set_default);
            for _ in 0..plan.cycle_warmup {
                variant.op.cycle().await?;
            }
        }
        for round in 0..plan.cycle_rounds {
            for step in 0..count {
                variants[(round + step) % count]
                    .batch(pass, plan.cycle_batch)
                    .await?;
            }
        }
    }
    apply(Pass::Unpinned, &variants, &all, one)?;
    Ok(report(title, id, &variants, plan, &placements, limit))
}

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

fn report(
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
