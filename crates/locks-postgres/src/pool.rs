//! A pool for the lock manager from a URL, for plain-TCP and Unix-socket set-ups.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{BuildError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{NoTls, Socket};

use crate::connect::{Canceller, LockConnect, register};

/// Why [`plain_pool`] could not build a pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolConfigError {
    /// The URL is not a valid PostgreSQL connection string.
    #[error("invalid PostgreSQL URL: {0}")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// The pool could not be built from it.
    #[error("could not build the connection pool: {0}")]
    Build(#[source] BuildError),
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
/// Bounded by default: a connection must be open within
/// [`PLAIN_POOL_CONNECT_TIMEOUT`] (5 s; `connect_timeout` in the URL overrides it) and
/// a checkout's create and recycle steps within the same, and sockets use TCP
/// keepalives ([`PLAIN_POOL_KEEPALIVES_IDLE`], every 10 s, 3 probes).
///
/// For TLS, build the [`deadpool_postgres::Pool`] yourself with a TLS connector (for
/// example `tokio-postgres-rustls`) and pass it to
/// [`PostgresLockManager::new`](crate::PostgresLockManager::new).
///
/// Remember that each held lock keeps one connection: `max_size` is the most locks
/// the manager can hold at once. For TLS or other settings, build the
/// [`deadpool_postgres::Pool`] yourself and pass it to
/// [`PostgresLockManager::new`](crate::PostgresLockManager::new).
///
/// # Errors
/// [`PoolConfigError::InvalidUrl`] for a malformed URL, [`PoolConfigError::Build`] if
/// deadpool refuses the configuration.
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
/// [`PoolConfigError::Build`] if deadpool refuses the configuration.
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
/// [`PoolConfigError::Build`] if deadpool refuses the configuration.
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
