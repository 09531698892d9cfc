//! Scenarios `instructions` and `metrics`: client instructions per acquire + release
//! cycle. The bench runs itself under callgrind in a child mode ([`child`]) making one
//! client of [`crate::clients`], N cycles and then 2N: the difference over N is a cycle,
//! start-up and exit subtracted. `metrics`: against the same build with `metrics(false)`.

use std::path::Path;
use std::process::Command;

use crate::clients::{client, label};
use crate::db::Database;
use crate::harness::{Cell, Outcome, row};
use crate::otel::{MetricsPipeline, Pipeline};
use crate::stats::ratio;
use crate::{BoxError, DATABASE_URL_ENV, Plan, Result};

const WARMUP: usize = 50;
/// The keys' prefix of every counted client.
const KEYS: &str = "bench:instructions";

/// A client named with this is counted with the statement watchdog off (ADR 0015's
/// tokio timers, forced by `LOCKS_POSTGRES_WATCHDOG=off` in the child).
const TIMERS: &str = "+timers";

/// The child: `cycles` cycles of client `name` after a warm-up, on a current-thread
/// runtime; `-otel` installs a tracing pipeline, `-metrics-sdk` the metrics SDK.
pub(crate) fn child(url: &str, name: &str, cycles: usize) -> Result<()> {
    // Before the manager is built: its instruments are made on the global provider then.
    let metrics = name.contains("-metrics-sdk").then(MetricsPipeline::install);
    let pipeline = name.contains("-otel").then(Pipeline::new);
    if let Some(pipeline) = &pipeline {
        tracing::subscriber::set_global_default(pipeline.subscriber())
            .map_err(|error| format!("could not install the subscriber: {error}"))?;
    }
    let db = Database::new(url)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // One key set for every client (they run one after another): a key named after
        // its client would be longer for `library-timeout` than for `library`, and the
        // library hashes each key, so the rows would differ by the names' lengths.
        let op = client(&db, name, KEYS, "lock-bench-instructions").await?;
        for n in 0..WARMUP + cycles {
            op.cycle(n).await?;
        }
        Ok::<_, BoxError>(())
    })?;
    if let Some(pipeline) = &pipeline {
        println!("spans exported: {}", pipeline.flush());
    }
    if let Some(metrics) = &metrics {
        println!("metric exports: {}", metrics.flush());
    }
    Ok(())
}

/// A counted client, its label, the client it is divided by, its limit and check name.
#[derive(Debug, Clone, Copy)]
struct Row {
    name: &'static str,
    label: &'static str,
    baseline: &'static str,
    target: Option<(f64, &'static str)>,
}

/// The targets: the library ÷ raw (issue 42's aim, docs/benchmarks.md); with
/// OpenTelemetry; metrics on, no provider ÷ off.
const LIBRARY: f64 = 1.15;
const TRACED: f64 = 1.5;
const NOOP: f64 = 1.02;

/// Scenario `id`'s rows (`library+timers`: ADR 0015's verdict is it against `library`).
fn rows(id: &str) -> Vec<Row> {
    let row = |name, baseline, limit: Option<f64>| Row {
        name,
        label: label(name),
        baseline,
        target: limit.map(|limit| (limit, label(name))),
    };
    if id == "metrics" {
        const OFF: &str = "library-metrics-off";
        let (mut on, mut sdk) = (
            row("library", OFF, None),
            row("library-metrics-sdk", OFF, None),
        );
        on.label = "library, metrics on, no meter provider installed (no-op instruments)";
        on.target = Some((NOOP, "metrics with no meter provider"));
        sdk.label = "library, metrics SDK installed (periodic reader, exporter that drops)";
        return vec![row(OFF, OFF, None), on, sdk];
    }
    let mut timers = row("library+timers", "raw", None);
    timers.label = "library, statement watchdog off (tokio timers, ADR 0015): acquire (no \
                    timeout) + release";
    let [shared, many] = ["raw-shared", "raw-many-each"];
    vec![
        row("raw", "raw", None),
        row("library", "raw", Some(LIBRARY)),
        row("library-timeout", "raw", Some(LIBRARY)),
        timers,
        row("library-fencing", "raw", None),
        row("library-keepalive-off", "raw", None),
        row("library-lease-off", "raw", None),
        row("library-otel", "raw", Some(TRACED)),
        row("library-timeout-otel", "raw", Some(TRACED)),
        row("library-otel-spans", "raw", None),
        row("library-timeout-otel-spans", "raw", None),
        row(shared, shared, None),
        row("library-shared", shared, None),
        row(many, many, None),
        row("library-many", many, None),
        row("raw-many", many, None),
    ]
}

pub(crate) fn run(url: &str, plan: &Plan, dir: &Path, id: &'static str) -> Result<Outcome> {
    let version = Command::new("valgrind").arg("--version").output();
    let version = version.map_err(|error| {
        format!(
            "valgrind is not installed ({error}): `cargo xtask bench` installs it, or \
             `apt-get install valgrind`"
        )
    })?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let started = std::time::Instant::now();
    let cycles = plan.pick(300, 2000);
    let dir = dir.join("callgrind");
    std::fs::create_dir_all(&dir)?;
    let rows = rows(id);
    // Per client: the totals of N and 2N cycles, and their difference over N.
    let mut counted = Vec::new();
    for row in &rows {
        let once = count(url, row.name, cycles, &dir)?;
        let twice = count(url, row.name, 2 * cycles, &dir)?;
        let per = twice.saturating_sub(once) as f64 / cycles as f64;
        counted.push((once, twice, per));
    }
    let per_cycle = |name: &str| {
        let missing = || format!("{name} is not counted");
        let index = rows.iter().position(|row| row.name == name);
        index.map(|i| counted[i].2).ok_or_else(missing)
    };
    let (title, note, (versus, header), decimals) = if id == "metrics" {
        (
            "7b. What the metrics cost the cycle: client instructions (callgrind)",
            "÷ off: against the same build with `metrics(false)`, measured in this run. The \
             SDK row counts the periodic reader's thread too.",
            ("metrics off", "÷ off"),
            3,
        )
    } else {
        (
            "7. Client instructions per acquire + release cycle (callgrind)",
            "÷ raw: against `raw`, except the shared-lock and `acquire_many` rows, each \
             against its own raw baseline (`raw-shared`, `raw-many-each`: the same \
             statements as scenarios 9 and 10's baselines); their targets are on \
             wall-clock time there.",
            ("raw", "÷ raw"),
            3,
        )
    };
    let fmt = |r: Option<f64>| r.map_or_else(|| "—".to_owned(), |r| format!("{r:.decimals$}×"));
    let mut out = Outcome::new(id, title);
    let took = started.elapsed().as_secs_f64();
    out.note(format!(
        "{version}; {WARMUP} warm-up cycles, then N = {cycles} and 2N; per cycle = \
         (total(2N) − total(N)) / N, every client thread counted. {took:.0} s."
    ));
    out.note(note);
    for (row, &(once, twice, per)) in rows.iter().zip(&counted) {
        let base = per_cycle(row.baseline)?;
        let ratio = ratio(per, base);
        let [target, result] = match row.target {
            Some((limit, words)) => out.gate(
                format!("{words}: instructions per cycle vs {versus}"),
                Cell::new(format!("{} ({per:.0} vs {base:.0})", fmt(ratio)), ratio),
                format!("≤ {limit}×"),
                ratio.is_some_and(|r| r <= limit),
            ),
            None if row.baseline == row.name => [Cell::from("baseline"), Cell::default()],
            None if row.baseline != rows[0].name => {
                [Cell::from(format!("÷ {}", row.baseline)), Cell::default()]
            }
            None => Default::default(),
        };
        let per = Cell::new(format!("{per:.0}"), per);
        out.row(row![
            "Variant" => row.label,
            "total, N cycles" => once,
            "total, 2N cycles" => twice,
            "per cycle" => per,
            header => Cell::new(fmt(ratio), ratio),
            "Target" => target,
            "Result" => result,
        ]);
    }
    Ok(out)
}

/// The total instruction count of one child run.
fn count(url: &str, name: &str, cycles: usize, dir: &Path) -> Result<u64> {
    let out = dir.join(format!("{name}-{cycles}.out"));
    let timers = name.strip_suffix(TIMERS);
    let mut valgrind = Command::new("valgrind");
    if timers.is_some() {
        valgrind.env("LOCKS_POSTGRES_WATCHDOG", "off");
    }
    let file = format!("--callgrind-out-file={}", out.display());
    let (client, count) = (timers.unwrap_or(name), cycles.to_string());
    let args = ["--count-instructions", client, "--cycles", &count];
    let output = valgrind
        .args(["--tool=callgrind", &file])
        .arg(std::env::current_exe()?)
        .args(args)
        .env(DATABASE_URL_ENV, url)
        .output()
        .map_err(|error| format!("could not run valgrind: {error}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr = stderr.trim();
        return Err(format!("callgrind run of `{name}` ({cycles} cycles) failed: {stderr}").into());
    }
    let text = std::fs::read_to_string(&out)
        .map_err(|error| format!("could not read {}: {error}", out.display()))?;
    totals(&text).ok_or_else(|| format!("no totals in {}", out.display()).into())
}

fn totals(text: &str) -> Option<u64> {
    let line = text.lines().find_map(|line| {
        (line.strip_prefix("totals:")).or_else(|| line.strip_prefix("summary:"))
    })?;
    line.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_read_and_every_baseline_is_counted() {
        let text = "version: 1\ncmd: x\nevents: Ir\nfl=(1) a.rs\n0 5\ntotals: 123456\n";
        assert_eq!(totals(text), Some(123_456));
        assert_eq!(
            (totals("summary: 42\n"), totals("events: Ir\n")),
            (Some(42), None)
        );
        let rows = [rows("instructions"), rows("metrics")];
        let counted = |rows: &[Row], row: &Row| rows.iter().any(|r| r.name == row.baseline);
        assert!(
            rows.iter()
                .all(|rows| rows.iter().all(|row| counted(rows, row)))
        );
    }
}
