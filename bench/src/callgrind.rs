//! Floor 2: client instructions per cycle (`instructions`, `metrics`): the bench runs
//! itself under `valgrind --tool=callgrind` in a child mode ([`child`]) that makes one
//! client of [`crate::clients`] and runs N cycles, then 2N; the difference over N is a
//! cycle with start-up and exit subtracted. Every thread of the child counts.

use std::path::Path;
use std::process::Command;

use crate::clients::client;
use crate::db::Database;
use crate::harness::{Cell, Outcome, cells};
use crate::otel::{MetricsPipeline, Pipeline};
use crate::stats::{as_f64, ratio};
use crate::{BoxError, DATABASE_URL_ENV, Plan};

/// Cycles before the counted ones, in both runs.
const WARMUP: usize = 50;

/// A row named after a client and this is that client counted with the statement
/// watchdog off: its statements and monitor on tokio timers (ADR 0015's fallback, which
/// `LOCKS_POSTGRES_WATCHDOG=off` forces in the child), and no watchdog thread.
pub(crate) const TIMERS: &str = "+timers";

/// The child: `cycles` cycles of the client `name` after a warm-up, on a current-thread
/// runtime; `-otel` in the name installs a tracing pipeline, `-metrics-sdk` the metrics SDK.
pub(crate) fn child(url: &str, name: &str, cycles: usize) -> Result<(), BoxError> {
    // Installed before the manager is built: its instruments are made on the global
    // meter provider as it is then.
    let metrics = name.contains("-metrics-sdk").then(MetricsPipeline::install);
    let pipeline = name.contains("-otel").then(Pipeline::new);
    if let Some(pipeline) = &pipeline {
        tracing::subscriber::set_global_default(pipeline.subscriber())
            .map_err(|error| format!("could not install the subscriber: {error}"))?;
    }
    let db = Database::new(url)?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let prefix = format!("bench:instructions:{name}");
            let op = client(&db, name, &prefix, "lock-bench-instructions").await?;
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

/// One counted client of a scenario: its name, what the table calls it, the client it is
/// divided by, and its target (with the words its check starts with).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) label: &'static str,
    pub(crate) baseline: &'static str,
    pub(crate) target: Option<(f64, &'static str)>,
}

/// Counts every row's client and makes the scenario's table: `versus` names the usual
/// baseline in the check and the header (`raw`, `off`), `decimals` the ratios' precision.
pub(crate) fn scenario(
    url: &str,
    plan: &Plan,
    dir: &Path,
    (id, title, versus, decimals): (&'static str, &str, &str, usize),
    spec: &[Row],
    notes: Vec<String>,
) -> Result<Outcome, BoxError> {
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
    // Per client: the totals of N and 2N cycles, and their difference over N.
    let mut counted = Vec::new();
    for row in spec {
        if !spec.iter().any(|r| r.name == row.baseline) {
            return Err(
                format!("{}: its baseline {} is not counted", row.name, row.baseline).into(),
            );
        }
        let once = count(url, row.name, cycles, &dir)?;
        let twice = count(url, row.name, 2 * cycles, &dir)?;
        counted.push((
            once,
            twice,
            as_f64(twice.saturating_sub(once)) / as_f64(cycles as u64),
        ));
    }
    let per_cycle = |name: &str| {
        let index = spec.iter().position(|row| row.name == name);
        index.map_or(0.0, |i| counted[i].2)
    };
    let fmt = |r: Option<f64>| r.map_or_else(|| "—".to_owned(), |r| format!("{r:.decimals$}×"));
    let ratio_header = if versus == "raw" { "÷ raw" } else { "÷ off" };
    let header = [
        "Variant",
        "total, N cycles",
        "total, 2N cycles",
        "per cycle",
        ratio_header,
        "Target",
        "Result",
    ];
    let mut out = Outcome::new(id, title, &header);
    out.note(format!(
        "{version}; {WARMUP} warm-up cycles, then N = {cycles} and 2N; per cycle = \
         (total(2N) − total(N)) / N, every client thread counted. {:.0} s.",
        started.elapsed().as_secs_f64()
    ));
    notes.into_iter().for_each(|note| out.note(note));
    for (row, &(once, twice, per)) in spec.iter().zip(&counted) {
        let base = per_cycle(row.baseline);
        let ratio = ratio(per, base);
        let [target, result] = match row.target {
            Some((limit, words)) => out.gate(
                format!("{words}: instructions per cycle vs {versus}"),
                Cell::new(format!("{} ({per:.0} vs {base:.0})", fmt(ratio)), ratio),
                format!("≤ {limit}×"),
                ratio.is_some_and(|r| r <= limit),
            ),
            None if row.baseline == row.name => [Cell::from("baseline"), Cell::default()],
            None if row.baseline != spec[0].name => {
                [Cell::from(format!("÷ {}", row.baseline)), Cell::default()]
            }
            None => Default::default(),
        };
        out.row(cells![
            row.label,
            once,
            twice,
            Cell::new(format!("{per:.0}"), per),
            Cell::new(fmt(ratio), ratio),
            target,
            result
        ]);
    }
    Ok(out)
}

/// The total instruction count of one child run, from its callgrind output file.
fn count(url: &str, name: &str, cycles: usize, dir: &Path) -> Result<u64, BoxError> {
    let out = dir.join(format!("{name}-{cycles}.out"));
    let (client, timers) = match name.strip_suffix(TIMERS) {
        Some(client) => (client, true),
        None => (name, false),
    };
    let mut valgrind = Command::new("valgrind");
    if timers {
        valgrind.env("LOCKS_POSTGRES_WATCHDOG", "off");
    }
    let output = valgrind
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(std::env::current_exe()?)
        .args([
            "--count-instructions",
            client,
            "--cycles",
            &cycles.to_string(),
        ])
        .env(DATABASE_URL_ENV, url)
        .output()
        .map_err(|error| format!("could not run valgrind: {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "callgrind run of `{name}` ({cycles} cycles) failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let text = std::fs::read_to_string(&out)
        .map_err(|error| format!("could not read {}: {error}", out.display()))?;
    totals(&text).ok_or_else(|| format!("no totals in {}", out.display()).into())
}

/// The `totals:` (or `summary:`) line of a callgrind output file.
fn totals(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| {
            line.strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_read_from_callgrind_output() {
        let text = "version: 1\ncmd: x\nevents: Ir\nfl=(1) a.rs\n0 5\ntotals: 123456\n";
        assert_eq!(totals(text), Some(123_456));
        assert_eq!(totals("summary: 42\n"), Some(42));
        assert_eq!(totals("events: Ir\n"), None);
    }
}
