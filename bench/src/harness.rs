//! Floor 1: the harness every scenario runs on. Sides take turns in rounds ([`order`]), a
//! turn a batch of timed calls ([`batches`]) or a window of tasks ([`window`]); then the
//! report ([`Outcome`]): rows of [`Cell`]s (markdown shows their text, the JSON their
//! figures) and PASS/MISS.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::Result;
use crate::stats::{Latencies, fmt_bytes, fmt_ns, fmt_rate, fmt_ratio, median};

/// The order of `count` sides in round `round`: side `round mod count` first, then the
/// others in turn (two sides alternate: A B, B A, A B, …).
pub(crate) fn order(round: usize, count: usize) -> impl Iterator<Item = usize> {
    (0..count).map(move |step| (round + step) % count)
}

/// `rounds` rounds in which each of `sides` sides takes one turn, in [`order`]: what each
/// side's turns gave, round by round.
pub(crate) async fn rounds<T>(
    rounds: usize,
    sides: usize,
    mut turn: impl AsyncFnMut(usize, usize) -> Result<T>,
) -> Result<Vec<Vec<T>>> {
    let mut gave: Vec<Vec<T>> = (0..sides).map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for side in order(round, sides) {
            gave[side].push(turn(round, side).await?);
        }
    }
    Ok(gave)
}

/// [`rounds`] of two sides.
pub(crate) async fn alternate<T>(
    rounds: usize,
    turn: impl AsyncFnMut(usize, usize) -> Result<T>,
) -> Result<[Vec<T>; 2]> {
    let sides = self::rounds(rounds, 2, turn).await?;
    Ok(sides.try_into().map_err(|_| "not two sides")?)
}

/// Calls `op` until `end`, and at least `min` times: how many calls it made, and (when
/// `timed`; not where reading the clock would weigh on what is measured) their latencies.
pub(crate) async fn until(
    end: Instant,
    min: u64,
    timed: bool,
    mut op: impl AsyncFnMut() -> Result<()>,
) -> Result<(u64, Latencies)> {
    let (mut ops, mut latencies) = (0, Latencies::default());
    while ops < min || Instant::now() < end {
        match timed {
            true => latencies.time(&mut op).await?,
            false => op().await?,
        }
        ops += 1;
    }
    Ok((ops, latencies))
}

#[derive(Debug, Default)]
pub(crate) struct Window {
    pub(crate) ops: u64,
    pub(crate) elapsed: Duration,
    pub(crate) latencies: Latencies,
}

impl Window {
    pub(crate) fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Spawns `task(index)` for each of `tasks` tasks (each looping until a deadline, as
/// [`until`]) and adds up their operations and latencies.
pub(crate) async fn window<Fut>(tasks: usize, task: impl Fn(usize) -> Fut) -> Result<Window>
where
    Fut: Future<Output = Result<(u64, Latencies)>> + Send + 'static,
{
    let started = Instant::now();
    let mut running: tokio::task::JoinSet<_> = (0..tasks).map(task).collect();
    let mut window = Window::default();
    while let Some(joined) = running.join_next().await {
        let (ops, latencies) = joined??;
        window.ops += ops;
        window.latencies.merge(&latencies);
    }
    window.elapsed = started.elapsed();
    Ok(window)
}

/// `rounds` rounds of one [`window`] a side of two, `length` long, task `index` of side
/// `side` being `task(side, index, end)`: the rates of each side's windows.
pub(crate) async fn rates<Fut>(
    rounds: usize,
    length: Duration,
    tasks: usize,
    task: impl Fn(usize, usize, Instant) -> Fut,
) -> Result<[Vec<f64>; 2]>
where
    Fut: Future<Output = Result<(u64, Latencies)>> + Send + 'static,
{
    alternate(rounds, async |_, side| {
        let end = Instant::now() + length;
        Ok(window(tasks, |index| task(side, index, end)).await?.rate())
    })
    .await
}

/// `warmup` calls of each of `count` sides, then `rounds` rounds of one batch of `batch`
/// timed calls a side: `call(side, n)`.
pub(crate) async fn batches(
    count: usize,
    (warmup, rounds_, batch): (usize, usize, usize),
    mut call: impl AsyncFnMut(usize, usize) -> Result<()>,
) -> Result<Vec<Batches>> {
    for side in 0..count {
        for n in 0..warmup {
            call(side, n).await?;
        }
    }
    let runs = rounds(rounds_, count, async |_, side| {
        Latencies::timed(0..batch, async |n| call(side, n).await).await
    })
    .await?;
    Ok(runs.iter().map(|runs| Batches::of(runs)).collect())
}

/// What the batches (runs) of one side measured: every sample, and each run's p50 in
/// the order they ran.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    pub(crate) pooled: Latencies,
    pub(crate) runs: Vec<u64>,
}

impl Batches {
    pub(crate) fn of(runs: &[Latencies]) -> Self {
        let (pooled, runs) = (Latencies::merged(runs), runs.iter().map(Latencies::p50));
        Self {
            pooled,
            runs: runs.collect(),
        }
    }

    pub(crate) fn median(&self) -> u64 {
        median(self.runs.iter().map(|&v| v as f64)).round() as u64
    }

    /// The fastest run's p50 (0 without runs).
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

    /// These runs over `base`'s, run by run (a round's runs are neighbours in time).
    pub(crate) fn ratios_to(&self, base: &Self) -> Option<Ratios> {
        let pairs = self.runs.iter().zip(&base.runs).filter(|(_, b)| **b > 0);
        Ratios::of(
            &pairs
                .map(|(l, b)| *l as f64 / *b as f64)
                .collect::<Vec<_>>(),
        )
    }
}

/// Ratios of one side to another: their median, least and greatest.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ratios {
    pub(crate) median: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
}

impl Ratios {
    pub(crate) fn of(values: &[f64]) -> Option<Self> {
        let low = values.iter().copied().reduce(f64::min)?;
        let high = values.iter().copied().fold(low, f64::max);
        let median = median(values.iter().copied());
        Some(Self { median, low, high })
    }

    /// `1.07×` and `1.02–1.11×`; `—` twice for `None`.
    pub(crate) fn fmt(ratios: Option<Self>) -> (String, String) {
        let range = |r: Self| format!("{:.2}–{:.2}×", r.low, r.high);
        let median = fmt_ratio(ratios.map(|r| r.median));
        (median, ratios.map_or_else(|| "—".to_owned(), range))
    }
}

/// A cell of a table: the text it shows, and what the JSON holds: the figure itself
/// (durations in ns, sizes in bytes, rates per second), else the text.
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

    pub(crate) fn ns(nanos: u64) -> Self {
        Self::new(fmt_ns(nanos), nanos)
    }

    pub(crate) fn ratio(ratio: Option<f64>) -> Self {
        Self::new(fmt_ratio(ratio), ratio)
    }

    pub(crate) fn rate(per_second: f64) -> Self {
        Self::new(fmt_rate(per_second), per_second)
    }

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

/// A table row: its cells by column.
pub(crate) type Row = Vec<(&'static str, Cell)>;

/// A [`Row`], each cell [`Cell::from`] its value.
macro_rules! row {
    ($($column:expr => $cell:expr),* $(,)?) => {
        vec![$(($column, $crate::harness::Cell::from($cell))),*]
    };
}
pub(crate) use row;

/// One scenario's results: its table (titled, with notes; its columns those of its
/// rows, in the order met), its targets, its JSON beyond them, and its charts.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) id: &'static str,
    title: String,
    notes: Vec<String>,
    header: Vec<&'static str>,
    rows: Vec<Row>,
    pub(crate) checks: Vec<Check>,
    extra: Map<String, Value>,
    pub(crate) files: Vec<(&'static str, String)>,
}

impl Outcome {
    pub(crate) fn new(id: &'static str, title: impl Into<String>) -> Self {
        let title = title.into();
        Self {
            id,
            title,
            ..Self::default()
        }
    }

    pub(crate) fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub(crate) fn row(&mut self, cells: Row) {
        for (column, _) in &cells {
            if !self.header.contains(column) {
                self.header.push(column);
            }
        }
        self.rows.push(cells);
    }

    /// The cells of each row in the header's order (empty where a row has none).
    fn cells(&self) -> impl Iterator<Item = Vec<&Cell>> {
        self.rows.iter().map(move |row| {
            let cell = |column| row.iter().find(|c| c.0 == column).map_or(&EMPTY, |c| &c.1);
            self.header.iter().map(|column| cell(*column)).collect()
        })
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
        let check = Check {
            target,
            measured,
            value,
            limit,
            pass,
        };
        self.checks.push(check);
        cells
    }

    /// With `extra`'s fields in the JSON beside the table's.
    pub(crate) fn with(mut self, extra: Value) -> Self {
        if let Value::Object(extra) = extra {
            self.extra = extra;
        }
        self
    }

    /// The JSON: title, notes, one object a row (empty cells left out), targets, extra.
    pub(crate) fn to_json(&self) -> Value {
        let row = |cells: Vec<&Cell>| -> Map<String, Value> {
            (self.header.iter().zip(cells))
                .filter(|(_, cell)| !cell.text.is_empty())
                .map(|(name, cell)| ((*name).to_owned(), cell.value.clone()))
                .collect()
        };
        let mut json = Map::new();
        json.insert("title".into(), json!(self.title));
        json.insert("notes".into(), json!(self.notes));
        json.insert("rows".into(), self.cells().map(row).collect());
        json.insert("targets".into(), json!(self.checks));
        json.extend(self.extra.clone());
        Value::Object(json)
    }
}

static EMPTY: Cell = Cell {
    text: String::new(),
    value: Value::Null,
};

/// One target and whether it was met: what was measured, and its figure if it has one.
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

/// A markdown table of `rows` of texts; `|` inside cells is escaped.
fn table<'a>(header: &[&str], rows: impl Iterator<Item = Vec<&'a str>>) -> String {
    let line = |cells: Vec<&str>| {
        let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut out = line(header.to_vec());
    let _ = writeln!(out, "|{}|", vec![" --- "; header.len()].join("|"));
    rows.for_each(|row| out.push_str(&line(row)));
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
        let rows = section
            .cells()
            .map(|row| row.iter().map(|c| c.text.as_str()).collect());
        out.push_str(&table(&section.header, rows));
    }
    let checks: Vec<&Check> = outcomes.iter().flat_map(|o| &o.checks).collect();
    if !checks.is_empty() {
        let _ = writeln!(out, "\n### Targets\n");
        let rows = (checks.iter())
            .map(|c| vec![c.target.as_str(), &c.measured, &c.limit, verdict(c.pass)]);
        out.push_str(&table(&["Target", "Measured", "Limit", "Result"], rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_rotates_from_round_to_round() {
        let orders: Vec<Vec<usize>> = (0..4).map(|round| order(round, 3).collect()).collect();
        let expected = [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]];
        assert_eq!(orders, expected);
        assert_eq!(order(1, 2).collect::<Vec<_>>(), [1, 0]);
    }

    #[test]
    fn ratios_are_taken_run_by_run() {
        let side = |runs: &[u64]| Batches {
            pooled: Latencies::default(),
            runs: runs.to_vec(),
        };
        let ratios = side(&[110, 300, 120]).ratios_to(&side(&[100, 200, 100]));
        let ratios = ratios.expect("runs");
        let expected = [1.2, 1.1, 1.5];
        let got = [ratios.median, ratios.low, ratios.high];
        for (got, expected) in got.iter().zip(expected) {
            assert!((got - expected).abs() < 1e-9, "{got} {expected}");
        }
        assert_eq!(Ratios::fmt(Some(ratios)).0, "1.20×");
        assert_eq!(side(&[]).spread().text, "—");
        let spread = side(&[1_500, 900]).spread();
        let expected = ("900 ns–1.50 µs", json!([1_500, 900]));
        assert_eq!((spread.text.as_str(), spread.value), expected);
        assert_eq!((side(&[1, 2, 4]).median(), side(&[3, 2, 4]).best()), (2, 2));
    }

    #[test]
    fn rows_make_the_columns_and_gates_the_targets() {
        let mut outcome = Outcome::new("x", "X");
        let [limit, result] = outcome.gate("fast", Cell::ratio(Some(1.5)), "≤ 1.1×", false);
        assert_eq!([limit.text.as_str(), &result.text], ["≤ 1.1×", "MISS"]);
        outcome
            .row(row!["Client" => "r|aw", "p50" => Cell::ns(1_500), "÷ raw" => Cell::ratio(None)]);
        let n = 2_usize;
        outcome.row(row!["Client" => "lib", "p50" => Cell::ns(900), "n" => n, "Result" => result]);
        let outcome = outcome.with(json!({ "more": 1 }));
        let json = outcome.to_json();
        let rows = json!([
            { "Client": "r|aw", "p50": 1_500, "÷ raw": null },
            { "Client": "lib", "p50": 900, "n": 2, "Result": "MISS" },
        ]);
        assert_eq!(json["rows"], rows);
        assert_eq!(json["targets"][0]["value"], json!(1.5));
        assert_eq!(json["targets"][0]["measured"], "1.50×");
        assert_eq!(
            (json["title"].as_str(), json["more"].as_i64()),
            (Some("X"), Some(1))
        );
        let markdown = markdown("# h", &[outcome]);
        assert!(markdown.contains("| Client | p50 | ÷ raw | n | Result |\n| --- | --- |"));
        assert!(
            markdown.contains("| r\\|aw | 1.50 µs | — |  |  |\n| lib | 900 ns |  | 2 | MISS |")
        );
        assert!(markdown.ends_with("| fast | 1.50× | ≤ 1.1× | MISS |\n"));
    }
}
