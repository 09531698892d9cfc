#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod errors;
mod ledger;

pub use ledger::{
    DEFAULT_ANSWER_TIMEOUT, LEDGER_SCHEMA, LEDGER_TABLE, PostgresLedger, install_ledger,
};

/// Re-exported so callers build the pool with the same versions as the ledger.
pub use deadpool_postgres;
/// The schedule crate this ledger serves, re-exported so one dependency is enough.
pub use locks_schedule;
/// Re-exported so callers can inspect driver errors (`SqlState`, `Error::code`).
pub use tokio_postgres;
