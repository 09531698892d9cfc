//! A pool for the lock manager from a URL, for plain-TCP and Unix-socket set-ups.

use std::str::FromStr;

use deadpool_postgres::{BuildError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

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

/// A pool of at most `max_size` connections to `url`, without TLS, with the Tokio
/// runtime set (so pool timeouts work) and `RecyclingMethod::Fast`. Does no I/O:
/// connections open on first use.
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
/// # Errors
/// [`PoolConfigError::Build`] if deadpool refuses the configuration.
pub fn plain_pool_with_config(
    config: tokio_postgres::Config,
    max_size: usize,
) -> Result<Pool, PoolConfigError> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(PoolConfigError::Build)
}
