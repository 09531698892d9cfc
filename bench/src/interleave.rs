//! Floor 1: how every scenario compares the library with its baseline: the sides take turns in
//! rounds, the order rotating from round to round so that none always runs first or last
//! (whatever drifts during a run, a cache, a frequency, the server's background work, hits
//! every side alike); each turn is a batch, and what the batches measured is kept as a
//! histogram of every sample plus each batch's p50 (a "run"), so that sides compare run by
//! run, neighbours in time.

use std::time::Instant;

use serde_json::{Value, json};

use crate::BoxError;
use crate::stats::{Latencies, as_f64, fmt_ns, median};

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
    let mut sides: Vec<Batches> = (0..count).map(|_| Batches::new()).collect();
    rounds(rounds_, count, async |_, side| {
        let mut latencies = Latencies::new();
        for n in 0..batch {
            let started = Instant::now();
            call(side, n).await?;
            latencies.record(started.elapsed());
        }
        sides[side].runs.push(latencies.p50());
        sides[side].pooled.merge(&latencies);
        Ok(())
    })
    .await?;
    Ok(sides)
}

/// What the batches of one side measured.
#[derive(Debug)]
pub(crate) struct Batches {
    /// Every sample of every batch.
    pub(crate) pooled: Latencies,
    /// The p50 of each batch, in nanoseconds, in the order they ran.
    pub(crate) runs: Vec<u64>,
}

impl Batches {
    pub(crate) fn new() -> Self {
        Self {
            pooled: Latencies::new(),
            runs: Vec::new(),
        }
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
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let value = median(&values).round() as u64;
        value
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
        if values.is_empty() {
            return None;
        }
        let low = values.iter().copied().fold(f64::INFINITY, f64::min);
        let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Ratios {
            median: median(&values),
            low,
            high,
        })
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
    /// `1.07×` and `1.02–1.11×`; `—` twice for `None`.
    pub(crate) fn fmt(ratios: Option<Self>) -> (String, String) {
        ratios.map_or_else(
            || ("—".to_owned(), "—".to_owned()),
            |r| {
                (
                    format!("{:.2}×", r.median),
                    format!("{:.2}–{:.2}×", r.low, r.high),
                )
            },
        )
    }
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
    }
}
