//! Ground floor: the error type, the server variable and the iteration counts of a mode.

use std::time::Duration;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Result<T, E = BoxError> = std::result::Result<T, E>;

pub(crate) const DATABASE_URL_ENV: &str = "LOCKS_DATABASE_URL";

/// `error` and each of its sources (tokio-postgres leaves the server's words to one).
pub(crate) fn sources(error: &(dyn std::error::Error + 'static)) -> String {
    let chain = std::iter::successors(Some(error), |error| error.source());
    chain
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// The mode (quick or full), in which each scenario picks its counts, and the scale
/// scenario's largest held-lock count.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    pub(crate) scale_max: usize,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Self {
        let scale_max = if quick { 10_000 } else { 100_000 };
        Self { quick, scale_max }
    }

    pub(crate) fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick { quick } else { full }
    }

    pub(crate) fn ms(&self, quick: u64, full: u64) -> Duration {
        Duration::from_millis(self.pick(quick, full))
    }

    pub(crate) fn window(&self) -> Duration {
        self.ms(300, 1000)
    }

    pub(crate) fn mode(&self) -> &'static str {
        self.pick("quick", "full")
    }
}

/// A count given as `100000`, `1e5` or `100_000`: a whole number from 1 to 10^7.
pub(crate) fn parse_count(text: &str) -> Result<usize, String> {
    let value: f64 = (text.replace('_', "").parse())
        .map_err(|_| format!("`{text}` is not a count (write 100000 or 1e5)"))?;
    if !(1.0..=1e7).contains(&value) || value.fract() != 0.0 {
        return Err(format!("`{text}` is not a whole count from 1 to 1e7"));
    }
    Ok(value as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_people_write_them() {
        assert_eq!(parse_count("1e6"), Ok(1_000_000));
        assert_eq!(parse_count("100_000"), Ok(100_000));
        assert_eq!(parse_count("1000"), Ok(1000));
        for wrong in ["1.5", "0", "1e9", "many"] {
            assert!(parse_count(wrong).is_err(), "{wrong}");
        }
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
        let said = sources(&Db(server));
        assert_eq!(said, "db error: FATAL: role \"x\" does not exist");
        assert_eq!(sources(&*BoxError::from("plain")), "plain");
    }
}
