//! `lock-bench`: the lock managers against raw baselines measured in the same run.
//!
//! Run it through `cargo xtask bench [--quick]` (which provides a PostgreSQL server), or
//! directly: `cargo run --release -p lock-bench -- --url postgres://… [--quick]
//! [--out target/bench/results.json] [--only cycle,try,shared,many,throughput,…]`.
//! Without `--url` it reads `LOCKS_DATABASE_URL`.
//!
//! Every scenario alternates the library and its baseline within the run, so a noisy
//! machine shifts both alike; it prints markdown tables (with PASS/MISS against the
//! targets) and writes a JSON file and the charts (`handoff.svg`, `scale.svg`) next to it.
//!
//! The modules stand in floors, each importing only from the floors below it (the test
//! `imports_run_downward` fails on any other edge):
//! - ground: `plan` (the error type, the mode's counts), `stats`, `pin`, `proxy`, `otel`;
//! - 1: `harness` (alternating rounds, batches and windows, the report: rows, targets,
//!   JSON, markdown), `db` (connections, raw statements), `chart`;
//! - 2: `clients` (every client a cycle scenario compares, built by name), `turns` (tasks
//!   taking turns on one key, and the recorder that times them);
//! - 3: `pinned` (the pinned cycle method), `callgrind` (instruction counts);
//! - scenarios, none importing another: `cycles` (the pinned cycles `cycle`, `try`,
//!   `shared`, `many`), `throughput`, `handoff` (locks and the semaphore), `hold` (plain and
//!   multiplexed), `memory`, `instructions`, `metrics`, `latency` (through a delaying
//!   proxy, `acquire_many` included), `cutover_append`, and `scale` (a folder: one file
//!   per curve).

mod callgrind;
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
mod metrics;
mod otel;
mod pin;
mod pinned;
mod plan;
mod proxy;
mod scale;
mod stats;
mod throughput;
mod turns;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use serde_json::{Map, Value, json};

use crate::db::Database;
pub(crate) use crate::plan::{BoxError, DATABASE_URL_ENV, Plan};

const HELP: &str = "\
usage: lock-bench [--url URL] [--quick] [--out FILE.json] [--only LIST] [--scale-max N]

  --url URL     the PostgreSQL server (default: $LOCKS_DATABASE_URL)
  --quick       small iteration counts (under a minute and a half)
  --out FILE    the JSON results (default: target/bench/lock-bench-{quick,full}.json);
                the markdown and the charts (handoff.svg, scale.svg) beside it
  --only LIST   comma-separated scenarios: cycle, try, shared, many, throughput, handoff,
                hold, memory, instructions (needs valgrind), metrics (valgrind),
                latency, cutover-append; and scale (only when named: it needs a
                server sized for it)
  --scale-max N the scale scenario's largest held-lock count (default 1e5, 1e4 with
                --quick; 1e6 needs a server sized for it: `cargo xtask bench` sizes it)

  --count-instructions CLIENT --cycles N
                the child that `instructions` runs under callgrind: N cycles of CLIENT
                (raw, raw-shared, raw-many, library and its settings: library-timeout,
                library-fencing, library-otel, library-metrics-off, … as the tables name)
";

const SCENARIOS: [&str; 13] = [
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
    "scale",
];

#[derive(Debug)]
struct Args {
    url: String,
    plan: Plan,
    out: PathBuf,
    only: Vec<String>,
    /// `--count-instructions CLIENT --cycles N`: the callgrind child.
    child: Option<(String, usize)>,
}

/// `Ok(None)` for `--help`.
fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Args>, String> {
    let mut url = None;
    let mut quick = false;
    let mut out = None;
    // `scale` needs a server sized for it and minutes: only when named.
    let mut only: Vec<String> = SCENARIOS
        .iter()
        .filter(|s| **s != "scale")
        .map(|s| (*s).to_owned())
        .collect();
    let mut child = None;
    let mut cycles = None;
    let mut scale_max = None;
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
            "--scale-max" => scale_max = Some(plan::parse_count(&value("--scale-max")?)?),
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
        (Some(client), Some(cycles)) => Some((client, cycles)),
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
    let mut plan = Plan::new(quick);
    if let Some(count) = scale_max {
        plan.scale_max = count;
    }
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
    let outcome = match &args.child {
        Some((client, cycles)) => callgrind::child(&args.url, client, *cycles),
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|error| format!("could not start the Tokio runtime: {error}").into())
            .and_then(|runtime| runtime.block_on(run(&args))),
    };
    match outcome {
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

    let out_dir = args.out.parent().unwrap_or_else(|| Path::new("."));
    let started = Instant::now();
    let mut outcomes = Vec::new();
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
            "cycle" | "try" | "shared" | "many" => cycles::run(&db, plan, scenario)?,
            "throughput" => throughput::run(&db, plan).await?,
            "handoff" => handoff::run(&db, plan).await?,
            "hold" => hold::run(&db, plan).await?,
            "memory" => memory::run(plan).await?,
            "instructions" => {
                tokio::task::block_in_place(|| instructions::run(&args.url, plan, out_dir))?
            }
            "metrics" => tokio::task::block_in_place(|| metrics::run(&args.url, plan, out_dir))?,
            "latency" => latency::run(&db, plan).await?,
            "cutover-append" => cutover_append::run(&db, plan).await?,
            "scale" => scale::run(&db, plan).await?,
            _ => unreachable!("scenario names are checked when parsing"),
        };
        outcomes.push(outcome);
    }
    let elapsed = started.elapsed();

    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let timestamp = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|line| line.starts_with("model name"))?;
            line.split_once(':')
                .map(|(_, model)| model.trim().to_owned())
        });
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
    let markdown = harness::markdown(&heading, &outcomes);
    println!("{markdown}");

    let mut scenarios = Map::new();
    for outcome in &outcomes {
        scenarios.insert(outcome.id.to_owned(), outcome.json.clone());
    }
    let checks: Vec<Value> = outcomes
        .iter()
        .flat_map(|o| &o.checks)
        .map(harness::Check::to_json)
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
    let mut files = vec![
        (args.out.clone(), serde_json::to_string_pretty(&document)?),
        (args.out.with_extension("md"), markdown),
    ];
    for outcome in &mut outcomes {
        for (name, contents) in outcome.files.drain(..) {
            files.push((out_dir.join(name), contents));
        }
    }
    for (path, contents) in files {
        std::fs::create_dir_all(path.parent().unwrap_or_else(|| Path::new(".")))?;
        std::fs::write(&path, contents)
            .map_err(|error| format!("could not write {}: {error}", path.display()))?;
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
            "--scale-max",
            "1e6",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(parsed.url, "postgres://x@y/z");
        assert!(parsed.plan.quick);
        assert_eq!(parsed.only, ["cycle", "hold"]);
        assert_eq!(parsed.plan.scale_max, 1_000_000);
        assert!(args(&["--url", "u", "--scale-max", "lots"]).is_err());
        assert_eq!(parsed.out, Path::new("target/bench/lock-bench-quick.json"));
        let default = args(&["--url", "u"]).unwrap().unwrap();
        assert!(default.only.iter().any(|s| s == "cycle"));
        assert!(
            !default.only.iter().any(|s| s == "scale"),
            "scale only when named"
        );
        assert_eq!(default.plan.scale_max, 100_000);
        assert!(args(&["--help"]).unwrap().is_none());
        assert!(args(&["--url", "u", "--only", "nope"]).is_err());
        assert!(args(&["--url", "u", "--bogus"]).is_err());
        assert!(args(&["--url"]).is_err());
    }

    /// The floors of the module list above, lowest first; a module not named here is a
    /// scenario, the top floor.
    const FLOORS: [&[&str]; 4] = [
        &["plan", "stats", "pin", "proxy", "otel"],
        &["harness", "db", "chart"],
        &["clients", "turns"],
        &["pinned", "callgrind"],
    ];

    fn floor(module: &str) -> usize {
        FLOORS
            .iter()
            .position(|floor| floor.contains(&module))
            .unwrap_or(FLOORS.len())
    }

    /// The modules `text` names as `crate::x` or in `use crate::{x, …}` (before its tests).
    fn imports(text: &str) -> Vec<String> {
        let text = text.split("#[cfg(test)]").next().unwrap_or(text);
        let ident = |name: &str| -> String {
            let name = name.trim();
            name.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        let mut found: Vec<String> = Vec::new();
        for (index, _) in text.match_indices("crate::") {
            let rest = &text[index + "crate::".len()..];
            match rest.strip_prefix('{') {
                Some(group) => {
                    let group = group.split('}').next().unwrap_or("");
                    found.extend(group.split(',').map(ident));
                }
                None => found.push(ident(rest)),
            }
        }
        found.retain(|name| name.starts_with(|c: char| c.is_ascii_lowercase()));
        found
    }

    /// Each module imports only from floors below its own: the ground imports nothing of
    /// the crate above it, and no scenario imports another.
    fn back_edges(sources: &[(String, String)]) -> Vec<String> {
        let mut wrong = Vec::new();
        for (module, text) in sources {
            for imported in imports(text) {
                if imported != *module && floor(&imported) >= floor(module) {
                    wrong.push(format!("{module} imports {imported}"));
                }
            }
        }
        wrong
    }

    #[test]
    fn imports_run_downward() {
        // Each file of `src/` is a module, and each file of a folder (`scale/`) is part of
        // the module the folder is.
        fn read(dir: &Path, module: Option<&str>, sources: &mut Vec<(String, String)>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                let name = module.map_or_else(|| stem.clone(), str::to_owned);
                if path.is_dir() {
                    read(&path, Some(&stem), sources);
                } else if path.extension().is_some_and(|e| e == "rs") && name != "main" {
                    sources.push((name, std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        let mut sources = Vec::new();
        read(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            None,
            &mut sources,
        );
        assert!(sources.iter().filter(|(m, _)| m == "scale").count() > 4);
        assert!(sources.len() > 20, "read {} modules", sources.len());
        assert_eq!(back_edges(&sources), Vec::<String>::new());
        // A planted back-edge (the ground importing a scenario) is caught.
        let planted = [("db".to_owned(), "use crate::{cycles, stats};".to_owned())];
        assert_eq!(back_edges(&planted), ["db imports cycles"]);
        let sideways = [("hold".to_owned(), "crate::handoff::run(db)".to_owned())];
        assert_eq!(back_edges(&sideways), ["hold imports handoff"]);
    }
}
