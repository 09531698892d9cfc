//! Floor 1: the harness every scenario runs on: the sides take turns in rounds, the order
//! rotating from round to round so that none always runs first or last (whatever drifts
//! during a run, a cache, a frequency, the server's background work, hits every side
//! alike); a turn is a batch of timed calls after a warm-up, or a window of tasks looping
//! until a deadline; what a side measured is kept as a histogram of every sample plus each
//! batch's p50 (a "run"), so that sides compare run by run, neighbours in time. Then the
//! report: the scenario's table (its rows, the targets checked as PASS or MISS), its JSON
//! and its files ([`Outcome`]), and the markdown made of all of them.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::BoxError;
use crate::stats::{Latencies, as_f64, fmt_ns, fmt_ratio, median};

/// The order of `count` sides in round `round`: side `round mod count` first, then the
/// others in turn (two sides alternate: A B, B A, A B, …).
pub(crate) fn order(round: usize, count: usize) -> impl Iterator<Item = usize> {
    (0..count).map(move |step| (round + step) % count)
}

/// Runs `rounds` rounds in which each of `sides` sides takes one turn, in [`order`]:
/// `turn(round, side)`.
pub(crate) async fn rounds(
    rounds: usize,
    sides: usize,
    mut turn: impl AsyncFnMut(usize, usize) -> Result<(), BoxError>,
) -> Result<(), BoxError> {
    for round in 0..rounds {
        for side in order(round, sides) {
            turn(round, side).await?;
        }
    }
    Ok(())
}

/// Calls `op` until `end`, timing each call: how many calls it made, and their latencies.
pub(crate) async fn until(
    end: Instant,
    mut op: impl AsyncFnMut() -> Result<(), BoxError>,
) -> Result<(u64, Latencies), BoxError> {
    let mut latencies = Latencies::new();
    let mut ops = 0;
    while Instant::now() < end {
        let started = Instant::now();
        op().await?;
        latencies.record(started.elapsed());
        ops += 1;
    }
    Ok((ops, latencies))
}

/// Calls `op` until `end` without timing the calls (where reading the clock would weigh
/// on what is measured): how many calls it made, and no latencies.
pub(crate) async fn count(
    end: Instant,
    mut op: impl AsyncFnMut() -> Result<(), BoxError>,
) -> Result<(u64, Latencies), BoxError> {
    let mut ops = 0;
    while Instant::now() < end {
        op().await?;
        ops += 1;
    }
    Ok((ops, Latencies::new()))
}

/// What the tasks of one window did together.
#[derive(Debug)]
pub(crate) struct Window {
    pub(crate) ops: u64,
    pub(crate) elapsed: Duration,
    pub(crate) latencies: Latencies,
}

impl Window {
    /// Operations per second.
    pub(crate) fn rate(&self) -> f64 {
        as_f64(self.ops) / self.elapsed.as_secs_f64()
    }
}

/// Spawns `task(index)` for each of `tasks` tasks (each loops until a deadline it was
/// given, [`until`] for one) and adds up their operations and latencies.
pub(crate) async fn window<Fut>(
    tasks: usize,
    task: impl Fn(usize) -> Fut,
) -> Result<Window, BoxError>
where
    Fut: Future<Output = Result<(u64, Latencies), BoxError>> + Send + 'static,
{
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for index in 0..tasks {
        running.spawn(task(index));
    }
    let (mut ops, mut latencies) = (0, Latencies::new());
    while let Some(joined) = running.join_next().await {
        let (done, measured) = joined??;
        ops += done;
        latencies.merge(&measured);
    }
    let elapsed = started.elapsed();
    Ok(Window {
        ops,
        elapsed,
        latencies,
    })
}

/// Warms each of `count` sides up with `warmup` calls, then runs `rounds` rounds of one
/// batch of `batch` timed calls per side, in [`order`]: `call(side, n)`. What each side's
/// batches measured.
pub(crate) async fn batches(
    count: usize,
    (warmup, rounds_, batch): (usize, usize, usize),
    mut call: impl AsyncFnMut(usize, usize) -> Result<(), BoxError>,
) -> Result<Vec<Batches>, BoxError> {
    for side in 0..count {
        for n in 0..warmup {
            call(side, n).await?;
        }
    }
    let mut sides: Vec<Batches> = (0..count).map(|_| Batches::default()).collect();
    rounds(rounds_, count, async |_, side| {
        let mut latencies = Latencies::new();
        for n in 0..batch {
            let started = Instant::now();
            call(side, n).await?;
            latencies.record(started.elapsed());
        }
        sides[side].add(&latencies);
        Ok(())
    })
    .await?;
    Ok(sides)
}

/// What the batches (runs) of one side measured.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    /// Every sample of every batch.
    pub(crate) pooled: Latencies,
    /// The p50 of each batch, in nanoseconds, in the order they ran.
    pub(crate) runs: Vec<u64>,
}

impl Batches {
    /// Adds one run.
    pub(crate) fn add(&mut self, run: &Latencies) {
        self.runs.push(run.p50());
        self.pooled.merge(run);
    }

    /// Against `base`, the cells a table shows (p50 as the median run, the runs' spread,
    /// p99, the ratio and its spread), the ratios, and the JSON.
    pub(crate) fn against(&self, base: &Self) -> (Vec<String>, Option<Ratios>, Value) {
        let ratios = self.ratios_to(base);
        let (ratio, spread) = Ratios::fmt(ratios);
        let cells = vec![
            fmt_ns(self.median()),
            self.spread(),
            fmt_ns(self.pooled.p99()),
            ratio,
            spread,
        ];
        let json = json!({
            "run_p50s_ns": self.runs,
            "latency": self.pooled.to_json(),
            "ratio_median": ratios.map(|r| r.median),
            "ratio_min": ratios.map(|r| r.low),
            "ratio_max": ratios.map(|r| r.high),
        });
        (cells, ratios, json)
    }

    /// The median of the runs, in nanoseconds.
    pub(crate) fn median(&self) -> u64 {
        let values: Vec<f64> = self.runs.iter().map(|&v| as_f64(v)).collect();
        median(&values).round() as u64
    }

    /// The fastest run's p50, in nanoseconds (0 without runs).
    pub(crate) fn best(&self) -> u64 {
        self.runs.iter().copied().min().unwrap_or(0)
    }

    /// The runs' spread, `183 µs–201 µs`, or `—`.
    pub(crate) fn spread(&self) -> String {
        match (self.runs.iter().min(), self.runs.iter().max()) {
            (Some(&low), Some(&high)) => format!("{}–{}", fmt_ns(low), fmt_ns(high)),
            _ => "—".to_owned(),
        }
    }

    /// These runs over `base`'s, run by run (the runs of one round are neighbours in time):
    /// the median of the ratios and their (min, max); `None` without runs.
    pub(crate) fn ratios_to(&self, base: &Self) -> Option<Ratios> {
        let values: Vec<f64> = self
            .runs
            .iter()
            .zip(&base.runs)
            .filter(|(_, b)| **b > 0)
            .map(|(l, b)| as_f64(*l) / as_f64(*b))
            .collect();
        Ratios::of(&values)
    }
}

/// Run-by-run ratios of one side to another.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ratios {
    pub(crate) median: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
}

impl Ratios {
    /// The median, least and greatest of `values`; `None` when there are none.
    pub(crate) fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let low = values.iter().copied().fold(f64::INFINITY, f64::min);
        let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Self {
            median: median(values),
            low,
            high,
        })
    }

    /// `1.07×` and `1.02–1.11×`; `—` twice for `None`.
    pub(crate) fn fmt(ratios: Option<Self>) -> (String, String) {
        let range = |r: Self| format!("{:.2}–{:.2}×", r.low, r.high);
        let median = fmt_ratio(ratios.map(|r| r.median));
        (median, ratios.map_or_else(|| "—".to_owned(), range))
    }
}

/// The cells of a table row, each written with `to_string`.
macro_rules! cells {
    ($($cell:expr),* $(,)?) => { vec![$(ToString::to_string(&$cell)),*] };
}
pub(crate) use cells;

/// One scenario's results: its table (a titled section with notes), its targets, its
/// JSON and the files to write beside the results (the charts).
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The key of this scenario in the JSON file.
    pub(crate) id: &'static str,
    title: String,
    notes: Vec<String>,
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    pub(crate) checks: Vec<Check>,
    pub(crate) json: Value,
    pub(crate) files: Vec<(&'static str, String)>,
}

impl Outcome {
    /// An empty table under `title` with columns `header`.
    pub(crate) fn new(id: &'static str, title: impl Into<String>, header: &[&'static str]) -> Self {
        Self {
            id,
            title: title.into(),
            notes: Vec::new(),
            header: header.to_vec(),
            rows: Vec::new(),
            checks: Vec::new(),
            json: Value::Null,
            files: Vec::new(),
        }
    }

    /// A note under the title.
    pub(crate) fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Checks a target: `name`, what was `measured`, the `limit`, whether it `pass`ed.
    /// The cells a row shows for it: the limit, and PASS or MISS.
    pub(crate) fn gate(
        &mut self,
        name: impl Into<String>,
        measured: impl Into<String>,
        limit: impl Into<String>,
        pass: bool,
    ) -> [String; 2] {
        let target = limit.into();
        let cells = [target.clone(), verdict(pass).to_owned()];
        let (name, measured) = (name.into(), measured.into());
        self.checks.push(Check {
            name,
            measured,
            target,
            pass,
        });
        cells
    }

    /// With the JSON.
    pub(crate) fn with(mut self, json: Value) -> Self {
        self.json = json;
        self
    }
}

/// One target and whether it was met.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) name: String,
    pub(crate) measured: String,
    pub(crate) target: String,
    pub(crate) pass: bool,
}

impl Check {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "target": self.name,
            "measured": self.measured,
            "limit": self.target,
            "pass": self.pass,
        })
    }
}

pub(crate) fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "MISS" }
}

/// A markdown table; `|` inside cells is escaped.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<String> = cells.map(|c| c.replace('|', "\\|")).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut out = line(&mut header.iter().copied());
    let _ = writeln!(out, "|{}|", vec![" --- "; header.len()].join("|"));
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// All sections, then the targets.
pub(crate) fn markdown(heading: &str, outcomes: &[Outcome]) -> String {
    let mut out = format!("{heading}\n");
    for section in outcomes {
        let _ = writeln!(out, "\n### {}\n", section.title);
        for note in &section.notes {
            let _ = writeln!(out, "{note}\n");
        }
        out.push_str(&table(&section.header, &section.rows));
    }
    let checks: Vec<&Check> = outcomes.iter().flat_map(|o| &o.checks).collect();
    if !checks.is_empty() {
        let _ = writeln!(out, "\n### Targets\n");
        let rows: Vec<Vec<String>> = checks
            .iter()
            .map(|c| cells![c.name, c.measured, c.target, verdict(c.pass)])
            .collect();
        out.push_str(&table(&["Target", "Measured", "Limit", "Result"], &rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_rotates_from_round_to_round() {
        let orders: Vec<Vec<usize>> = (0..4).map(|round| order(round, 3).collect()).collect();
        assert_eq!(
            orders,
            [vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1], vec![0, 1, 2]]
        );
        let pairs: Vec<Vec<usize>> = (0..2).map(|round| order(round, 2).collect()).collect();
        assert_eq!(pairs, [vec![0, 1], vec![1, 0]]);
    }

    #[test]
    fn ratios_are_taken_run_by_run() {
        let side = |runs: &[u64]| Batches {
            pooled: Latencies::new(),
            runs: runs.to_vec(),
        };
        let ratios = side(&[110, 300, 120])
            .ratios_to(&side(&[100, 200, 100]))
            .expect("runs");
        assert!((ratios.median - 1.2).abs() < 1e-9);
        assert!((ratios.low - 1.1).abs() < 1e-9);
        assert!((ratios.high - 1.5).abs() < 1e-9);
        assert_eq!(Ratios::fmt(Some(ratios)).0, "1.20×");
        assert_eq!(side(&[]).spread(), "—");
        assert_eq!(side(&[1_500, 900]).spread(), "900 ns–1.50 µs");
        assert_eq!(side(&[1, 2, 4]).median(), 2);
        assert_eq!(side(&[3, 2, 4]).best(), 2);
    }

    #[test]
    fn a_gate_is_a_check_two_cells_and_a_markdown_row() {
        let text = table(&["a", "b"], &[vec!["1".into(), "x|y".into()]]);
        assert_eq!(text, "| a | b |\n| --- | --- |\n| 1 | x\\|y |\n");
        let mut outcome = Outcome::new("x", "X", &["a"]);
        let cells = outcome.gate("fast", "1.2×", "≤ 1.1×", false);
        assert_eq!(cells, ["≤ 1.1×", "MISS"]);
        assert_eq!(outcome.checks.len(), 1);
        assert!(markdown("# h", &[outcome]).contains("| fast | 1.2× | ≤ 1.1× | MISS |"));
    }
}
