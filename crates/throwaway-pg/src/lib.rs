#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod binaries;
mod cluster;
mod error;
mod process;
mod replication;
mod shared;
mod watchdog;

pub use binaries::BINDIR_ENV;
pub use cluster::{Builder, ThrowawayPostgres};
pub use error::Error;
pub use replication::{PrimaryWithStandby, ReplicationBuilder};
pub use shared::{DATABASE_URL_ENV, database_url, shared_cluster};
