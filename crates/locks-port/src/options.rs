//! How long and how to wait for a lock, and in which mode.

use std::time::{Duration, Instant};

/// Whether a lock excludes everyone or admits other readers.
///
/// Exclusive and shared holders of one key contend as PostgreSQL's
/// `pg_advisory_lock` / `pg_advisory_lock_shared` do: any number of shared holders at
/// once, or one exclusive holder. Waiters are served in arrival order, so a queued
/// exclusive waiter is not starved by a stream of shared ones: readers that arrive
/// after it wait behind it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockMode {
    /// One holder at a time (the default; the Python library's only mode).
    #[default]
    Exclusive,
    /// Many shared holders at once, excluded by an exclusive one.
    Shared,
}

impl LockMode {
    /// A low-cardinality name, for spans and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
        }
    }
}

/// The deadline `timeout` after `start`, saturating: a timeout too large for the clock
/// (such as [`Duration::MAX`], a common way to say "forever") gives a deadline
/// centuries away instead of an overflow.
///
/// ```
/// use std::time::{Duration, Instant};
///
/// let now = Instant::now();
/// assert_eq!(locks_port::deadline_after(now, Duration::from_secs(1)), now + Duration::from_secs(1));
/// assert!(locks_port::deadline_after(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
/// ```
#[must_use]
pub fn deadline_after(start: Instant, timeout: Duration) -> Instant {
    if let Some(deadline) = start.checked_add(timeout) {
        return deadline;
    }
    // Far enough to be "never", near enough for every platform's clock.
    let mut far = Duration::from_secs(100 * 365 * 86_400);
    loop {
        if let Some(deadline) = start.checked_add(far) {
            return deadline;
        }
        far /= 2;
    }
}

/// How a manager waits for a lock that someone else holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitStrategy {
    /// Wait in the backend's own queue (for PostgreSQL: one `pg_advisory_lock` bounded
    /// by `lock_timeout`). The waiter gets the lock the moment it is released, in the
    /// order waiters arrived. The default.
    #[default]
    Queue,
    /// The Python `eventsource` library's strategy: try, sleep [`AcquireOptions::retry_interval`],
    /// try again until the timeout. Slower to hand over (up to one interval late) and
    /// unfair (a poller never joins the queue, so it can starve). Kept for comparison
    /// and for backends without a queue.
    ///
    /// As in the Python library, polling applies to bounded waits only: without a timeout
    /// every manager waits in the queue, whatever the strategy.
    Poll,
}

/// The options of one `acquire` call.
///
/// The default waits forever in the backend's queue. With a timeout, at least one
/// attempt is always made, so [`Duration::ZERO`] means exactly one try.
///
/// ```
/// use std::time::Duration;
/// use locks_port::{AcquireOptions, WaitStrategy};
///
/// let forever = AcquireOptions::new();
/// assert_eq!(forever.timeout(), None);
///
/// let bounded = AcquireOptions::new().with_timeout(Duration::from_millis(500));
/// assert_eq!(bounded.timeout(), Some(Duration::from_millis(500)));
///
/// // From a float, as in the Python library's `timeout=0.5`; bad input is an error, not a panic.
/// assert!(AcquireOptions::new().with_timeout_secs(0.5).is_ok());
/// assert!(AcquireOptions::new().with_timeout_secs(f64::NAN).is_err());
/// assert!(AcquireOptions::new().with_timeout_secs(-1.0).is_err());
///
/// let polling = bounded.with_wait_strategy(WaitStrategy::Poll);
/// assert_eq!(polling.retry_interval(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AcquireOptions {
    timeout: Option<Duration>,
    retry_interval: Duration,
    wait_strategy: WaitStrategy,
    mode: LockMode,
}

impl AcquireOptions {
    /// The Python library's retry interval for [`WaitStrategy::Poll`]: 100 ms.
    pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_millis(100);

    /// Wait forever, in the backend's queue: the same as
    /// [`wait_forever`](Self::wait_forever), which says so at the call site. Kept as the
    /// starting point of the `with_*` chain; for a bounded wait pass a [`Duration`]
    /// (`acquire(key, Duration::from_secs(2))`).
    #[must_use]
    pub const fn new() -> Self {
        Self {
            timeout: None,
            retry_interval: Self::DEFAULT_RETRY_INTERVAL,
            wait_strategy: WaitStrategy::Queue,
            mode: LockMode::Exclusive,
        }
    }

    /// Wait as long as it takes, in the backend's queue (no timeout): what
    /// [`new`](Self::new) and [`Default`] give, named for what it does.
    ///
    /// It waits for ever when nobody releases the key, and that includes a key this
    /// very manager holds: the acquisition is granted only once that guard is released
    /// by some other task, and a task that awaits it while holding the guard never
    /// is. There is no error to say so (a bounded wait's timeout does:
    /// [`LockAcquisitionError::is_held_by_this_manager`](crate::LockAcquisitionError::is_held_by_this_manager));
    /// check [`DistributedLock::is_held`](crate::DistributedLock::is_held) first when
    /// the same manager may hold the key.
    ///
    /// ```
    /// use locks_port::AcquireOptions;
    /// assert_eq!(AcquireOptions::wait_forever().timeout(), None);
    /// assert_eq!(AcquireOptions::wait_forever(), AcquireOptions::new());
    /// ```
    #[must_use]
    pub const fn wait_forever() -> Self {
        Self::new()
    }

    /// A shared (reader) lock, waiting forever: `AcquireOptions::new().with_mode(LockMode::Shared)`.
    ///
    /// ```
    /// use locks_port::{AcquireOptions, LockMode};
    /// assert_eq!(AcquireOptions::shared().mode(), LockMode::Shared);
    /// assert_eq!(AcquireOptions::new().mode(), LockMode::Exclusive);
    /// ```
    #[must_use]
    pub const fn shared() -> Self {
        Self::new().with_mode(LockMode::Shared)
    }

    /// Chooses exclusive (the default) or shared.
    #[must_use]
    pub const fn with_mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// The lock mode.
    #[must_use]
    pub const fn mode(&self) -> LockMode {
        self.mode
    }

    /// Gives up after `timeout` (one attempt at least; zero means exactly one try).
    ///
    /// Any duration is accepted: one too large for the clock ([`Duration::MAX`])
    /// saturates to a deadline centuries away, so it waits as good as forever.
    #[must_use]
    pub const fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Waits without a limit.
    #[must_use]
    pub const fn without_timeout(mut self) -> Self {
        self.timeout = None;
        self
    }

    /// Sets the timeout from seconds as a float, like the Python library's `timeout=0.5`.
    ///
    /// # Errors
    /// [`InvalidTimeoutError`] when `seconds` is NaN, negative, infinite or too large
    /// for a [`Duration`].
    pub fn with_timeout_secs(self, seconds: f64) -> Result<Self, InvalidTimeoutError> {
        let timeout =
            Duration::try_from_secs_f64(seconds).map_err(|error| InvalidTimeoutError {
                seconds,
                reason: error.to_string(),
            })?;
        Ok(self.with_timeout(timeout))
    }

    /// Sets the sleep between two tries of [`WaitStrategy::Poll`] (ignored by
    /// [`WaitStrategy::Queue`]). Zero is accepted; managers sleep at least 1 ms.
    #[must_use]
    pub const fn with_retry_interval(mut self, retry_interval: Duration) -> Self {
        self.retry_interval = retry_interval;
        self
    }

    /// Chooses how to wait.
    #[must_use]
    pub const fn with_wait_strategy(mut self, wait_strategy: WaitStrategy) -> Self {
        self.wait_strategy = wait_strategy;
        self
    }

    /// The timeout, `None` for waiting forever.
    #[must_use]
    pub const fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The sleep between tries of [`WaitStrategy::Poll`].
    #[must_use]
    pub const fn retry_interval(&self) -> Duration {
        self.retry_interval
    }

    /// How to wait.
    #[must_use]
    pub const fn wait_strategy(&self) -> WaitStrategy {
        self.wait_strategy
    }
}

impl Default for AcquireOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl From<Duration> for AcquireOptions {
    /// A bounded wait in the backend's queue.
    fn from(timeout: Duration) -> Self {
        Self::new().with_timeout(timeout)
    }
}

impl From<Option<Duration>> for AcquireOptions {
    /// `None` waits forever; `Some` bounds the wait.
    fn from(timeout: Option<Duration>) -> Self {
        Self {
            timeout,
            ..Self::new()
        }
    }
}

impl From<LockMode> for AcquireOptions {
    /// Waits forever for a lock in `mode`.
    fn from(mode: LockMode) -> Self {
        Self::new().with_mode(mode)
    }
}

/// A timeout in seconds that no [`Duration`] can hold.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid lock timeout {seconds} s: {reason}")]
pub struct InvalidTimeoutError {
    seconds: f64,
    reason: String,
}

impl InvalidTimeoutError {
    /// The rejected number of seconds.
    #[must_use]
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_timeouts_are_checked_not_panicking() {
        for bad in [f64::NAN, -0.1, f64::INFINITY, f64::NEG_INFINITY, 1e300] {
            let error = AcquireOptions::new().with_timeout_secs(bad).unwrap_err();
            assert!(
                error.to_string().starts_with("invalid lock timeout"),
                "{error}"
            );
        }
        let zero = AcquireOptions::new().with_timeout_secs(0.0).unwrap();
        assert_eq!(zero.timeout(), Some(Duration::ZERO));
        let fifty = AcquireOptions::new().with_timeout_secs(0.05).unwrap();
        assert_eq!(fifty.timeout(), Some(Duration::from_millis(50)));
    }

    #[test]
    fn defaults_match_the_original() {
        let options = AcquireOptions::default();
        assert_eq!(options.timeout(), None);
        assert_eq!(options.retry_interval(), Duration::from_millis(100));
        assert_eq!(options.wait_strategy(), WaitStrategy::Queue);
        assert_eq!(AcquireOptions::from(None), options);
    }
}
