#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod acquire;
mod board;
mod bookkeeping;
mod builder;
mod checkout;
mod connection;
mod errors;
mod fencing;
mod grant;
mod guard;
mod health;
mod inner;
mod inspect;
mod lease;
mod limit;
mod lock_ids;
mod lock_table;
mod manager;
mod many;
mod metrics;
mod mode_change;
mod monitor;
mod multiplex;
mod pool;
mod query;
mod release;
mod semaphore;
mod settings;
mod slot;
mod sql;
mod stall;
mod store;
mod telemetry;
mod watchdog;
mod xact;

pub use board::{
    LEADER_BOARD_INSTALL_KEY, LEADER_BOARD_SCHEMA, LEADER_BOARD_TABLE, install_leader_board,
};
pub use builder::PostgresLockManagerBuilder;
pub use fencing::{FENCING_INSTALL_KEY, FENCING_SCHEMA, FENCING_TABLE, install_fencing};
pub use guard::PostgresLockGuard;
pub use health::LostLockCounts;
pub use inspect::{AdvisoryLockId, InspectError, LockHolder, all_lock_holders, lock_holders};
pub use lease::{Lease, LeaseError, ServerTimers};
pub use lock_table::{LockTableGauge, LockTableUsage, is_lock_table_full, lock_table_usage};
/// The mode of a lock (exclusive or shared), the port's: named here too, as every
/// call that takes a mode does.
pub use locks_port::LockMode;
pub use manager::{ANNOUNCED_LOSS_NOTICE, PostgresLockManager};
pub use many::PostgresLockGroup;
pub use pool::connect::{CancelPath, LockConnect};

/// The old name of [`PostgresLockGroup`] (it read like a manager beside
/// `PostgresLockGuard`); kept for one release.
#[deprecated(since = "0.2.0", note = "renamed to `PostgresLockGroup`")]
pub type PostgresLocks = PostgresLockGroup;
pub use pool::{
    PLAIN_POOL_CONNECT_TIMEOUT, PLAIN_POOL_KEEPALIVES_IDLE, PoolConfigError, plain_pool,
    plain_pool_with_config, tls_pool,
};
pub use semaphore::{PostgresPermit, semaphore_holders};
pub use settings::{HOLDER_APPLICATION_NAME_PREFIX, KeyVisibility};
pub use store::{answer_within, holder_application_name, install_under_lock, server_words};
#[allow(deprecated)]
pub use xact::AdvisoryLockMode;
pub use xact::{TransactionLockError, TransactionLocks};

/// The lock API in one `use`: the port's traits and types (see
/// [`locks_port::prelude`]) and this adapter's manager.
///
/// ```
/// use locks_postgres::prelude::*;
///
/// fn _takes_locks<L: DistributedLock>(_locks: &L) {}
/// let _options = AcquireOptions::shared();
/// ```
pub mod prelude {
    pub use crate::{
        KeyVisibility, LockHolder, PostgresLockGuard, PostgresLockManager, TransactionLocks,
    };
    pub use locks_port::prelude::*;
}

/// Re-exported so callers build the pool with the same versions as the manager.
pub use deadpool_postgres;
/// The port this adapter implements, re-exported so one dependency is enough.
pub use locks_port;
/// Re-exported so callers name the same [`Meter`](opentelemetry::metrics::Meter) type as
/// [`PostgresLockManagerBuilder::meter`] (the API crate only, with its `metrics` feature).
pub use opentelemetry;
/// Re-exported so callers can inspect driver errors (`SqlState`, `Error::code`).
pub use tokio_postgres;
