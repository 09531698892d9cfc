//! `lock-bench`: the lock managers against raw baselines measured in the same run.
//!
//! Run it through `cargo xtask bench [--quick]` (which provides a PostgreSQL server), or
//! directly: `cargo run --release -p lock-bench -- --url postgres://… [--quick]
//! [--out target/bench/results.json] [--only cycle,try,shared,many,throughput,…]`.
//! Without `--url` it reads `LOCKS_DATABASE_URL`.
//!
//! Every scenario alternates the library and its baseline within the run, so a noisy
//! machine shifts both alike; it prints markdown tables (with PASS/MISS against the
//! targets) and writes a JSON file and `handoff.svg` next to it.

mod chart;
mod cpu;
mod cutover_append;
mod cycle;
mod db;
mod groups;
mod handoff;
mod hold;
mod instructions;
mod interleave;
mod kinds;
mod latency;
mod memory;
mod metrics_cost;
mod multiplex;
mod ops;
mod otel;
mod permits;
mod pin;
mod proxy;
mod report;
mod stats;
mod throughput;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::db::Database;

/// Counts live heap bytes (for the per-lock memory figures); otherwise the system allocator.
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) const DATABASE_URL_ENV: &str = "LOCKS_DATABASE_URL";

const HELP: &str = "\
usage: lock-bench [--url URL] [--quick] [--out FILE.json] [--only LIST]

  --url URL     the PostgreSQL server (default: $LOCKS_DATABASE_URL)
  --quick       small iteration counts (under a minute and a half)
  --out FILE    the JSON results (default: target/bench/lock-bench-{quick,full}.json);
                the markdown and handoff.svg are written next to it
  --only LIST   comma-separated scenarios: cycle, try, shared, many, throughput, handoff,
                hold, memory, instructions (needs valgrind), metrics (valgrind),
                latency, cutover-append, multiplex, groups, permits

  --count-instructions VARIANT --cycles N
                the child that `instructions` runs under callgrind: N cycles of VARIANT
                (raw, library, library-timeout, library-fencing, library-keepalive-off,
                library-lease-off,
                library-otel, library-timeout-otel, library-otel-spans,
                library-timeout-otel-spans, raw-shared, library-shared, raw-many,
                library-many; `metrics`: library-metrics-off, library-metrics-sdk)
";

const SCENARIOS: [&str; 15] = [
    "cycle",
    "try",
    "shared",
    "many",
    "throughput",
    "handoff",
    "hold",
    "memory",
    "instructions",
    "metrics",
    "latency",
    "cutover-append",
    "multiplex",
    "groups",
    "permits",
];

/// Live heap bytes of this process.
pub(crate) fn allocated_bytes() -> usize {
    ALLOCATOR.allocated()
}

/// Resident memory of this process (`VmRSS`), where `/proc` has it.
pub(crate) fn rss_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Iteration counts and windows of one mode.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    pub(crate) cycle_warmup: usize,
    pub(crate) cycle_rounds: usize,
    pub(crate) cycle_batch: usize,
    pub(crate) throughput_rounds: usize,
    pub(crate) throughput_window: Duration,
    pub(crate) handoff_rounds: usize,
    pub(crate) handoff_window: Duration,
    pub(crate) handoff_poll_window: Duration,
    pub(crate) hold_locks: usize,
    pub(crate) hold_rounds: usize,
    pub(crate) memory_rounds: usize,
    pub(crate) memory_batches: usize,
    pub(crate) memory_batch: usize,
    pub(crate) memory_window: Duration,
    pub(crate) memory_windows: usize,
    /// N of the callgrind runs (N and 2N cycles).
    pub(crate) callgrind_cycles: usize,
    pub(crate) latency_rounds: usize,
    pub(crate) latency_batch: usize,
}

impl Plan {
    fn quick() -> Self {
        Self {
            quick: true,
            cycle_warmup: 50,
            cycle_rounds: 6,
            cycle_batch: 200,
            throughput_rounds: 3,
            throughput_window: Duration::from_millis(600),
            handoff_rounds: 2,
            handoff_window: Duration::from_millis(600),
            handoff_poll_window: Duration::from_millis(1500),
            hold_locks: 100,
            hold_rounds: 2,
            memory_rounds: 4,
            memory_batches: 20,
            memory_batch: 1000,
            memory_window: Duration::from_millis(300),
            memory_windows: 4,
            callgrind_cycles: 300,
            latency_rounds: 5,
            latency_batch: 40,
        }
    }

    fn full() -> Self {
        Self {
            quick: false,
            cycle_warmup: 200,
            cycle_rounds: 20,
            cycle_batch: 1000,
            throughput_rounds: 6,
            throughput_window: Duration::from_secs(3),
            handoff_rounds: 5,
            handoff_window: Duration::from_secs(2),
            handoff_poll_window: Duration::from_secs(6),
            hold_locks: 500,
            hold_rounds: 3,
            memory_rounds: 10,
            memory_batches: 50,
            memory_batch: 1000,
            memory_window: Duration::from_secs(1),
            memory_windows: 6,
            callgrind_cycles: 2000,
            latency_rounds: 10,
            latency_batch: 200,
        }
    }

    fn mode(&self) -> &'static str {
        if self.quick { "quick" } else { "full" }
    }
}

#[derive(Debug)]
struct Args {
    url: String,
    plan: Plan,
    out: PathBuf,
    only: Vec<String>,
    /// `--count-instructions VARIANT --cycles N`: the callgrind child.
    child: Option<(String, usize)>,
}

/// `Ok(None)` for `--help`.
fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Args>, String> {
    let mut url = None;
    let mut quick = false;
    let mut out = None;
    let mut only: Vec<String> = SCENARIOS.iter().map(|s| (*s).to_owned()).collect();
    let mut child = None;
    let mut cycles = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| format!("{name} needs a value\n\n{HELP}"))
        };
        match arg.as_str() {
            "--url" => url = Some(value("--url")?),
            "--quick" => quick = true,
            "--out" => out = Some(PathBuf::from(value("--out")?)),
            "--only" => {
                only = value("--only")?
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect();
                if let Some(unknown) = only.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
                    return Err(format!("unknown scenario `{unknown}`\n\n{HELP}"));
                }
            }
            "--count-instructions" => child = Some(value("--count-instructions")?),
            "--cycles" => {
                let text = value("--cycles")?;
                cycles = Some(
                    text.parse::<usize>()
                        .map_err(|error| format!("--cycles {text}: {error}"))?,
                );
            }
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unexpected argument `{other}`\n\n{HELP}")),
        }
    }
    let child = match (child, cycles) {
        (Some(variant), Some(cycles)) => Some((variant, cycles)),
        (None, None) => None,
        _ => {
            return Err(format!(
                "--count-instructions and --cycles go together\n\n{HELP}"
            ));
        }
    };
    let url = match url {
        Some(url) => url,
        None => std::env::var(DATABASE_URL_ENV)
            .ok()
            .filter(|url| !url.trim().is_empty())
            .ok_or_else(|| format!("no server: pass --url or set {DATABASE_URL_ENV}\n\n{HELP}"))?,
    };
    let plan = if quick { Plan::quick() } else { Plan::full() };
    let out = out
        .unwrap_or_else(|| PathBuf::from(format!("target/bench/lock-bench-{}.json", plan.mode())));
    Ok(Some(Args {
        url,
        plan,
        out,
        only,
        child,
    }))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("lock-bench: {message}");
            return ExitCode::FAILURE;
        }
    };
    if let Some((variant, cycles)) = &args.child {
        return match instructions::child(&args.url, variant, *cycles) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("lock-bench: error: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lock-bench: could not start the Tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lock-bench: error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), BoxError> {
    if cfg!(debug_assertions) {
        eprintln!("lock-bench: warning: a debug build; figures are only meaningful with --release");
    }
    let plan = &args.plan;
    let db = Database::new(&args.url)?;
    let admin = db
        .connect("lock-bench-admin")
        .await
        .map_err(|error| format!("could not connect to the server: {error}"))?;
    let server_version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
    let max_connections: String = admin.query_one("SHOW max_connections", &[]).await?.get(0);
    let needed = plan.hold_locks + 8;
    if args.only.iter().any(|s| s == "hold")
        && max_connections.parse::<usize>().unwrap_or(0) < needed
    {
        return Err(format!(
            "the server allows {max_connections} connections; the hold scenario needs {needed}"
        )
        .into());
    }
    drop(admin);

    let started = Instant::now();
    let mut outcomes = Vec::new();
    let mut series = Vec::new();
    for scenario in SCENARIOS {
        if !args.only.iter().any(|s| s == scenario) {
            continue;
        }
        eprintln!(
            "lock-bench: [{:>5.1} s] {scenario} ({} mode)…",
            started.elapsed().as_secs_f64(),
            plan.mode()
        );
        let outcome = match scenario {
            "cycle" => cycle::on_cycle_thread(&db, plan, cycle::acquire)?,
            "try" => cycle::on_cycle_thread(&db, plan, cycle::try_acquire)?,
            "shared" => cycle::on_cycle_thread(&db, plan, kinds::shared)?,
            "many" => cycle::on_cycle_thread(&db, plan, kinds::many)?,
            "throughput" => throughput::run(&db, plan).await?,
            "handoff" => {
                let (outcome, handoff_series) = handoff::run(&db, plan).await?;
                series = handoff_series;
                outcome
            }
            "hold" => hold::run(&db, plan).await?,
            "memory" => memory::run(plan).await?,
            "instructions" => {
                let out_dir = args.out.parent().unwrap_or_else(|| Path::new("."));
                tokio::task::block_in_place(|| instructions::run(&args.url, plan, out_dir))?
            }
            "metrics" => {
                let out_dir = args.out.parent().unwrap_or_else(|| Path::new("."));
                tokio::task::block_in_place(|| metrics_cost::run(&args.url, plan, out_dir))?
            }
            "latency" => latency::run(&db, plan).await?,
            "cutover-append" => cutover_append::run(&db, plan).await?,
            "multiplex" => multiplex::run(&db, plan).await?,
            "groups" => groups::run(&db, plan).await?,
            "permits" => permits::run(&db, plan).await?,
            _ => unreachable!("scenario names are checked when parsing"),
        };
        outcomes.push(outcome);
    }
    let elapsed = started.elapsed();

    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let timestamp = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let cpu = cpu_model();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .ok();
    let heading = format!(
        "## lock-bench results ({} mode)\n\nPostgreSQL {server_version}, {cores} cores ({}), \
         {timestamp}, {:.0} s.",
        plan.mode(),
        cpu.as_deref().unwrap_or("unknown CPU"),
        elapsed.as_secs_f64()
    );
    let markdown = report::markdown(&heading, &outcomes);
    println!("{markdown}");

    let mut scenarios = Map::new();
    for outcome in &outcomes {
        scenarios.insert(outcome.id.to_owned(), outcome.json.clone());
    }
    let checks: Vec<Value> = outcomes
        .iter()
        .flat_map(|o| &o.checks)
        .map(report::Check::to_json)
        .collect();
    let document = json!({
        "meta": {
            "tool": "lock-bench",
            "version": env!("CARGO_PKG_VERSION"),
            "mode": plan.mode(),
            "quick": plan.quick,
            "timestamp": timestamp,
            "postgresql_server_version": server_version,
            "postgresql_max_connections": max_connections,
            "cores": cores,
            "cpu": cpu,
            "kernel": kernel,
            "optimized_build": !cfg!(debug_assertions),
            "elapsed_s": elapsed.as_secs_f64(),
            "plan": format!("{plan:?}"),
        },
        "scenarios": scenarios,
        "targets": checks,
    });
    write(&args.out, &serde_json::to_string_pretty(&document)?)?;
    write(&args.out.with_extension("md"), &markdown)?;
    let mut written = vec![args.out.clone(), args.out.with_extension("md")];
    if !series.is_empty() {
        let svg_path = args
            .out
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join("handoff.svg");
        let subtitle = format!(
            "PostgreSQL {server_version}, {cores} cores, {} mode; hold 2 ms, acquire timeout 5 s.",
            plan.mode()
        );
        write(&svg_path, &chart::handoff_svg(&series, &subtitle)?)?;
        written.push(svg_path);
    }
    for path in written {
        eprintln!("lock-bench: wrote {}", path.display());
    }
    let missed = outcomes
        .iter()
        .flat_map(|o| &o.checks)
        .filter(|c| !c.pass)
        .count();
    if missed > 0 {
        eprintln!("lock-bench: {missed} target(s) missed (see the MISS rows)");
    }
    Ok(())
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, model)| model.trim().to_owned())
}

fn write(path: &Path, contents: &str) -> Result<(), BoxError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, contents)
        .map_err(|error| format!("could not write {}: {error}", path.display()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Option<Args>, String> {
        parse(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn arguments_are_parsed() {
        let parsed = args(&[
            "--url",
            "postgres://x@y/z",
            "--quick",
            "--only",
            "cycle,hold",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(parsed.url, "postgres://x@y/z");
        assert!(parsed.plan.quick);
        assert_eq!(parsed.only, ["cycle", "hold"]);
        assert_eq!(parsed.out, Path::new("target/bench/lock-bench-quick.json"));
        assert!(args(&["--help"]).unwrap().is_none());
        assert!(args(&["--url", "u", "--only", "nope"]).is_err());
        assert!(args(&["--url", "u", "--bogus"]).is_err());
        assert!(args(&["--url"]).is_err());
    }

    #[test]
    fn the_allocator_counts() {
        let before = allocated_bytes();
        let block = vec![0u8; 1 << 20];
        assert!(allocated_bytes() >= before + (1 << 20) - 4096);
        drop(block);
    }
}
