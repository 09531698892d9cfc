//! Scenarios 1 and 2: one uncontended acquire+release after another, the library against
//! raw `tokio-postgres` on one dedicated connection.

use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, lock_id};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::{Client, SimpleQueryMessage, Statement};
use serde_json::json;

use crate::db::{Database, RawStatements};
use crate::report::{Check, Outcome, Section, verdict};
use crate::stats::{Latencies, as_f64, fmt_ns, fmt_ratio, ratio};
use crate::{BoxError, Plan, cpu};

/// The most a library cycle may cost, as a multiple of the raw cycle's median.
const CYCLE_LIMIT: f64 = 1.15;

/// The timeout of the bounded variants.
const BOUNDED: Duration = Duration::from_secs(5);

/// What a variant is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The library, checked against the baseline.
    Library,
    /// A candidate for the baseline: the faster of these is the physical limit.
    Baseline,
    /// Shown for reading the figures (the library's own SQL text on a raw connection).
    Reference,
}

/// One way of taking and giving back a lock.
enum Op {
    Acquire {
        manager: PostgresLockManager,
        key: String,
        options: AcquireOptions,
    },
    TryAcquire {
        manager: PostgresLockManager,
        key: String,
    },
    RawPrepared {
        client: Client,
        statements: RawStatements,
        id: i64,
        try_lock: bool,
    },
    RawSimple {
        client: Client,
        id: i64,
        try_lock: bool,
    },
    RawText {
        client: Client,
        lock: String,
        unlock: String,
    },
    /// The library's statement with parameters, prepared once: what the library would
    /// cost if it prepared its statements.
    RawPreparedText {
        client: Client,
        lock: Statement,
        unlock: Statement,
        id: i64,
        lock_timeout: String,
    },
}

impl Op {
    async fn cycle(&self) -> Result<(), BoxError> {
        match self {
            Self::Acquire {
                manager,
                key,
                options,
            } => {
                let guard = manager.acquire(key, *options).await?;
                guard.release().await;
            }
            Self::TryAcquire { manager, key } => {
                let guard = manager
                    .try_acquire(key)
                    .await?
                    .ok_or("an uncontended try_acquire found the lock held")?;
                guard.release().await;
            }
            Self::RawPrepared {
                client,
                statements,
                id,
                try_lock,
            } => {
                if *try_lock {
                    let granted: bool = client.query_one(&statements.try_lock, &[id]).await?.get(0);
                    if !granted {
                        return Err("an uncontended pg_try_advisory_lock was refused".into());
                    }
                } else {
                    client.execute(&statements.lock, &[id]).await?;
                }
                let released: bool = client.query_one(&statements.unlock, &[id]).await?.get(0);
                if !released {
                    return Err("pg_advisory_unlock answered false".into());
                }
            }
            Self::RawSimple {
                client,
                id,
                try_lock,
            } => {
                let function = if *try_lock {
                    "pg_try_advisory_lock"
                } else {
                    "pg_advisory_lock"
                };
                let answer = client
                    .simple_query(&format!("SELECT {function}({id})"))
                    .await?;
                if *try_lock && first_value(&answer).as_deref() != Some("t") {
                    return Err("an uncontended pg_try_advisory_lock was refused".into());
                }
                let answer = client
                    .simple_query(&format!("SELECT pg_advisory_unlock({id})"))
                    .await?;
                if first_value(&answer).as_deref() != Some("t") {
                    return Err("pg_advisory_unlock answered false".into());
                }
            }
            Self::RawText {
                client,
                lock,
                unlock,
            } => {
                client.simple_query(lock).await?;
                let answer = client.simple_query(unlock).await?;
                if first_value(&answer).as_deref() != Some("t") {
                    return Err("pg_advisory_unlock answered false".into());
                }
            }
            Self::RawPreparedText {
                client,
                lock,
                unlock,
                id,
                lock_timeout,
            } => {
                client.execute(lock, &[id, lock_timeout]).await?;
                let released: bool = client.query_one(unlock, &[id]).await?.get(0);
                if !released {
                    return Err("pg_advisory_unlock answered false".into());
                }
            }
        }
        Ok(())
    }
}

fn first_value(messages: &[SimpleQueryMessage]) -> Option<String> {
    messages.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    })
}

struct Variant {
    name: &'static str,
    role: Role,
    op: Op,
    latencies: Latencies,
    /// The server process of this variant's connection, when the server runs here.
    backend: Option<u32>,
    /// CPU time, in clock ticks, of this process and of the backend during the batches.
    client_ticks: u64,
    server_ticks: u64,
}

impl Variant {
    fn new(name: &'static str, role: Role, op: Op) -> Self {
        Self {
            name,
            role,
            op,
            latencies: Latencies::new(),
            backend: None,
            client_ticks: 0,
            server_ticks: 0,
        }
    }

    /// Finds the backend process of this variant's one connection.
    async fn find_backend(&mut self) -> Result<(), BoxError> {
        let pid: i32 = match &self.op {
            Op::Acquire { manager, .. } | Op::TryAcquire { manager, .. } => {
                let connection = manager.pool().get().await?;
                connection
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await?
                    .get(0)
            }
            Op::RawPrepared { client, .. }
            | Op::RawSimple { client, .. }
            | Op::RawText { client, .. }
            | Op::RawPreparedText { client, .. } => client
                .query_one("SELECT pg_backend_pid()", &[])
                .await?
                .get(0),
        };
        self.backend = u32::try_from(pid)
            .ok()
            .filter(|&pid| is_local_postgres(pid));
        Ok(())
    }

    /// CPU per cycle in microseconds: (client, server).
    fn cpu_per_cycle(&self) -> (Option<f64>, Option<f64>) {
        let cycles = self.latencies.count();
        let per = |ticks: u64| cpu::ticks_to_micros(ticks) / as_f64(cycles.max(1));
        let client = cpu::process_ticks(None).map(|_| per(self.client_ticks));
        let server = self.backend.map(|_| per(self.server_ticks));
        (client, server)
    }
}

/// Whether `pid` is a PostgreSQL process on this machine (the server is local).
fn is_local_postgres(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres")
}

/// Scenario 1: `acquire` (without and with a timeout) + `release`.
pub(crate) async fn acquire(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let key = |n: usize| format!("bench:cycle:{n}");
    let manager = || PostgresLockManager::new(db.pool(1, "lock-bench-cycle"));
    let raw = || db.connect("lock-bench-cycle");
    let text_id = lock_id(&key(5));
    let bounded_ms = BOUNDED.as_millis();
    let variants = vec![
        Variant::new(
            "library: acquire (no timeout) + release",
            Role::Library,
            Op::Acquire {
                manager: manager(),
                key: key(0),
                options: AcquireOptions::new(),
            },
        ),
        Variant::new(
            "library: acquire (timeout 5 s) + release",
            Role::Library,
            Op::Acquire {
                manager: manager(),
                key: key(1),
                options: AcquireOptions::new().with_timeout(BOUNDED),
            },
        ),
        Variant::new(
            "raw: prepared pg_advisory_lock($1) + unlock",
            Role::Baseline,
            {
                let client = raw().await?;
                let statements = RawStatements::prepare(&client).await?;
                Op::RawPrepared {
                    client,
                    statements,
                    id: lock_id(&key(2)),
                    try_lock: false,
                }
            },
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
            "raw: the library's SQL text, no timeout",
            Role::Reference,
            Op::RawText {
                client: raw().await?,
                lock: format!(
                    "SELECT pg_advisory_lock({text_id}) \
                     FROM (SELECT set_config('lock_timeout', '0', true)) AS options"
                ),
                unlock: format!("SELECT pg_advisory_unlock({text_id})"),
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
        Variant::new(
            "raw: the library's statement prepared ($1, $2), timeout 5 s",
            Role::Reference,
            {
                let client = raw().await?;
                let lock = client
                    .prepare(
                        "SELECT pg_advisory_lock($1) \
                         FROM (SELECT set_config('lock_timeout', $2, true)) AS options",
                    )
                    .await?;
                let unlock = client.prepare("SELECT pg_advisory_unlock($1)").await?;
                Op::RawPreparedText {
                    client,
                    lock,
                    unlock,
                    id: lock_id(&key(6)),
                    lock_timeout: bounded_ms.to_string(),
                }
            },
        ),
    ];
    run(
        "1. Uncontended acquire + release cycle",
        "cycle_acquire",
        variants,
        plan,
    )
    .await
}

/// Scenario 2: `try_acquire` + `release`.
pub(crate) async fn try_acquire(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
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
        "2. Uncontended try_acquire + release cycle",
        "cycle_try_acquire",
        variants,
        plan,
    )
    .await
}

/// Warms every variant, then runs them in rounds, one batch each, the order rotating
/// from round to round so that none always runs first or last.
async fn run(
    title: &str,
    id: &'static str,
    mut variants: Vec<Variant>,
    plan: &Plan,
) -> Result<Outcome, BoxError> {
    for variant in &mut variants {
        variant.find_backend().await?;
        for _ in 0..plan.cycle_warmup {
            variant.op.cycle().await?;
        }
    }
    let count = variants.len();
    for round in 0..plan.cycle_rounds {
        for step in 0..count {
            let variant = &mut variants[(round + step) % count];
            let client_before = cpu::process_ticks(None).unwrap_or(0);
            let server_before = variant
                .backend
                .and_then(|pid| cpu::process_ticks(Some(pid)));
            for _ in 0..plan.cycle_batch {
                let started = Instant::now();
                variant.op.cycle().await?;
                variant.latencies.record(started.elapsed());
            }
            let client_after = cpu::process_ticks(None).unwrap_or(0);
            variant.client_ticks += client_after.saturating_sub(client_before);
            if let (Some(pid), Some(before)) = (variant.backend, server_before) {
                let after = cpu::process_ticks(Some(pid)).unwrap_or(before);
                variant.server_ticks += after.saturating_sub(before);
            }
        }
    }

    let baseline = variants
        .iter()
        .filter(|v| v.role == Role::Baseline)
        .min_by_key(|v| v.latencies.p50())
        .expect("every cycle scenario has a baseline");
    let (base_name, base_p50, base_p99) = (
        baseline.name,
        baseline.latencies.p50(),
        baseline.latencies.p99(),
    );

    let mut rows = Vec::new();
    let mut checks = Vec::new();
    let mut json_variants = Vec::new();
    for variant in &variants {
        let (p50, p99) = (variant.latencies.p50(), variant.latencies.p99());
        let ratio_p50 = ratio(as_f64(p50), as_f64(base_p50));
        let ratio_p99 = ratio(as_f64(p99), as_f64(base_p99));
        let is_baseline = variant.name == base_name;
        let (client_cpu, server_cpu) = variant.cpu_per_cycle();
        let micros =
            |value: Option<f64>| value.map_or_else(|| "—".to_owned(), |v| format!("{v:.0} µs"));
        let (target, result) = match variant.role {
            Role::Library => {
                let pass = ratio_p50.is_some_and(|r| r <= CYCLE_LIMIT);
                checks.push(Check::new(
                    format!("{}: p50 vs raw", variant.name),
                    format!(
                        "{} ({} vs {})",
                        fmt_ratio(ratio_p50),
                        fmt_ns(p50),
                        fmt_ns(base_p50)
                    ),
                    format!("≤ {CYCLE_LIMIT:.2}×"),
                    pass,
                ));
                (format!("p50 ≤ {CYCLE_LIMIT:.2}×"), verdict(pass).to_owned())
            }
            Role::Baseline if is_baseline => ("baseline (faster raw)".to_owned(), String::new()),
            Role::Baseline | Role::Reference => (String::new(), String::new()),
        };
        rows.push(vec![
            variant.name.to_owned(),
            fmt_ns(p50),
            fmt_ns(p99),
            fmt_ratio(ratio_p50),
            fmt_ratio(ratio_p99),
            micros(client_cpu),
            micros(server_cpu),
            target,
            result,
        ]);
        json_variants.push(json!({
            "name": variant.name,
            "role": format!("{:?}", variant.role).to_lowercase(),
            "is_baseline": is_baseline,
            "latency": variant.latencies.to_json(),
            "ratio_p50": ratio_p50,
            "ratio_p99": ratio_p99,
            "client_cpu_us_per_cycle": client_cpu,
            "server_cpu_us_per_cycle": server_cpu,
        }));
    }
    Ok(Outcome {
        id,
        section: Section {
            title: title.to_owned(),
            notes: vec![format!(
                "{} rounds × {} cycles per variant, variants interleaved round by round; one \
                 cycle = lock + unlock, timed from the call to the return of the release. \
                 Ratios are against the faster raw form: **{base_name}**. CPU per cycle: \
                 this process, and the variant's server backend (when the server runs on \
                 this machine), from `/proc/<pid>/stat` ({} ms ticks, summed over batches).",
                plan.cycle_rounds,
                plan.cycle_batch,
                cpu::TICK_MS
            )],
            header: vec![
                "Variant",
                "p50",
                "p99",
                "÷ raw p50",
                "÷ raw p99",
                "client CPU",
                "server CPU",
                "Target",
                "Result",
            ],
            rows,
        },
        checks,
        json: json!({
            "rounds": plan.cycle_rounds,
            "cycles_per_round": plan.cycle_batch,
            "baseline": base_name,
            "variants": json_variants,
        }),
    })
}
