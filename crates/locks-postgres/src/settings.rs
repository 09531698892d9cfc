//! What a manager is told: its timings and options ([`Settings`], gathered by the
//! builder one floor up), whether keys are shown ([`KeyVisibility`]), and the
//! `application_name` a holder id is published as.

use std::time::Duration;

use crate::lease::{Lease, LeaseError};

/// Whether lock keys appear in spans and log events.
///
/// Keys often carry tenant ids. With [`KeyVisibility::Hidden`] no span, event or log
/// record of the manager carries key text, on any path (success or failure): only the
/// derived lock id, which is enough to find the lock in `pg_locks`. Error values
/// returned to the caller still name the key (they are the caller's own); log them
/// with care.
///
/// ```
/// use locks_postgres::{KeyVisibility, PostgresLockManager};
///
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 4)?;
/// let locks = PostgresLockManager::builder(pool)
///     .key_visibility(KeyVisibility::Hidden)
///     .build();
/// # drop(locks);
/// # Ok::<(), locks_postgres::PoolConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyVisibility {
    /// Keys are recorded as `lock.key` (the default).
    #[default]
    Shown,
    /// Keys are left out of spans and events.
    Hidden,
}

impl KeyVisibility {
    /// The key as spans and events may show it.
    pub(crate) fn shown(self, key: &str) -> Option<&str> {
        match self {
            Self::Shown => Some(key),
            Self::Hidden => None,
        }
    }
}

/// The manager's timings and options (see the builder for each).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) keepalive: Option<Duration>,
    pub(crate) health_check_interval: Duration,
    pub(crate) answer_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) deadline_margin: Duration,
    pub(crate) fencing: bool,
    pub(crate) release_in_background: bool,
    /// `acquire_many` tries its keys one round trip each, the old way (for the
    /// benchmark's comparison only).
    /// How many locks may share one connection (1: one connection per lock).
    pub(crate) locks_per_connection: usize,
    /// The level of the acquire and release spans.
    pub(crate) span_level: tracing::Level,
    /// The lease (`None`: the server's own TCP timers are left alone).
    pub(crate) lease: Option<Duration>,
    pub(crate) lease_margin: Duration,
    /// Whether the keepalive and the answer timeout were set explicitly (else a lease
    /// derives them).
    pub(crate) keepalive_set: bool,
    pub(crate) answer_timeout_set: bool,
    /// Whether the lease was set explicitly (else `keepalive(None)` turns it off).
    pub(crate) lease_set: bool,
    /// Whether the manager records metrics, and whether they carry `lock.id`.
    pub(crate) metrics: bool,
    pub(crate) metrics_lock_id: bool,
    /// How long past the answer timeout a keepalive waits on a session whose backend the
    /// server still shows alive (`None`: not at all; see `stall.rs`).
    pub(crate) stall_patience: Option<Duration>,
    /// Whether the lease is enforced on a holder whose process stopped too (the
    /// server's `idle_session_timeout`; see the builder's `expire_stopped_holders`).
    pub(crate) expire_stopped_holders: bool,
}

impl Settings {
    /// The default cadence of keepalives on held connections.
    pub(crate) const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(10);
    /// The default interval of the local check for ended connections.
    pub(crate) const DEFAULT_HEALTH_CHECK_INTERVAL: Duration = Duration::from_millis(200);
    /// The default answer timeout of quick statements.
    pub(crate) const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default timeout for opening a connection outside a deadline.
    pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// How long after its deadline a bounded acquire still waits for the server.
    pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_secs(2);

    pub(crate) const DEFAULT: Self = Self {
        keepalive: Some(Self::DEFAULT_KEEPALIVE),
        health_check_interval: Self::DEFAULT_HEALTH_CHECK_INTERVAL,
        answer_timeout: Self::DEFAULT_ANSWER_TIMEOUT,
        connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
        deadline_margin: Self::DEADLINE_MARGIN,
        fencing: false,
        release_in_background: false,
        locks_per_connection: 1,
        span_level: crate::telemetry::DEFAULT_SPAN_LEVEL,
        lease: Some(crate::lease::DEFAULT_LEASE),
        lease_margin: crate::lease::DEFAULT_MARGIN,
        keepalive_set: false,
        answer_timeout_set: false,
        lease_set: false,
        metrics: true,
        metrics_lock_id: false,
        stall_patience: None,
        expire_stopped_holders: false,
    };

    /// Settles the timings a lease derives (those not set explicitly) and derives the
    /// lease, or says why it cannot hold.
    pub(crate) fn with_lease(mut self) -> (Self, Result<Option<Lease>, LeaseError>) {
        // Keepalives turned off explicitly turn the default lease off with them; a
        // lease asked for explicitly is refused without keepalives.
        if self.keepalive_set && self.keepalive.is_none() && !self.lease_set {
            self.lease = None;
        }
        let Some(duration) = self.lease else {
            if self.expire_stopped_holders {
                let refused = LeaseError::new(
                    "expire_stopped_holders(true) needs a lease: a stopped holder's session \
                     is ended after the lease's server bound, and without a lease there is \
                     none (lease(None), or keepalive(None) without an explicit lease)"
                        .to_owned(),
                );
                return (self, Err(refused));
            }
            return (self, Ok(None));
        };
        let (keepalive, answer_timeout) = crate::lease::client_defaults(
            duration,
            Self::DEFAULT_KEEPALIVE,
            Self::DEFAULT_ANSWER_TIMEOUT,
        );
        if !self.keepalive_set {
            self.keepalive = Some(keepalive);
        }
        if !self.answer_timeout_set {
            self.answer_timeout = answer_timeout;
        }
        let lease = Lease::derive(
            duration,
            self.lease_margin,
            self.keepalive,
            self.answer_timeout,
            self.stall_patience.unwrap_or(Duration::ZERO),
            self.health_check_interval,
        );
        let stopped = self.expire_stopped_holders;
        let lease = lease.map(|lease| {
            Some(if stopped {
                lease.expiring_stopped_holders()
            } else {
                lease
            })
        });
        (self, lease)
    }
}

/// The prefix of the `application_name` of lock connections of managers with a
/// holder id: `locks:<holder id>`.
pub const HOLDER_APPLICATION_NAME_PREFIX: &str = "locks:";

/// The most of an `application_name` the server keeps: 63 bytes (`NAMEDATALEN` - 1).
const APPLICATION_NAME_BYTES: usize = 63;

/// `locks:<holder id>` as the server will keep it: the whole holder id when the name can
/// carry it as it is (at most 63 bytes, the server's limit, and no NUL byte, which the
/// protocol cannot carry); else the id's start (NUL bytes left out, cut at a character
/// boundary), `#` and 16 hex digits of [`lock_id`](locks_port::lock_id) of the whole id,
/// 63 bytes at most. So two holder ids publish two names, however alike their first
/// bytes: a shard group's members end a stopped member's sessions by its name.
pub(crate) fn published_holder_id(holder_id: &str) -> String {
    let whole = format!("{HOLDER_APPLICATION_NAME_PREFIX}{holder_id}");
    if whole.len() <= APPLICATION_NAME_BYTES && !holder_id.contains('\0') {
        return whole;
    }
    let hash = format!("#{:016x}", locks_port::lock_id(holder_id));
    let mut name = String::from(HOLDER_APPLICATION_NAME_PREFIX);
    for c in holder_id.chars().filter(|c| *c != '\0') {
        if name.len() + c.len_utf8() + hash.len() > APPLICATION_NAME_BYTES {
            break;
        }
        name.push(c);
    }
    name.push_str(&hash);
    name
}
