//! Ground floor: latency histograms, live heap bytes, and how figures are printed.

use std::ops::Range;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Nanosecond latencies, 3 significant digits, from 1 ns to one hour; percentiles are 0
/// when empty.
#[derive(Debug, Clone)]
pub(crate) struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        let histogram = Histogram::new_with_bounds(1, 3_600_000_000_000, 3);
        Self(histogram.expect("static histogram bounds are valid"))
    }
}

impl Latencies {
    /// A histogram of `samples` (nanoseconds).
    pub(crate) fn of(samples: &[u64]) -> Self {
        let mut latencies = Self::default();
        samples
            .iter()
            .for_each(|&ns| latencies.0.saturating_record(ns.max(1)));
        latencies
    }

    pub(crate) fn record(&mut self, elapsed: Duration) {
        self.0.saturating_record(nanos(elapsed).max(1));
    }

    /// Calls `f`, recording how long its future took (the clock starts before the call).
    pub(crate) async fn time<T>(&mut self, f: impl AsyncFnOnce() -> T) -> T {
        let started = Instant::now();
        let output = f().await;
        self.record(started.elapsed());
        output
    }

    /// A histogram of the calls `op(n)` for each `n` of `calls`, each timed.
    pub(crate) async fn timed<T, E>(
        calls: Range<usize>,
        mut op: impl AsyncFnMut(usize) -> Result<T, E>,
    ) -> Result<Self, E> {
        let mut latencies = Self::default();
        for n in calls {
            latencies.time(async || op(n).await).await?;
        }
        Ok(latencies)
    }

    pub(crate) fn merge(&mut self, other: &Self) {
        (self.0.add(&other.0)).expect("histograms with the same bounds merge");
    }

    /// All of `histograms` in one.
    pub(crate) fn merged<'a>(histograms: impl IntoIterator<Item = &'a Self>) -> Self {
        let mut merged = Self::default();
        histograms.into_iter().for_each(|other| merged.merge(other));
        merged
    }

    pub(crate) fn count(&self) -> u64 {
        self.0.len()
    }

    pub(crate) fn p50(&self) -> u64 {
        self.0.value_at_quantile(0.5)
    }

    pub(crate) fn p99(&self) -> u64 {
        self.0.value_at_quantile(0.99)
    }
}

/// Counts live heap bytes (for the per-lock memory figures); otherwise the system allocator.
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

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

/// A duration in whole nanoseconds (saturating).
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Most turns / fewest turns; infinite when a task got none.
pub(crate) fn fairness(turns: &[u64]) -> f64 {
    let most = turns.iter().copied().max().unwrap_or(0);
    match turns.iter().copied().min().unwrap_or(0) {
        0 => f64::INFINITY,
        fewest => most as f64 / fewest as f64,
    }
}

/// Nanoseconds as people read them, three digits from 1 µs: `24.4 µs`, `183 µs`,
/// `2.31 ms`, `1.20 s`.
pub(crate) fn fmt_ns(nanos: u64) -> String {
    // From the largest: the least value shown in a unit, its size, its decimals.
    let units = [(1e9, 1e9, "s", 2), (1e6, 1e6, "ms", 2), (1e5, 1e3, "µs", 0)];
    let units = units
        .into_iter()
        .chain([(1e4, 1e3, "µs", 1), (1e3, 1e3, "µs", 2)]);
    let ns = nanos as f64;
    match units.into_iter().find(|(least, ..)| ns >= *least) {
        Some((_, size, unit, decimals)) => format!("{:.decimals$} {unit}", ns / size),
        None => format!("{nanos} ns"),
    }
}

/// `a / b`, or `None` when `b` is zero.
pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// `1.07×`, or `—`.
pub(crate) fn fmt_ratio(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.2}×"))
}

/// Operations per second with thousands grouped: `12 345/s`.
pub(crate) fn fmt_rate(per_second: f64) -> String {
    let digits = (per_second.round().max(0.0) as u64).to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(digit);
    }
    out + "/s"
}

/// Bytes as `1 234 B` or `12.3 KiB` (a median of small deltas, -0.3, as 0).
pub(crate) fn fmt_bytes(bytes: f64) -> String {
    match bytes.abs() {
        ..0.5 => "0 B".to_owned(),
        ..10_000.0 => format!("{bytes:.0} B"),
        _ => format!("{:.1} KiB", bytes / 1024.0),
    }
}

/// The median (the mean of the middle two for an even count); 0 when empty.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[middle],
        _ => f64::midpoint(sorted[middle - 1], sorted[middle]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_as_people_read_them() {
        let latencies = Latencies::of(&(1..=100).map(|us| us * 1000).collect::<Vec<_>>());
        let (p50, p99) = (latencies.p50(), latencies.p99());
        assert!((49_900..=50_100).contains(&p50) && (98_900..=99_100).contains(&p99));
        assert_eq!(Latencies::default().p99(), 0);
        assert!((median([3.0, 1.0, 2.0]) - 2.0).abs() < f64::EPSILON);
        assert!((median([4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < f64::EPSILON);
        assert!((fairness(&[10, 20, 15]) - 2.0).abs() < f64::EPSILON);
        assert!(fairness(&[10, 0]).is_infinite());
        assert_eq!([fmt_ns(24_400), fmt_bytes(-0.3)], ["24.4 µs", "0 B"]);
        assert_eq!(fmt_rate(12_345.4), "12\u{202f}345/s");
    }
}
