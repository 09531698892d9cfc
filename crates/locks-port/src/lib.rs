#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod error;
mod info;
mod key;
mod lock;
mod options;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use error::{
    AcquisitionErrorKind, BoxError, LockAcquisitionError, LockError, LockNotHeldError,
    timeout_reason,
};
pub use info::LockInfo;
pub use key::{DEFAULT_MIGRATION_OPERATION, KeyDerivation, lock_id, migration_lock_key};
pub use lock::{DistributedLock, LockGuard, LockRegistry, ReleaseOutcome};
pub use options::{AcquireOptions, InvalidTimeoutError, WaitStrategy};

/// Re-exported so callers name the same `time` and `uuid` versions as the port.
pub use time;
pub use uuid;
