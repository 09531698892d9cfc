//! `lock-bench`: the lock managers against raw baselines measured in the same run, through
//! `cargo xtask bench` or with `--url`; what and how: `docs/benchmarks.md`. The modules
//! stand in floors, each importing only from floors below it (`BENCH_FLOORS` in
//! `tests/modules.rs`): ground `plan`, `stats`, `proxy`, `otel`; harness `harness`, `db`,
//! `chart`; clients and turns `clients`, `turns`; then the scenarios, a file each.

mod chart;
mod clients;
mod cutover_append;
mod cycles;
mod db;
mod handoff;
mod harness;
mod hold;
mod instructions;
mod latency;
mod memory;
mod otel;
mod plan;
mod proxy;
mod scale;
mod stats;
mod throughput;
mod turns;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use serde_json::{Map, json};

use crate::db::Database;
pub(crate) use crate::plan::{BoxError, DATABASE_URL_ENV, Plan, Result, sources};

/// The scenarios in the order they run; `scale` only when named.
const SCENARIOS: [&str; 12] = [
    "cycle",
    "try",
    "shared",
    "throughput",
    "handoff",
    "hold",
    "memory",
    "instructions",
    "metrics",
    "latency",
    "cutover-append",
    "scale",
];

/// The lock managers against raw baselines measured in the same run.
#[derive(Debug, clap::Parser)]
#[command(name = "lock-bench")]
struct Args {
    /// The PostgreSQL server [default: $LOCKS_DATABASE_URL]
    #[arg(long)]
    url: Option<String>,
    /// Small iteration counts (under a minute and a half)
    #[arg(long)]
    quick: bool,
    /// The JSON results [default: target/bench/lock-bench-{quick,full}.json]; the markdown
    /// and the charts (handoff.svg, scale.svg) beside it
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Comma-separated scenarios [default: all but scale]; instructions and metrics need
    /// valgrind
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = SCENARIOS)]
    only: Vec<String>,
    /// The scale scenario's largest held-lock count [default: 1e5, 1e4 with --quick]; 1e6
    /// needs a server sized for it (`cargo xtask bench` sizes it)
    #[arg(long, value_name = "N", value_parser = plan::parse_count)]
    scale_max: Option<usize>,
    /// The child that `instructions` runs under callgrind: N cycles (--cycles) of CLIENT
    /// (raw, raw-shared, raw-many, library and its settings: library-timeout,
    /// library-fencing, library-otel, library-metrics-off, … as the tables name)
    #[arg(long, value_name = "CLIENT", requires = "cycles")]
    count_instructions: Option<String>,
    /// With --count-instructions
    #[arg(long, value_name = "N", requires = "count_instructions")]
    cycles: Option<usize>,
}

impl Args {
    fn plan(&self) -> Plan {
        let mut plan = Plan::new(self.quick);
        plan.scale_max = self.scale_max.unwrap_or(plan.scale_max);
        plan
    }

    fn url(&self) -> Result<String, String> {
        (self.url.clone())
            .or_else(|| std::env::var(DATABASE_URL_ENV).ok())
            .filter(|url| !url.trim().is_empty())
            .ok_or_else(|| format!("no server: pass --url or set {DATABASE_URL_ENV}"))
    }

    fn runs(&self, scenario: &str) -> bool {
        let named = self.only.iter().any(|s| s == scenario);
        named || (self.only.is_empty() && scenario != "scale")
    }

    fn out(&self) -> PathBuf {
        let default = || format!("target/bench/lock-bench-{}.json", self.plan().mode());
        self.out.clone().unwrap_or_else(|| default().into())
    }
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let outcome = args.url().map_err(BoxError::from).and_then(|url| {
        match (&args.count_instructions, args.cycles) {
            (Some(client), Some(cycles)) => instructions::child(&url, client, cycles),
            _ => tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|error| format!("could not start the Tokio runtime: {error}").into())
                .and_then(|runtime| runtime.block_on(run(&args, &url))),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lock-bench: error: {}", sources(&*error));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args, url: &str) -> Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("lock-bench: warning: a debug build; measure with --profile measure");
    }
    let (plan, mode) = (&args.plan(), args.plan().mode());
    let db = Database::new(url)?;
    let admin = (db.connect("lock-bench-admin").await)
        .map_err(|error| format!("could not connect to the server: {}", sources(&*error)))?;
    let server_version = db::show(&admin, "server_version").await?;
    let max_connections = db::show(&admin, "max_connections").await?;
    let needed = hold::locks(plan) + 8;
    if args.runs("hold") && max_connections.parse::<usize>().unwrap_or(0) < needed {
        let error = format!("the server allows {max_connections} connections; hold needs {needed}");
        return Err(error.into());
    }
    drop(admin);

    let out = args.out();
    let out_dir = out.parent().unwrap_or_else(|| Path::new("."));
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for scenario in SCENARIOS.into_iter().filter(|s| args.runs(s)) {
        let elapsed = started.elapsed().as_secs_f64();
        eprintln!("lock-bench: [{elapsed:>5.1} s] {scenario} ({mode} mode)…");
        let outcome = match scenario {
            "cycle" | "try" | "shared" => {
                outcomes.extend(cycles::run(&db, plan, scenario)?);
                continue;
            }
            "throughput" => throughput::run(&db, plan).await?,
            "handoff" => handoff::run(&db, plan).await?,
            "hold" => hold::run(&db, plan).await?,
            "memory" => memory::run(plan).await?,
            "instructions" | "metrics" => {
                tokio::task::block_in_place(|| instructions::run(url, plan, out_dir, scenario))?
            }
            "latency" => latency::run(&db, plan).await?,
            "cutover-append" => cutover_append::run(&db, plan).await?,
            _ => scale::run(&db, plan).await?,
        };
        outcomes.push(outcome);
    }
    let elapsed = started.elapsed().as_secs_f64();

    // What the figures ran on.
    let read = |path| std::fs::read_to_string(path).ok();
    let cpu = read("/proc/cpuinfo").and_then(|info| {
        let line = info.lines().find(|line| line.starts_with("model name"))?;
        line.split_once(':')
            .map(|(_, model)| model.trim().to_owned())
    });
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let kernel = read("/proc/sys/kernel/osrelease").map(|s| s.trim().to_owned());
    let timestamp = (time::OffsetDateTime::now_utc())
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let machine = cpu.as_deref().unwrap_or("unknown CPU");
    let heading = format!(
        "## lock-bench results ({mode} mode)\n\nPostgreSQL {server_version}, {cores} cores \
         ({machine}), {timestamp}, {elapsed:.0} s."
    );
    let markdown = harness::markdown(&heading, &outcomes);
    println!("{markdown}");
    let scenarios: Map<_, _> = (outcomes.iter())
        .map(|o| (o.id.to_owned(), o.to_json()))
        .collect();
    let document = json!({
        "meta": {
            "tool": "lock-bench",
            "version": env!("CARGO_PKG_VERSION"),
            "mode": mode,
            "quick": plan.quick,
            "timestamp": timestamp,
            "postgresql_server_version": server_version,
            "postgresql_max_connections": max_connections,
            "cores": cores,
            "cpu": cpu,
            "kernel": kernel,
            "optimized_build": !cfg!(debug_assertions),
            "elapsed_s": elapsed,
            "plan": format!("{plan:?}"),
            "units": "durations in ns, sizes in bytes, rates per second",
        },
        "scenarios": scenarios,
    });
    let files = [
        (out.with_extension("md"), markdown),
        (out.clone(), serde_json::to_string_pretty(&document)?),
    ];
    let charts = outcomes.iter_mut().flat_map(|o| o.files.drain(..));
    let charts = charts.map(|(name, svg)| (out_dir.join(name), svg));
    for (path, contents) in files.into_iter().chain(charts) {
        std::fs::create_dir_all(path.parent().unwrap_or_else(|| Path::new(".")))?;
        std::fs::write(&path, contents)
            .map_err(|error| format!("could not write {}: {error}", path.display()))?;
        eprintln!("lock-bench: wrote {}", path.display());
    }
    let checks = outcomes.iter().flat_map(|o| &o.checks);
    let missed = checks.filter(|c| !c.pass).count();
    if missed > 0 {
        eprintln!("lock-bench: {missed} target(s) missed (see the MISS rows)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &str) -> Result<Args, clap::Error> {
        <Args as clap::Parser>::try_parse_from(["lock-bench"].into_iter().chain(list.split(' ')))
    }

    #[test]
    fn arguments_are_parsed() {
        <Args as clap::CommandFactory>::command().debug_assert();
        let parsed = args("--url u --quick --only cycle,hold --scale-max 1e6").unwrap();
        assert_eq!(parsed.url().unwrap(), "u");
        assert!(parsed.plan().quick);
        assert!(parsed.runs("hold") && !parsed.runs("try"));
        assert_eq!(parsed.plan().scale_max, 1_000_000);
        let quick = Path::new("target/bench/lock-bench-quick.json");
        assert_eq!(parsed.out(), quick);
        let default = args("--url u").unwrap();
        assert!(default.runs("cycle"));
        assert!(!default.runs("scale"), "scale only when named");
        assert_eq!(default.plan().scale_max, 100_000);
        for wrong in [
            "--url u --scale-max lots",
            "--url u --only nope",
            "--url u --bogus",
            "--url",
        ] {
            assert!(args(wrong).is_err(), "{wrong}");
        }
        let without_cycles = args("--count-instructions raw");
        assert!(without_cycles.is_err(), "without --cycles");
    }
}
