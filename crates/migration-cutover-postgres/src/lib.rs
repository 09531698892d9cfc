#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod db;
mod migrations;
mod name;
mod pause;
mod router;
mod routing;
mod schema;
mod store;

pub use migrations::PostgresMigrationRepository;
pub use name::{InvalidName, TableName};
pub use pause::{
    PauseRecord, PostgresPauseGuard, PostgresWritePause, PostgresWritePermit, WRITE_LOCK_OPERATION,
    write_lock_id,
};
pub use router::{PostgresWriteReceipt, PostgresWriteRouter};
pub use routing::PostgresRoutingRepository;
pub use schema::{SchemaError, install_fleet, install_store};
pub use store::PostgresEventStore;

/// The ports bundle of a fleet on PostgreSQL: PostgreSQL event stores, routing table,
/// write pause and migration records.
pub type PostgresMigrationPorts = migration_cutover::MigrationPorts<
    PostgresEventStore,
    PostgresRoutingRepository,
    PostgresWritePause,
    PostgresMigrationRepository,
>;

/// Re-exported so callers name the same versions as this crate.
pub use deadpool_postgres;
pub use migration_cutover;
pub use tokio_postgres;
