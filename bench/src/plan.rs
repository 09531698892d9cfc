//! Ground floor: the error type, the server variable and the iteration counts of a mode.

use std::time::Duration;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) const DATABASE_URL_ENV: &str = "LOCKS_DATABASE_URL";

/// `error` and each of its sources, `: `-separated: tokio-postgres says `db error` and
/// leaves the server's words (`ERROR: …`) to its source.
pub(crate) fn sources(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}

/// Iteration counts and windows of one mode.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    /// The pinned cycle scenarios: rounds, and the untimed and timed cycles of one run.
    pub(crate) cycle_rounds: usize,
    pub(crate) cycle_warmup: usize,
    pub(crate) cycle_cycles: usize,
    pub(crate) throughput_rounds: usize,
    pub(crate) throughput_window: Duration,
    pub(crate) handoff_rounds: usize,
    pub(crate) handoff_window: Duration,
    pub(crate) handoff_poll_window: Duration,
    pub(crate) hold_locks: usize,
    pub(crate) hold_rounds: usize,
    pub(crate) memory_rounds: usize,
    pub(crate) memory_batches: usize,
    pub(crate) memory_batch: usize,
    pub(crate) memory_window: Duration,
    pub(crate) memory_windows: usize,
    /// N of the callgrind runs (N and 2N cycles).
    pub(crate) callgrind_cycles: usize,
    pub(crate) latency_rounds: usize,
    pub(crate) latency_batch: usize,
    /// The `scale` scenario's largest held-lock count (10^4 quick, 10^5 full; `--scale-max`).
    pub(crate) scale_max: usize,
    /// Each `scale` curve point's measuring window (throughput, handoff, groups).
    pub(crate) scale_window: Duration,
    /// Rounds of each `scale` comparison (library and raw alternate within a round).
    pub(crate) scale_rounds: usize,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Self {
        let ms = |q, f| Duration::from_millis(pick(quick, q, f));
        Self {
            quick,
            cycle_rounds: pick(quick, 3, 9),
            cycle_warmup: pick(quick, 100, 500),
            cycle_cycles: pick(quick, 1000, 5000),
            throughput_rounds: pick(quick, 3, 6),
            throughput_window: ms(600, 3000),
            handoff_rounds: pick(quick, 2, 5),
            handoff_window: ms(600, 2000),
            handoff_poll_window: ms(1500, 6000),
            hold_locks: pick(quick, 100, 500),
            hold_rounds: pick(quick, 2, 3),
            memory_rounds: pick(quick, 4, 10),
            memory_batches: pick(quick, 20, 50),
            memory_batch: 1000,
            memory_window: ms(300, 1000),
            memory_windows: pick(quick, 4, 6),
            callgrind_cycles: pick(quick, 300, 2000),
            latency_rounds: pick(quick, 5, 10),
            latency_batch: pick(quick, 40, 200),
            scale_max: pick(quick, 10_000, 100_000),
            scale_window: ms(300, 1000),
            scale_rounds: pick(quick, 1, 3),
        }
    }

    pub(crate) fn mode(&self) -> &'static str {
        if self.quick { "quick" } else { "full" }
    }
}

/// A count given as `100000`, `1e5` or `100_000`: a whole number from 1 to 10^7.
pub(crate) fn parse_count(text: &str) -> Result<usize, String> {
    let cleaned = text.replace('_', "");
    let value: f64 = cleaned
        .parse()
        .map_err(|_| format!("`{text}` is not a count (write 100000 or 1e5)"))?;
    if !(1.0..=1e7).contains(&value) || value.fract() != 0.0 {
        return Err(format!("`{text}` is not a whole count from 1 to 1e7"));
    }
    Ok(value as usize)
}

fn pick<T>(quick: bool, small: T, full: T) -> T {
    if quick { small } else { full }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_people_write_them() {
        assert_eq!(parse_count("1e6"), Ok(1_000_000));
        assert_eq!(parse_count("100_000"), Ok(100_000));
        assert_eq!(parse_count("1000"), Ok(1000));
        assert!(parse_count("1.5").is_err());
        assert!(parse_count("0").is_err());
        assert!(parse_count("1e9").is_err());
        assert!(parse_count("many").is_err());
    }

    #[test]
    fn an_error_is_said_with_its_sources() {
        #[derive(Debug)]
        struct Db(std::io::Error);
        impl std::fmt::Display for Db {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("db error")
            }
        }
        impl std::error::Error for Db {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let server = std::io::Error::other("FATAL: role \"x\" does not exist");
        assert_eq!(
            sources(&Db(server)),
            "db error: FATAL: role \"x\" does not exist"
        );
        let error: BoxError = "plain".into();
        assert_eq!(sources(&*error), "plain");
    }
}
