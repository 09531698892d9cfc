//! The pool, the one room of the adapter that knows which pool library it uses
//! (deadpool-postgres; [`connect`] is its connector and cancel path): the pools this
//! crate builds from a URL ([`plain_pool`], [`tls_pool`]), the names the other rooms use
//! for the pool, a pooled connection and a checkout's failure, and the few pool
//! operations they need. Replacing or wrapping the pool changes this room (`pool/`); the
//! rest of the adapter names only what is here.

pub(crate) mod connect;

use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, Instant};

use deadpool_postgres::{BuildError, Manager, ManagerConfig, RecyclingMethod, Runtime, Timeouts};
use locks_port::{AcquisitionErrorKind, LockAcquisitionError};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{NoTls, Socket};

use crate::errors::{connect_kind, describe, pool_exhausted, unreachable};
use crate::limit::{Expired, Limit};
use connect::{Canceller, LockConnect, register};

/// A checked-out connection; it derefs to a [`tokio_postgres::Client`].
pub(crate) use deadpool_postgres::Object as Pooled;
/// What tells one pooled connection from another while both live.
pub(crate) use deadpool_postgres::ObjectId as PooledId;
/// The pool a manager takes its connections from.
pub(crate) use deadpool_postgres::Pool;
/// Why a checkout failed.
pub(crate) use deadpool_postgres::PoolError;

/// The identity of a pooled connection: its pool's id for it, and when it was made.
/// Together they name one connection for the life of the process.
pub(crate) fn identity(object: &Pooled) -> (PooledId, Instant) {
    (Pooled::id(object), Pooled::metrics(object).created)
}

/// The id of a pooled connection (see [`identity`]).
pub(crate) fn id(object: &Pooled) -> PooledId {
    Pooled::id(object)
}

/// Takes `object` out of its pool for good: dropping what this returns closes the
/// connection instead of giving it back.
pub(crate) fn detach(object: Pooled) -> deadpool_postgres::ClientWrapper {
    Pooled::take(object)
}

/// A checkout that waits for nobody: an idle connection, or a new one when the pool has
/// room (opening it is bounded by the caller), else [`is_busy`] at once.
pub(crate) fn idle_or_new(pool: &Pool) -> impl Future<Output = Result<Pooled, PoolError>> + '_ {
    static NO_WAIT: Timeouts = Timeouts {
        wait: Some(Duration::ZERO),
        create: None,
        recycle: None,
    };
    pool.timeout_get(&NO_WAIT)
}

/// A checkout that waits for a free slot as long as it takes; a connection opened or
/// recycled for it is bounded by `create` and `recycle` where the pool has a runtime
/// for timeouts (else by nothing of the pool's).
pub(crate) async fn free_slot(
    pool: &Pool,
    create: Duration,
    recycle: Duration,
) -> Result<Pooled, PoolError> {
    let bounded = Timeouts {
        wait: None,
        create: Some(create),
        recycle: Some(recycle),
    };
    match pool.timeout_get(&bounded).await {
        Err(PoolError::NoRuntimeSpecified) => pool.timeout_get(&Timeouts::default()).await,
        other => other,
    }
}

/// Closes the idle connections of `pool` not checked out for `for_at_least` (the pool
/// counts from a connection's last checkout, so one checked out that long ago goes too,
/// however briefly it has been idle).
pub(crate) fn close_idle(pool: &Pool, for_at_least: Duration) {
    drop(pool.retain(|_, metrics| metrics.last_used() < for_at_least));
}

/// The most connections `pool` opens.
pub(crate) fn max_size(pool: &Pool) -> usize {
    pool.status().max_size
}

/// Whether a checkout would find a connection free now: an idle one, or room to open
/// one. The pool's users are its checked-out connections, those being opened and the
/// checkouts waiting (`size - available + waiting`); `waiters` of those are known to be
/// waiting for a slot, so they take none yet.
pub(crate) fn has_room(pool: &Pool, waiters: usize) -> bool {
    let status = pool.status();
    let users = (status.size + status.waiting).saturating_sub(status.available);
    users.saturating_sub(waiters) < status.max_size
}

/// Whether a checkout failed only because every connection was in use.
pub(crate) fn is_busy(error: &PoolError) -> bool {
    matches!(
        error,
        PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)
    )
}

/// The port's kind for a pool checkout error (opening or recycling a connection).
pub(crate) fn checkout_kind(error: &PoolError) -> AcquisitionErrorKind {
    match error {
        PoolError::Backend(error) => connect_kind(error),
        PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) | PoolError::Closed => {
            AcquisitionErrorKind::PoolUnavailable
        }
        // Opening or recycling a connection took too long: the server is not answering.
        PoolError::Timeout(_) => AcquisitionErrorKind::Unreachable,
        PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => {
            AcquisitionErrorKind::Configuration
        }
    }
}

/// An acquisition error for a failed checkout. A driver error inside deadpool's
/// wrapper is unwrapped, so the chain does not repeat it ("Error occurred while
/// creating a new object: db error"): the source is the driver's own error.
pub(crate) fn checkout_error(key: &str, error: PoolError) -> LockAcquisitionError {
    let kind = checkout_kind(&error);
    let words = pool_error_words(&error);
    match error {
        PoolError::Backend(error) => LockAcquisitionError::described(key, kind, words, error),
        PoolError::Closed | PoolError::NoRuntimeSpecified => {
            LockAcquisitionError::new(key, kind, words)
        }
        other => LockAcquisitionError::new(key, kind, format!("Database error: {words}"))
            .with_source(other),
    }
}

/// Why a checkout failed, in the server's words when the server said why (`role "x"
/// does not exist (28000)`): deadpool's own `Display` of a driver error says only
/// "Error occurred while creating a new object: db error".
pub(crate) fn pool_error_words(error: &PoolError) -> String {
    match error {
        PoolError::Backend(error) => describe(error),
        PoolError::Closed => "the connection pool is closed".to_owned(),
        PoolError::NoRuntimeSpecified => {
            "the connection pool has no runtime (build it with Runtime::Tokio1)".to_owned()
        }
        other => other.to_string(),
    }
}

/// A pooled connection for one read, within the manager's connect timeout: waiting
/// for a free slot and opening a connection both count, so a read on a pool whose
/// every connection holds a lock fails ([`is_busy`]) instead of waiting for a release.
/// Bounded here rather than by the pool's own timeouts, so a pool built without a
/// runtime is bounded too.
///
/// A bound that passes while a connection is being opened (the pool had room, the
/// server did not answer) is a `Timeout(Create)`; only one that passes while every
/// connection stays in use is [`is_busy`]: an idle pool is never said to be full.
pub(crate) async fn for_one_read(pool: &Pool, bound: Duration) -> Result<Pooled, PoolError> {
    let limit = Limit::Since(tokio::time::Instant::now(), bound);
    // An idle connection, or a new one when the pool has room.
    match limit.run(idle_or_new(pool)).await {
        Ok(Err(error)) if is_busy(&error) => {}
        Ok(checked_out) => return checked_out,
        Err(Expired) => {
            return Err(PoolError::Timeout(deadpool_postgres::TimeoutType::Create));
        }
    }
    // Every connection in use: wait for one, within what is left of the bound.
    match limit.run(pool.get()).await {
        Ok(checked_out) => checked_out,
        Err(Expired) => Err(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)),
    }
}

/// [`for_one_read`] for a read made on behalf of `name` (a leader board's, a
/// semaphore's): a busy pool is [`AcquisitionErrorKind::PoolUnavailable`], saying what
/// the connection was `for`.
pub(crate) async fn for_one_read_of(
    pool: &Pool,
    bound: Duration,
    name: &str,
    what_for: &str,
) -> Result<Pooled, LockAcquisitionError> {
    for_one_read(pool, bound).await.map_err(|error| {
        if is_busy(&error) {
            let what = format!("no pool connection was free {what_for}");
            pool_exhausted(name, &what, max_size(pool), None)
        } else if matches!(
            error,
            PoolError::Timeout(deadpool_postgres::TimeoutType::Create)
        ) {
            unreachable(name, None, bound)
        } else {
            checkout_error(name, error)
        }
    })
}

/// Why [`plain_pool`] could not build a pool.
///
/// ```
/// use std::error::Error;
///
/// let error = locks_postgres::plain_pool("post gres://x", 4).unwrap_err();
/// // The message says where the URL goes wrong; the driver's error stays the source.
/// assert!(error.to_string().starts_with("invalid PostgreSQL URL: "), "{error}");
/// assert!(error.source().is_some());
///
/// let error = locks_postgres::plain_pool("postgres://app@localhost/app", 0).unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "a lock pool needs at least 1 connection (each held lock keeps one), not 0"
/// );
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolConfigError {
    /// The URL is not a valid PostgreSQL connection string. The message carries the
    /// parser's own words (`unexpected character at byte 4`), which the driver's error
    /// (the [`source`](std::error::Error::source)) keeps one level further down.
    #[error("invalid PostgreSQL URL: {}; expected postgres://user:password@host:port/dbname (or postgresql://…) or key=value settings such as host=localhost user=app dbname=app", url_detail(.0))]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// `max_size` was 0: no lock could ever be taken.
    #[error("a lock pool needs at least 1 connection (each held lock keeps one), not 0")]
    ZeroSize,
    /// The pool could not be built from it.
    #[error("could not build the connection pool: {0}")]
    Build(#[source] BuildError),
}

/// What is wrong with a URL, in the parser's words: the driver's own message says only
/// "invalid connection string" and leaves the position to its source.
fn url_detail(error: &tokio_postgres::Error) -> String {
    match std::error::Error::source(error) {
        Some(cause) => cause.to_string(),
        None => error.to_string(),
    }
}

/// How long opening a connection may take (TCP, TLS, start-up), unless the URL says.
pub const PLAIN_POOL_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// TCP keepalives of the pool's sockets, unless the URL says: first probe after 30 s
/// idle, then every 10 s; 3 unanswered probes close the socket. A network cut under
/// an unbounded wait is noticed within about a minute.
pub const PLAIN_POOL_KEEPALIVES_IDLE: Duration = Duration::from_secs(30);

/// A pool of at most `max_size` connections to `url`, without TLS, with the Tokio
/// runtime set (so pool timeouts work) and `RecyclingMethod::Fast`. Does no I/O:
/// connections open on first use.
///
/// Connections are bounded by default. A bounded
/// [`acquire`](locks_port::DistributedLock::acquire) opens its connection within its
/// own timeout (an `acquire(8 s)` against a silent server fails after 8 s, not 5 s).
/// Calls without a deadline of their own (`try_acquire`, an unbounded `acquire`) open
/// one within the manager's connect timeout
/// ([`connect_timeout`](crate::PostgresLockManagerBuilder::connect_timeout), 5 s). The
/// pool itself also bounds a checkout's create and recycle steps by
/// [`PLAIN_POOL_CONNECT_TIMEOUT`] (5 s; `connect_timeout` in the URL overrides it) for
/// other users of the pool, and its sockets use TCP keepalives
/// ([`PLAIN_POOL_KEEPALIVES_IDLE`], every 10 s, 3 probes).
///
/// Each held lock keeps one connection: `max_size` is the most locks the manager can
/// hold at once, and must be at least 1.
///
/// For TLS, [`tls_pool`] is the same pool with a TLS connector; for other settings, build
/// the [`deadpool_postgres::Pool`] yourself (see
/// [`PostgresLockManagerBuilder::tls`](crate::PostgresLockManagerBuilder::tls)) and pass it to
/// [`PostgresLockManager::new`](crate::PostgresLockManager::new).
///
/// # Errors
/// [`PoolConfigError::InvalidUrl`] for a malformed URL, [`PoolConfigError::ZeroSize`]
/// for `max_size` 0, [`PoolConfigError::Build`] if deadpool refuses the configuration.
///
/// ```
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 8)?;
/// assert_eq!(pool.status().max_size, 8);
/// assert!(locks_postgres::plain_pool("not a url", 8).is_err());
/// # Ok::<(), locks_postgres::PoolConfigError>(())
/// ```
pub fn plain_pool(url: &str, max_size: usize) -> Result<Pool, PoolConfigError> {
    let config = tokio_postgres::Config::from_str(url).map_err(PoolConfigError::InvalidUrl)?;
    plain_pool_with_config(config, max_size)
}

/// [`plain_pool`] from a [`tokio_postgres::Config`], for settings a URL does not carry
/// conveniently (keepalives, `application_name` per instance, server options).
///
/// ```
/// use std::time::Duration;
/// use locks_postgres::tokio_postgres::Config;
///
/// let mut config: Config = "postgres://app@localhost/app".parse()?;
/// config.connect_timeout(Duration::from_secs(2)).application_name("nightly");
/// let pool = locks_postgres::plain_pool_with_config(config, 4)?;
/// assert_eq!(pool.status().max_size, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`PoolConfigError::ZeroSize`] for `max_size` 0, [`PoolConfigError::Build`] if
/// deadpool refuses the configuration.
pub fn plain_pool_with_config(
    config: tokio_postgres::Config,
    max_size: usize,
) -> Result<Pool, PoolConfigError> {
    tls_pool(config, NoTls, max_size)
}

/// [`plain_pool_with_config`] with TLS: connections opened with `tls` (for example
/// `tokio_postgres_rustls::MakeRustlsConnect`), and cancel requests sent with it too, so
/// a dropped wait leaves the server's queue at once even where the server accepts TLS
/// connections only (`sslmode=require`). The same defaults: connect timeout
/// [`PLAIN_POOL_CONNECT_TIMEOUT`] and TCP keepalives unless `config` says otherwise,
/// the Tokio runtime, `RecyclingMethod::Fast`. Does no I/O.
///
/// ```
/// use locks_postgres::tokio_postgres::{Config, NoTls};
///
/// let config: Config = "postgres://app@localhost/app?sslmode=disable".parse()?;
/// let pool = locks_postgres::tls_pool(config, NoTls, 4)?;
/// assert_eq!(pool.status().max_size, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`PoolConfigError::ZeroSize`] for `max_size` 0, [`PoolConfigError::Build`] if deadpool
/// refuses the configuration.
pub fn tls_pool<T>(
    mut config: tokio_postgres::Config,
    tls: T,
    max_size: usize,
) -> Result<Pool, PoolConfigError>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    if max_size == 0 {
        return Err(PoolConfigError::ZeroSize);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(PLAIN_POOL_CONNECT_TIMEOUT);
    }
    let connect_timeout = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(PLAIN_POOL_CONNECT_TIMEOUT);
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        // The driver's default (two hours) notices nothing in time.
        config
            .keepalives(true)
            .keepalives_idle(PLAIN_POOL_KEEPALIVES_IDLE)
            .keepalives_interval(Duration::from_secs(10))
            .keepalives_retries(3);
    }
    let manager = Manager::from_connect(
        config,
        LockConnect::new(tls.clone()),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(connect_timeout))
        .recycle_timeout(Some(connect_timeout))
        .build()
        .map_err(PoolConfigError::Build)?;
    register(&pool, Canceller::with(tls));
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    #[test]
    fn a_malformed_url_says_where_once() {
        let error = plain_pool("post gres://x", 4).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, PoolConfigError::InvalidUrl(_)));
        let driver = error.source().expect("the driver's error is the source");
        assert!(driver.downcast_ref::<tokio_postgres::Error>().is_some());
        let detail = driver.source().expect("the parser's words").to_string();
        assert!(text.starts_with(&format!("invalid PostgreSQL URL: {detail}; expected ")));
        assert!(detail.contains("byte"), "{detail}");
        assert!(!text.contains(&driver.to_string()), "no text twice: {text}");
    }

    #[test]
    fn zero_connections_are_refused() {
        let url = "postgres://app@localhost/app";
        assert!(matches!(plain_pool(url, 0), Err(PoolConfigError::ZeroSize)));
        let config: tokio_postgres::Config = url.parse().unwrap();
        assert!(matches!(
            plain_pool_with_config(config, 0),
            Err(PoolConfigError::ZeroSize)
        ));
        assert_eq!(plain_pool(url, 1).unwrap().status().max_size, 1);
    }
}
