#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod config;
mod context;
mod coordinator;
mod copy;
mod error;
mod memory;
mod nolock;
mod ports;
mod report;
mod router;
mod state;
#[cfg(feature = "testing")]
pub mod testing;
mod timer;

pub use config::{ConfigError, MigrationConfig};
pub use context::{MigrationPorts, Stores};
pub use coordinator::{CUTOVER_LOCK_OPERATION, CUTOVER_STEP_TARGET, MigrationCoordinator};
pub use error::{
    CutoverError, CutoverFailureReason, CutoverTimeout, LagTooHigh, MigrationError, StateError,
    StoreFailure, WriteError,
};
pub use memory::{
    InMemoryEventStore, InMemoryMigrationRepository, InMemoryPauseGuard, InMemoryRoutingRepository,
    InMemoryWritePause, InMemoryWritePermit,
};
pub use nolock::{NoLockGuard, NoLockManager};
pub use ports::{
    Event, EventStore, Migration, MigrationRepository, PauseGuard, RepositoryError,
    RoutingRepository, StoreError, StoreId, StoredEvent, TenantRoute, WritePause, WritesPaused,
};
pub use report::{CopyReport, CutoverOutcome, CutoverReadiness, CutoverResult, NotReady, SyncLag};
pub use router::{WriteReceipt, WriteRouter};
pub use state::{Phase, RoutingState, TransitionError};

/// Re-exported so callers name the same lock port, `time` and `uuid` as this crate.
pub use locks_port;
pub use locks_port::{time, uuid};
