#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod classify;
mod connection;
mod guard;
mod inspect;
mod manager;
mod pool;
mod sql;
mod telemetry;
mod xact;

pub use guard::PostgresLockGuard;
pub use inspect::{AdvisoryLockId, InspectError, LockHolder, all_lock_holders, lock_holders};
pub use manager::{KeyVisibility, PostgresLockManager, PostgresLockManagerBuilder};
pub use pool::{PoolConfigError, plain_pool, plain_pool_with_config};
pub use xact::{AdvisoryLockMode, TransactionLockError, TransactionLocks};

/// Re-exported so callers build the pool with the same versions as the manager.
pub use deadpool_postgres;
/// The port this adapter implements, re-exported so one dependency is enough.
pub use locks_port;
/// Re-exported so callers can inspect driver errors (`SqlState`, `Error::code`).
pub use tokio_postgres;
