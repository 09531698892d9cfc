//! The knobs of a migration: copy batches, catch-up rounds, and the cutover's limits.

use std::time::Duration;

/// Settings of a [`MigrationCoordinator`](crate::MigrationCoordinator).
///
/// The defaults are the Python `eventsource` library's: the cutover lock is waited for 500 ms,
/// writes are paused for at most 500 ms, and the cutover needs the target fully caught
/// up (lag 0) before it pauses.
///
/// ```
/// use std::time::Duration;
/// use migration_cutover::{ConfigError, MigrationConfig};
///
/// let config = MigrationConfig::new()
///     .with_pause_budget(Duration::from_millis(250))?
///     .with_max_lag(10)
///     .with_batch_size(500)?;
/// assert_eq!(config.pause_budget(), Duration::from_millis(250));
///
/// let error = MigrationConfig::new().with_pause_budget(Duration::from_millis(50)).unwrap_err();
/// assert_eq!(error.to_string(), "pause budget 50 ms is below the minimum of 100 ms");
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MigrationConfig {
    batch_size: usize,
    catch_up_rounds: u32,
    lock_timeout: Duration,
    pause_budget: Duration,
    max_lag: u64,
    write_timeout: Duration,
}

impl MigrationConfig {
    /// Events per copy batch by default: 1000.
    pub const DEFAULT_BATCH_SIZE: usize = 1000;
    /// Catch-up rounds after the bulk copy by default: 10.
    pub const DEFAULT_CATCH_UP_ROUNDS: u32 = 10;
    /// How long the cutover waits for its lock by default: 500 ms.
    pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(500);
    /// How long the cutover may hold writes back by default: 500 ms.
    pub const DEFAULT_PAUSE_BUDGET: Duration = Duration::from_millis(500);
    /// The smallest pause budget accepted: 100 ms.
    pub const MIN_PAUSE_BUDGET: Duration = Duration::from_millis(100);
    /// The largest lag (in events) the cutover accepts by default: 0.
    pub const DEFAULT_MAX_LAG: u64 = 0;
    /// How long a write through the router waits out a pause by default: 5 s.
    pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

    /// The defaults.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            batch_size: Self::DEFAULT_BATCH_SIZE,
            catch_up_rounds: Self::DEFAULT_CATCH_UP_ROUNDS,
            lock_timeout: Self::DEFAULT_LOCK_TIMEOUT,
            pause_budget: Self::DEFAULT_PAUSE_BUDGET,
            max_lag: Self::DEFAULT_MAX_LAG,
            write_timeout: Self::DEFAULT_WRITE_TIMEOUT,
        }
    }

    /// Events read and appended per copy batch.
    ///
    /// # Errors
    /// [`ConfigError::ZeroBatchSize`] for 0.
    pub const fn with_batch_size(mut self, batch_size: usize) -> Result<Self, ConfigError> {
        if batch_size == 0 {
            return Err(ConfigError::ZeroBatchSize);
        }
        self.batch_size = batch_size;
        Ok(self)
    }

    /// How many catch-up rounds the bulk copy runs at most after its first pass.
    #[must_use]
    pub const fn with_catch_up_rounds(mut self, rounds: u32) -> Self {
        self.catch_up_rounds = rounds;
        self
    }

    /// How long the cutover waits for its lock before giving up (one try at least).
    #[must_use]
    pub const fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// How long the cutover may hold the tenant's writes back.
    ///
    /// # Errors
    /// [`ConfigError::PauseBudgetTooSmall`] below [`MIN_PAUSE_BUDGET`](Self::MIN_PAUSE_BUDGET).
    pub const fn with_pause_budget(mut self, budget: Duration) -> Result<Self, ConfigError> {
        if budget.as_nanos() < Self::MIN_PAUSE_BUDGET.as_nanos() {
            return Err(ConfigError::PauseBudgetTooSmall {
                given: budget,
                minimum: Self::MIN_PAUSE_BUDGET,
            });
        }
        self.pause_budget = budget;
        Ok(self)
    }

    /// The largest lag, in events, at which the cutover still goes ahead.
    #[must_use]
    pub const fn with_max_lag(mut self, max_lag: u64) -> Self {
        self.max_lag = max_lag;
        self
    }

    /// How long a write through [`WriteRouter`](crate::WriteRouter) waits out a pause.
    #[must_use]
    pub const fn with_write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = timeout;
        self
    }

    /// Events per copy batch.
    #[must_use]
    pub const fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Catch-up rounds after the first copy pass, at most.
    #[must_use]
    pub const fn catch_up_rounds(&self) -> u32 {
        self.catch_up_rounds
    }

    /// How long the cutover waits for its lock.
    #[must_use]
    pub const fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// How long the cutover may hold writes back.
    #[must_use]
    pub const fn pause_budget(&self) -> Duration {
        self.pause_budget
    }

    /// The largest lag the cutover accepts.
    #[must_use]
    pub const fn max_lag(&self) -> u64 {
        self.max_lag
    }

    /// How long a routed write waits out a pause.
    #[must_use]
    pub const fn write_timeout(&self) -> Duration {
        self.write_timeout
    }
}

impl Default for MigrationConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// A setting that cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The pause budget is too short for a cutover to finish in; give it at least
    /// the minimum.
    #[error(
        "pause budget {} ms is below the minimum of {} ms",
        .given.as_millis(),
        .minimum.as_millis()
    )]
    PauseBudgetTooSmall {
        /// The budget asked for.
        given: Duration,
        /// The smallest accepted.
        minimum: Duration,
    },
    /// A copy batch must hold at least one event.
    #[error("copy batch size must be at least 1")]
    ZeroBatchSize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_original() {
        let config = MigrationConfig::default();
        assert_eq!(config.lock_timeout(), Duration::from_millis(500));
        assert_eq!(config.pause_budget(), Duration::from_millis(500));
        assert_eq!(config.max_lag(), 0);
    }

    #[test]
    fn the_pause_budget_has_a_floor_of_100_ms() {
        let config = MigrationConfig::new();
        assert!(config.with_pause_budget(Duration::from_millis(100)).is_ok());
        assert_eq!(
            config.with_pause_budget(Duration::from_millis(99)),
            Err(ConfigError::PauseBudgetTooSmall {
                given: Duration::from_millis(99),
                minimum: Duration::from_millis(100),
            })
        );
        assert!(config.with_pause_budget(Duration::ZERO).is_err());
        assert_eq!(config.with_batch_size(0), Err(ConfigError::ZeroBatchSize));
    }
}
