#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod binaries;
mod cluster;
mod error;
mod netns;
mod patroni;
mod pgbouncer;
mod process;
mod replication;
mod shared;
#[cfg(feature = "testing")]
pub mod testing;
mod watchdog;

pub use binaries::BINDIR_ENV;
pub use cluster::{Builder, ThrowawayPostgres};
pub use error::Error;
pub use netns::{NetworkError, NetworkPair};
pub use patroni::PatroniCluster;
pub use pgbouncer::{PGBOUNCER_ENV, PgBouncer, PgBouncerBuilder, PgBouncerError, PoolMode};
pub use replication::{PrimaryWithStandby, ReplicationBuilder};
pub use shared::{DATABASE_URL_ENV, database_url, shared_cluster};
