//! A pool for the lock manager from a URL, for plain-TCP and Unix-socket set-ups.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{BuildError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{NoTls, Socket};

use crate::connect::{Canceller, LockConnect, register};

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
    #[error("invalid PostgreSQL URL: {}", url_detail(.0))]
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
        assert_eq!(text, format!("invalid PostgreSQL URL: {detail}"));
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
