//! Floor 1: the harness every scenario runs on. Sides take turns in rounds, the order
//! rotating ([`order`]); a turn is a batch of timed calls after a warm-up ([`batches`]) or
//! a window of tasks looping until a deadline ([`window`]); a side keeps every sample and
//! each batch's p50 (a run, [`Batches`]). Then the report, written once ([`Outcome`]):
//! rows of [`Cell`]s (markdown shows their text, the JSON their figures) and PASS/MISS.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::BoxError;
use crate::stats::{Latencies, as_f64, fmt_bytes, fmt_ns, fmt_rate, fmt_ratio, median};

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

/// Calls `op` until `end`, and at least `min` times: how many calls it made, and (when
/// `timed`; not where reading the clock would weigh on what is measured) their latencies.
pub(crate) async fn until(
    end: Instant,
    min: u64,
    timed: bool,
    mut op: impl AsyncFnMut() -> Result<(), BoxError>,
) -> Result<(u64, Latencies), BoxError> {
    let (mut ops, mut latencies) = (0, Latencies::new());
    while ops < min || Instant::now() < end {
        let started = timed.then(Instant::now);
        op().await?;
        if let Some(started) = started {
            latencies.record(started.elapsed());
        }
        ops += 1;
    }
    Ok((ops, latencies))
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
    /// p99, the ratio and its spread; the JSON gets the runs and the ratios' range), and
    /// the ratios.
    pub(crate) fn against(&self, base: &Self) -> (Vec<Cell>, Option<Ratios>) {
        let ratios = self.ratios_to(base);
        let (ratio, spread) = Ratios::fmt(ratios);
        let cells = vec![
            Cell::ns(self.median()),
            self.spread(),
            Cell::ns(self.pooled.p99()),
            Cell::new(ratio, ratios.map(|r| r.median)),
            Cell::new(spread, ratios.map(|r| vec![r.low, r.high])),
        ];
        (cells, ratios)
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

    /// The runs' spread, `183 µs–201 µs`, or `—`; the JSON gets every run's p50.
    pub(crate) fn spread(&self) -> Cell {
        let text = match (self.runs.iter().min(), self.runs.iter().max()) {
            (Some(&low), Some(&high)) => format!("{}–{}", fmt_ns(low), fmt_ns(high)),
            _ => "—".to_owned(),
        };
        Cell::new(text, self.runs.clone())
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

/// A cell of a table: the text it shows, and what the JSON holds for it: the figure
/// itself where the text shows one (durations in nanoseconds, sizes in bytes, rates per
/// second, ratios as numbers, a spread as its values), else the text.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Cell {
    pub(crate) text: String,
    pub(crate) value: Value,
}

impl Cell {
    pub(crate) fn new(text: impl Into<String>, value: impl Into<Value>) -> Self {
        let (text, value) = (text.into(), value.into());
        Self { text, value }
    }

    /// A duration: `183 µs`, and its nanoseconds.
    pub(crate) fn ns(nanos: u64) -> Self {
        Self::new(fmt_ns(nanos), nanos)
    }

    /// A ratio: `1.07×` (`—` for `None`), and the number.
    pub(crate) fn ratio(ratio: Option<f64>) -> Self {
        Self::new(fmt_ratio(ratio), ratio)
    }

    /// Operations per second: `12 345/s`, and the number.
    pub(crate) fn rate(per_second: f64) -> Self {
        Self::new(fmt_rate(per_second), per_second)
    }

    /// Bytes: `1 234 B`, and the number.
    pub(crate) fn bytes(bytes: f64) -> Self {
        Self::new(fmt_bytes(bytes), bytes)
    }
}

/// Texts are their own value; counts are numbers.
macro_rules! cell_from {
    ($($text:ty),*; $($count:ty),*) => {
        $(impl From<$text> for Cell {
            fn from(text: $text) -> Self { Self::new(text.to_string(), text.to_string()) }
        })*
        $(impl From<$count> for Cell {
            fn from(count: $count) -> Self { Self::new(count.to_string(), count) }
        })*
    };
}
cell_from!(String, &str, &String; u64, usize, i64);

/// The cells of a table row, each [`Cell::from`] its value.
macro_rules! cells {
    ($($cell:expr),* $(,)?) => { vec![$($crate::harness::Cell::from($cell)),*] };
}
pub(crate) use cells;

/// One scenario's results: its table (a titled section with notes), its targets, what
/// its JSON holds beyond them, and the files to write beside the results (the charts).
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The key of this scenario in the JSON file.
    pub(crate) id: &'static str,
    title: String,
    notes: Vec<String>,
    header: Vec<&'static str>,
    rows: Vec<Vec<Cell>>,
    pub(crate) checks: Vec<Check>,
    /// Fields of the JSON beyond the table (what the table does not show).
    extra: Value,
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
            extra: Value::Null,
            files: Vec::new(),
        }
    }

    /// A note under the title.
    pub(crate) fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub(crate) fn row(&mut self, cells: Vec<Cell>) {
        self.rows.push(cells);
    }

    /// Checks a target: `name`, what was `measured`, the `limit`, whether it `pass`ed.
    /// The cells a row shows for it: the limit, and PASS or MISS.
    pub(crate) fn gate(
        &mut self,
        name: impl Into<String>,
        measured: impl Into<Cell>,
        limit: impl Into<String>,
        pass: bool,
    ) -> [Cell; 2] {
        let (limit, measured) = (limit.into(), measured.into());
        let cells = [Cell::from(&limit), Cell::from(verdict(pass))];
        let value = Some(measured.value).filter(|v| !v.is_string());
        let (target, measured) = (name.into(), measured.text);
        self.checks.push(Check {
            target,
            measured,
            value,
            limit,
            pass,
        });
        cells
    }

    /// With `extra`'s fields in the JSON beside the table's.
    pub(crate) fn with(mut self, extra: Value) -> Self {
        self.extra = extra;
        self
    }

    /// The JSON: the title, the notes, one object a row keyed by the header (cells that
    /// show nothing left out), the targets, and the extra fields.
    pub(crate) fn to_json(&self) -> Value {
        let row = |cells: &Vec<Cell>| -> Map<String, Value> {
            (self.header.iter().zip(cells))
                .filter(|(_, cell)| !cell.text.is_empty())
                .map(|(name, cell)| ((*name).to_owned(), cell.value.clone()))
                .collect()
        };
        let mut json = json!({
            "title": self.title,
            "notes": self.notes,
            "rows": self.rows.iter().map(row).collect::<Vec<_>>(),
            "targets": self.checks,
        });
        if let (Some(json), Value::Object(extra)) = (json.as_object_mut(), &self.extra) {
            json.extend(extra.clone());
        }
        json
    }
}

/// One target and whether it was met, as the JSON holds it: what was measured as its
/// text, and as its figure where it has one (`value`).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Check {
    pub(crate) target: String,
    pub(crate) measured: String,
    pub(crate) value: Option<Value>,
    pub(crate) limit: String,
    pub(crate) pass: bool,
}

pub(crate) fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "MISS" }
}

/// A markdown table; `|` inside cells is escaped.
pub(crate) fn table(header: &[&str], rows: &[Vec<Cell>]) -> String {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<String> = cells.map(|c| c.replace('|', "\\|")).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut out = line(&mut header.iter().copied());
    let _ = writeln!(out, "|{}|", vec![" --- "; header.len()].join("|"));
    for row in rows {
        out.push_str(&line(&mut row.iter().map(|cell| cell.text.as_str())));
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
        let rows: Vec<Vec<Cell>> = checks
            .iter()
            .map(|c| cells![&c.target, &c.measured, &c.limit, verdict(c.pass)])
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
        assert_eq!(side(&[]).spread().text, "—");
        let spread = side(&[1_500, 900]).spread();
        assert_eq!(
            (spread.text.as_str(), spread.value),
            ("900 ns–1.50 µs", json!([1_500, 900]))
        );
        assert_eq!(side(&[1, 2, 4]).median(), 2);
        assert_eq!(side(&[3, 2, 4]).best(), 2);
    }

    #[test]
    fn a_gate_is_a_check_two_cells_and_a_markdown_row() {
        let text = table(&["a", "b"], &[cells!["1", "x|y"]]);
        assert_eq!(text, "| a | b |\n| --- | --- |\n| 1 | x\\|y |\n");
        let mut outcome = Outcome::new("x", "X", &["a"]);
        let cells = outcome.gate("fast", "1.2×", "≤ 1.1×", false);
        assert_eq!(cells.map(|c| c.text), ["≤ 1.1×", "MISS"]);
        assert_eq!(outcome.checks.len(), 1);
        assert!(markdown("# h", &[outcome]).contains("| fast | 1.2× | ≤ 1.1× | MISS |"));
    }

    #[test]
    fn the_json_holds_each_row_by_the_header_with_its_figures() {
        let mut outcome = Outcome::new("x", "X", &["Client", "p50", "÷ raw", "n", "Result"]);
        let [_, result] = outcome.gate("fast", Cell::ratio(Some(1.5)), "≤ 1.1×", false);
        outcome.row(cells!["raw", Cell::ns(1_500), Cell::ratio(None), 3_u64, ""]);
        outcome.row(cells![
            "lib",
            Cell::ns(900),
            Cell::ratio(Some(0.6)),
            2_usize,
            result
        ]);
        let outcome = outcome.with(json!({ "more": 1 }));
        let json = outcome.to_json();
        assert_eq!(
            json["rows"],
            json!([
                { "Client": "raw", "p50": 1_500, "÷ raw": null, "n": 3 },
                { "Client": "lib", "p50": 900, "÷ raw": 0.6, "n": 2, "Result": "MISS" },
            ])
        );
        assert_eq!(json["targets"][0]["value"], json!(1.5));
        assert_eq!(json["targets"][0]["measured"], "1.50×");
        assert_eq!(
            (json["title"].as_str(), &json["more"]),
            (Some("X"), &json!(1))
        );
        assert!(markdown("# h", &[outcome]).contains("| lib | 900 ns | 0.60× | 2 | MISS |"));
    }
}
