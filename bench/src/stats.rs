//! Ground floor: latency histograms, live heap bytes, and how figures are printed.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// Nanosecond latencies, 3 significant digits, from 1 ns to one hour.
#[derive(Debug, Clone)]
pub(crate) struct Latencies {
    histogram: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub(crate) fn new() -> Self {
        Self {
            histogram: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .expect("static histogram bounds are valid"),
        }
    }

    /// A histogram of `samples` (nanoseconds).
    pub(crate) fn of(samples: &[u64]) -> Self {
        let mut latencies = Self::new();
        for &sample in samples {
            latencies.histogram.saturating_record(sample.max(1));
        }
        latencies
    }

    pub(crate) fn record(&mut self, elapsed: Duration) {
        self.histogram.saturating_record(nanos(elapsed).max(1));
    }

    pub(crate) fn merge(&mut self, other: &Self) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms with the same bounds merge");
    }

    pub(crate) fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The value at `quantile` (0..=1), in nanoseconds; 0 when empty.
    fn quantile_ns(&self, quantile: f64) -> u64 {
        match self.histogram.is_empty() {
            true => 0,
            false => self.histogram.value_at_quantile(quantile),
        }
    }

    pub(crate) fn p50(&self) -> u64 {
        self.quantile_ns(0.5)
    }

    pub(crate) fn p99(&self) -> u64 {
        self.quantile_ns(0.99)
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
    let fewest = turns.iter().copied().min().unwrap_or(0);
    if fewest == 0 {
        f64::INFINITY
    } else {
        as_f64(most) / as_f64(fewest)
    }
}

/// A ratio for JSON: infinite (a task without a turn) as null.
pub(crate) fn finite(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else {
        Value::Null
    }
}

/// A duration in nanoseconds as people read it, three digits from 1 µs to 1 ms: `24.4 µs`,
/// `183 µs`, `2.31 ms`, `1.20 s`.
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

pub(crate) fn as_f64(value: u64) -> f64 {
    value as f64
}

/// `1.07×`, or `—`.
pub(crate) fn fmt_ratio(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.2}×"))
}

/// Operations per second with thousands grouped: `12 345/s`.
pub(crate) fn fmt_rate(per_second: f64) -> String {
    let whole = per_second.round().max(0.0) as u64;
    format!("{}/s", group(whole))
}

/// Bytes as `1 234 B` or `12.3 KiB`.
pub(crate) fn fmt_bytes(bytes: f64) -> String {
    // A median of small deltas can be -0.3: shown as 0, not "-0".
    let bytes = if bytes.abs() < 0.5 { 0.0 } else { bytes };
    if bytes.abs() < 10_000.0 {
        format!("{bytes:.0} B")
    } else {
        format!("{:.1} KiB", bytes / 1024.0)
    }
}

fn group(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(digit);
    }
    out
}

/// The median of some numbers (the mean of the middle two for an even count); 0 when empty.
pub(crate) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        f64::midpoint(sorted[middle - 1], sorted[middle])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_recorded_values() {
        let mut latencies = Latencies::new();
        for micros in 1..=100 {
            latencies.record(Duration::from_micros(micros));
        }
        let p50 = latencies.p50();
        let p99 = latencies.p99();
        assert!((49_900..=50_100).contains(&p50), "{p50}");
        assert!((98_900..=99_100).contains(&p99), "{p99}");
    }

    #[test]
    fn medians_and_fairness() {
        assert!((median(&[3.0, 1.0, 2.0]) - 2.0).abs() < f64::EPSILON);
        assert!((median(&[4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < f64::EPSILON);
        assert!((fairness(&[10, 20, 15]) - 2.0).abs() < f64::EPSILON);
        assert!(fairness(&[10, 0]).is_infinite());
    }
}
