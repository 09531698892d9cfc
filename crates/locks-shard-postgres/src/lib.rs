#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod errors;
mod guard;
mod members;
mod terms;

pub use guard::{GUARD_WRITE, guard_write};
pub use members::{MEMBERS_SCHEMA, MEMBERS_TABLE, MEMBERS_UPGRADE};
pub use terms::{
    DEFAULT_ANSWER_TIMEOUT, PostgresShardTerms, TERMS_SCHEMA, TERMS_TABLE, TERMS_UPGRADE,
    install_shard_terms, shard_tables_need_upgrade,
};

/// Re-exported so callers build the pool with the same versions as the store.
pub use deadpool_postgres;
/// The shard crate this store serves, re-exported so one dependency is enough.
pub use locks_shard;
/// Re-exported: [`guard_write`] takes a `tokio_postgres::Transaction`.
pub use tokio_postgres;
