//! The lease: how long a lock can outlive a holder whose host vanished without closing
//! its sockets (power loss, a frozen VM, a cut network), and the order in which the two
//! ends find out. One duration the user reasons about; from it the client's keepalive
//! cadence and answer timeout, and the server's per-session TCP timers, which the
//! connection set-up sets (`SESSION_SETUP`, in `query.rs`; no extra round trip).
//!
//! ```text
//!  last answer                holder told        server may free      server has freed
//!  to a keepalive             (lost signal)      (earliest)           (latest)     lease
//!  |                          |                  |                    |            |
//!  0 ---- keepalive K ---- answer timeout A -----+---- margin M ------+-- probe V --+--|-->
//!                           (+ 2 health checks)  U = told + M         U + V        <= L
//! ```
//!
//! The derivation (all bounds counted from the holder's last exchange with the server):
//! - told ≤ `K + A + P + 2h` (`h` the health-check interval, `P` the stall patience,
//!   0 unless set: a keepalive unanswered within `A` may wait `P` more while the server
//!   shows its backend alive, never longer);
//! - the server's `tcp_user_timeout` `U = told + M`: the earliest the server can close a
//!   silent session, whether it is idle (keepalive probes unanswered) or has data the
//!   client never acknowledged (the answer to a keepalive, a grant);
//! - probes every `V = L / 12` (whole seconds, 1 to 30), 3 of them, starting `U - 3V`
//!   (at least 1 s) after the last traffic, so the session is closed between `U` and
//!   `U + V` on Linux (where `tcp_user_timeout` decides) and at `idle + 3V` elsewhere;
//! - the lease is refused unless the later of those, plus 1 s, is within `L`.

use std::fmt;
use std::time::Duration;

/// The derived bounds of a manager's lease, and the server timers that enforce it; see
/// [`PostgresLockManagerBuilder::lease`](crate::PostgresLockManagerBuilder::lease).
///
/// Every bound counts from the holder's last exchange with the server (the last
/// keepalive answer), which is never after the moment its host vanished.
///
/// ```
/// use std::time::Duration;
/// use locks_postgres::PostgresLockManager;
///
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 4)?;
/// let locks = PostgresLockManager::builder(pool).build(); // the default 60 s lease
/// let lease = locks.lease().expect("on by default");
/// assert_eq!(lease.duration, Duration::from_secs(60));
/// assert!(lease.holder_told_within + lease.margin <= lease.server_frees_after);
/// assert!(lease.server_frees_within <= lease.duration);
/// # Ok::<(), locks_postgres::PoolConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The lease: a dead holder's lock is free for others within it.
    pub duration: Duration,
    /// How long before the server can free the lock the holder is told, at least.
    pub margin: Duration,
    /// The holder's lost signal fires within this (keepalive cadence, answer timeout,
    /// [stall patience](crate::PostgresLockManagerBuilder::stall_patience) if set, and
    /// two health-check intervals). The server timers are set from it, so patience
    /// moves them later by as much: the margin stays whole.
    pub holder_told_within: Duration,
    /// The server frees the lock of a silent holder no sooner than this.
    pub server_frees_after: Duration,
    /// The server's TCP timers close a silent holder's session within this; the lock is
    /// free a moment later (the kernel's timer tick, the backend's exit: the partition
    /// test saw a permit free 70 ms past it). The lease keeps a second of slack above
    /// it, and the lease is the bound the tests hold the library to.
    pub server_frees_within: Duration,
    /// The per-session server settings that enforce it.
    pub server: ServerTimers,
}

/// The server settings a lease puts on each of the manager's connections.
///
/// The server applies them to TCP connections only: over a Unix socket they read as 0
/// and a dead client is seen at once anyway. Behind PgBouncer they face PgBouncer, not
/// the holder (see the crate documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerTimers {
    /// `tcp_keepalives_idle`: silence before the first probe.
    pub keepalives_idle: Duration,
    /// `tcp_keepalives_interval`: between probes.
    pub keepalives_interval: Duration,
    /// `tcp_keepalives_count`: unanswered probes before the server closes the
    /// session, where the OS has no `TCP_USER_TIMEOUT` (on Linux `tcp_user_timeout`
    /// decides).
    pub keepalives_count: u32,
    /// `tcp_user_timeout` (PostgreSQL 12+): how long sent data may stay unacknowledged,
    /// and on Linux how long a silent session lives while probes go unanswered.
    pub user_timeout: Duration,
    /// `client_connection_check_interval` (PostgreSQL 14+, skipped on older servers):
    /// how often a backend busy with a statement (a waiter in `pg_advisory_lock`)
    /// checks that its client is still there, so a dead waiter leaves the queue.
    pub client_connection_check_interval: Duration,
    /// `idle_session_timeout` (PostgreSQL 14+), with
    /// [`expire_stopped_holders`](crate::PostgresLockManagerBuilder::expire_stopped_holders):
    /// [`user_timeout`](Self::user_timeout), so a holder whose process stopped sending
    /// keepalives (`SIGSTOP`, a blocked runtime) while its kernel still answers TCP has its
    /// session ended, and its locks freed, as a silent host's would be. `None` (the
    /// default): 0, no idle limit on a lock's session.
    pub idle_session_timeout: Option<Duration>,
}

/// A lease whose bounds cannot hold with the other settings.
///
/// ```
/// use std::time::Duration;
/// use locks_postgres::PostgresLockManager;
///
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 4)?;
/// let refused = PostgresLockManager::builder(pool)
///     .lease(Some(Duration::from_secs(20)))
///     .keepalive(Some(Duration::from_secs(30)))
///     .try_build();
/// let error = refused.expect_err("a 30 s keepalive cannot tell the holder within a 20 s lease");
/// assert!(error.to_string().contains("lease of 20s"), "{error}");
/// # Ok::<(), locks_postgres::PoolConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseError {
    message: String,
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LeaseError {}

impl LeaseError {
    pub(crate) fn new(message: String) -> Self {
        Self { message }
    }
}

/// The default lease.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default safety margin.
pub(crate) const DEFAULT_MARGIN: Duration = Duration::from_secs(5);
/// Unanswered probes before a session is closed (where `tcp_user_timeout` does not
/// decide).
const PROBES: u32 = 3;
/// Slack kept between the latest release and the lease: round trips, timer rounding.
const SLACK: Duration = Duration::from_secs(1);

/// The client timings a lease derives when they were not set explicitly: a keepalive
/// every `L / 6` and an answer timeout of `L / 12`, each capped at its default.
pub(crate) fn client_defaults(
    lease: Duration,
    keepalive_default: Duration,
    answer_default: Duration,
) -> (Duration, Duration) {
    (
        (lease / 6).min(keepalive_default),
        (lease / 12).min(answer_default),
    )
}

impl Lease {
    /// Derives a lease of `duration` with `margin` from the client's timings, or says
    /// which of them break its order.
    pub(crate) fn derive(
        duration: Duration,
        margin: Duration,
        keepalive: Option<Duration>,
        answer_timeout: Duration,
        patience: Duration,
        health_check_interval: Duration,
    ) -> Result<Self, LeaseError> {
        let Some(keepalive) = keepalive else {
            return Err(LeaseError::new(format!(
                "a lease of {duration:?} needs keepalives: with keepalive(None) a holder cut \
                 off from the server is never told, so the server could free its lock first; \
                 set a keepalive cadence or lease(None)"
            )));
        };
        let told = keepalive
            .saturating_add(answer_timeout)
            .saturating_add(patience)
            .saturating_add(health_check_interval.saturating_mul(2));
        let interval = Duration::from_secs((duration.as_secs() / 12).clamp(1, 30));
        let user_timeout = ceil_ms(told.saturating_add(margin));
        let idle = user_timeout
            .as_secs()
            .saturating_add(u64::from(user_timeout.subsec_nanos() > 0))
            .saturating_sub(u64::from(PROBES) * interval.as_secs())
            .max(1);
        // Linux closes at the first probe at or after the user timeout; other systems
        // after the last unanswered probe.
        let latest = user_timeout
            .saturating_add(interval)
            .max(Duration::from_secs(
                idle.saturating_add(u64::from(PROBES) * interval.as_secs()),
            ));
        let needed = latest.saturating_add(SLACK);
        if needed > duration {
            let (patience, or_patience) = if patience.is_zero() {
                (String::new(), "")
            } else {
                (
                    format!(" + stall patience {patience:?}"),
                    ", stall patience",
                )
            };
            return Err(LeaseError::new(format!(
                "a lease of {duration:?} is too short: the holder is told within {told:?} \
                 (keepalive {keepalive:?} + answer timeout {answer_timeout:?}{patience} + 2 \
                 health checks of {health_check_interval:?}), the server must wait the margin \
                 {margin:?} more and frees the lock within one probe interval ({interval:?}) \
                 after that, plus {SLACK:?} of slack: it needs at least {needed:?}; lengthen \
                 the lease or shorten the keepalive, answer timeout{or_patience} or margin"
            )));
        }
        // The server takes `tcp_user_timeout` in `int` milliseconds: a longer one could
        // only be set cut short, and the server could then free the lock before the
        // holder is told.
        let most = Duration::from_millis(i32::MAX.unsigned_abs().into());
        if user_timeout > most {
            return Err(LeaseError::new(format!(
                "the server frees a silent holder's lock after tcp_user_timeout, which must \
                 outlast the holder being told ({told:?}) by the margin {margin:?}: \
                 {user_timeout:?}, past the most the server takes ({most:?}, i32::MAX ms); \
                 shorten the keepalive, answer timeout, stall patience or margin"
            )));
        }
        Ok(Self {
            duration,
            margin,
            holder_told_within: told,
            server_frees_after: user_timeout,
            server_frees_within: latest,
            server: ServerTimers {
                keepalives_idle: Duration::from_secs(idle),
                keepalives_interval: interval,
                keepalives_count: PROBES,
                user_timeout,
                client_connection_check_interval: interval,
                idle_session_timeout: None,
            },
        })
    }

    /// The lease enforced on a stopped holder too: `idle_session_timeout` set to the
    /// user timeout (see [`ServerTimers::idle_session_timeout`]).
    pub(crate) fn expiring_stopped_holders(mut self) -> Self {
        self.server.idle_session_timeout = Some(self.server.user_timeout);
        self
    }
}

impl ServerTimers {
    /// The values the set-up binds: `tcp_keepalives_idle`, `_interval`, `_count` (s),
    /// `tcp_user_timeout`, `client_connection_check_interval` and, when set,
    /// `idle_session_timeout` (ms), as text.
    pub(crate) fn as_settings(&self) -> [Option<String>; 6] {
        let ms = |duration: Duration| duration.as_millis().min(i32::MAX as u128).to_string();
        [
            Some(self.keepalives_idle.as_secs().to_string()),
            Some(self.keepalives_interval.as_secs().to_string()),
            Some(self.keepalives_count.to_string()),
            Some(ms(self.user_timeout)),
            Some(ms(self.client_connection_check_interval)),
            self.idle_session_timeout.map(ms),
        ]
    }
}

/// `duration` rounded up to whole milliseconds.
fn ceil_ms(duration: Duration) -> Duration {
    let ms = duration.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_millis(200);

    fn derive(lease: u64, keepalive: f64, answer: f64) -> Result<Lease, LeaseError> {
        Lease::derive(
            Duration::from_secs(lease),
            DEFAULT_MARGIN,
            Some(Duration::from_secs_f64(keepalive)),
            Duration::from_secs_f64(answer),
            Duration::ZERO,
            H,
        )
    }

    /// Where `tcp_user_timeout` decides (Linux): the session closes at the first probe
    /// at or after `user_timeout` (probes at idle, idle + V, …; one must be out).
    fn linux_close(timers: &ServerTimers) -> Duration {
        let mut at = timers.keepalives_idle + timers.keepalives_interval;
        while at < timers.user_timeout {
            at += timers.keepalives_interval;
        }
        at
    }

    /// Elsewhere: after `count` unanswered probes.
    fn count_close(timers: &ServerTimers) -> Duration {
        timers.keepalives_idle + timers.keepalives_interval * timers.keepalives_count
    }

    #[test]
    fn the_default_lease_tells_the_holder_first_and_frees_within_a_minute() {
        let (keepalive, answer) = client_defaults(
            DEFAULT_LEASE,
            Duration::from_secs(10),
            Duration::from_secs(5),
        );
        assert_eq!(
            (keepalive, answer),
            (Duration::from_secs(10), Duration::from_secs(5))
        );
        let lease = derive(60, 10.0, 5.0).expect("the default lease holds");
        assert_eq!(lease.holder_told_within, Duration::from_millis(15_400));
        assert_eq!(lease.server_frees_after, Duration::from_millis(20_400));
        assert_eq!(lease.server.keepalives_interval, Duration::from_secs(5));
        assert_eq!(lease.server.keepalives_idle, Duration::from_secs(6));
        assert_eq!(lease.server_frees_within, Duration::from_millis(25_400));
    }

    #[test]
    fn every_lease_orders_told_margin_free_and_lease_on_either_kind_of_server() {
        for lease in [10, 11, 15, 20, 30, 45, 60, 90, 120, 300, 600, 3600] {
            let (keepalive, answer) = client_defaults(
                Duration::from_secs(lease),
                Duration::from_secs(10),
                Duration::from_secs(5),
            );
            let derived = Lease::derive(
                Duration::from_secs(lease),
                DEFAULT_MARGIN,
                Some(keepalive),
                answer,
                Duration::ZERO,
                H,
            )
            .unwrap_or_else(|error| panic!("lease {lease}: {error}"));
            let timers = derived.server;
            for close in [linux_close(&timers), count_close(&timers)] {
                assert!(
                    close
                        >= derived
                            .server_frees_after
                            .saturating_sub(Duration::from_millis(999)),
                    "lease {lease}: closes at {close:?}, before {:?}",
                    derived.server_frees_after
                );
                assert!(
                    close <= derived.server_frees_within + Duration::from_secs(1),
                    "lease {lease}: closes at {close:?}, after {:?}",
                    derived.server_frees_within
                );
            }
            assert!(derived.holder_told_within + DEFAULT_MARGIN <= derived.server_frees_after);
            assert!(
                derived.server_frees_within < derived.duration,
                "lease {lease}"
            );
        }
    }

    #[test]
    fn settings_that_break_the_order_are_refused_with_the_reason() {
        let error = derive(10, 10.0, 5.0).expect_err("a 10 s keepalive in a 10 s lease");
        let text = error.to_string();
        assert!(text.contains("lease of 10s is too short"), "{text}");
        assert!(text.contains("keepalive 10s"), "{text}");
        let off = Lease::derive(
            DEFAULT_LEASE,
            DEFAULT_MARGIN,
            None,
            Duration::from_secs(5),
            Duration::ZERO,
            H,
        )
        .expect_err("no keepalive");
        assert!(off.to_string().contains("needs keepalives"), "{off}");
        let margin = Lease::derive(
            DEFAULT_LEASE,
            Duration::from_secs(50),
            Some(Duration::from_secs(10)),
            Duration::from_secs(5),
            Duration::ZERO,
            H,
        )
        .expect_err("a 50 s margin leaves no room in 60 s");
        assert!(margin.to_string().contains("margin 50s"), "{margin}");
    }

    #[test]
    fn patience_is_told_within_and_moves_the_server_timers_later_by_as_much() {
        let lease = |patience| {
            Lease::derive(
                DEFAULT_LEASE,
                DEFAULT_MARGIN,
                Some(Duration::from_secs(10)),
                Duration::from_secs(5),
                patience,
                H,
            )
        };
        let without = lease(Duration::ZERO).expect("the default lease");
        let with = lease(Duration::from_secs(3)).expect("3 s of patience fit in 60 s");
        assert_eq!(
            with.holder_told_within,
            without.holder_told_within + Duration::from_secs(3)
        );
        assert_eq!(
            with.server_frees_after,
            without.server_frees_after + Duration::from_secs(3)
        );
        assert!(with.holder_told_within + with.margin <= with.server_frees_after);
        let error = lease(Duration::from_secs(40)).expect_err("40 s of patience do not fit");
        let text = error.to_string();
        assert!(text.contains("stall patience 40s"), "{text}");
        assert!(
            text.contains("answer timeout, stall patience or margin"),
            "{text}"
        );
    }

    /// `tcp_user_timeout` takes at most `i32::MAX` ms (24.8 days): a lease whose server
    /// timer is longer cannot be set on the server as derived (the set-up would cut it
    /// there, so the server could free the lock before the holder is told), and is
    /// refused; one whose timer fits is set exactly.
    #[test]
    fn a_user_timeout_past_what_the_server_takes_is_refused() {
        const DAY: f64 = 86_400.0;
        let error = derive(100 * 86_400, 30.0 * DAY, 5.0)
            .expect_err("a 30-day keepalive needs a tcp_user_timeout past 24.8 days");
        let text = error.to_string();
        assert!(text.contains("tcp_user_timeout"), "{text}");
        let fits = derive(100 * 86_400, 20.0 * DAY, 5.0).expect("20 days fit");
        let set: u128 = fits.server.as_settings()[3]
            .as_deref()
            .expect("set")
            .parse()
            .expect("ms");
        assert_eq!(set, fits.server_frees_after.as_millis());
    }

    #[test]
    fn a_lease_on_stopped_holders_ends_an_idle_session_when_the_server_timers_would() {
        let lease = derive(60, 10.0, 5.0).expect("the default lease");
        assert_eq!(lease.server.idle_session_timeout, None);
        let stopped = lease.expiring_stopped_holders();
        assert_eq!(
            stopped.server.idle_session_timeout,
            Some(lease.server_frees_after)
        );
        // Past the holder's told bound by the whole margin, and within the lease.
        let idle = stopped.server.idle_session_timeout.expect("set");
        assert!(
            idle >= stopped.holder_told_within + stopped.margin,
            "{stopped:?}"
        );
        assert!(idle < stopped.duration, "{stopped:?}");
        let ms = u128::from(u32::try_from(idle.as_millis()).expect("fits"));
        assert_eq!(stopped.server.as_settings()[5], Some(ms.to_string()));
        // Everything else as without it.
        assert_eq!(
            stopped.server.as_settings()[..5],
            lease.server.as_settings()[..5]
        );
    }

    #[test]
    fn huge_settings_saturate_instead_of_overflowing() {
        let lease = Lease::derive(
            Duration::MAX,
            Duration::MAX,
            Some(Duration::MAX),
            Duration::MAX,
            Duration::MAX,
            Duration::MAX,
        );
        // No panic, whatever the answer.
        drop(lease);
        let long = derive(u64::MAX / 2, 10.0, 5.0).expect("a very long lease");
        let settings = long.server.as_settings();
        assert_eq!(settings[2].as_deref(), Some("3"));
        assert_eq!(settings[5], None, "no idle limit unless asked for");
        let numbers: Vec<&String> = settings.iter().take(5).flatten().collect();
        assert_eq!(numbers.len(), 5);
        assert!(numbers.iter().all(|value| value.parse::<u64>().is_ok()));
    }
}
