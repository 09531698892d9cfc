#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod error;
mod health;
mod info;
mod key;
mod leader;
mod lock;
mod many;
mod options;
mod semaphore;

pub use error::{
    AcquisitionErrorKind, BoxError, LockAcquisitionError, LockError, LockLostError,
    LockNotHeldError, timeout_reason,
};
pub use health::{LossNotifier, Lost, LostReason, LostSignal};
pub use info::LockInfo;
pub use key::{
    DEFAULT_MIGRATION_OPERATION, KeyDerivation, check_key, lock_id, lock_order_with,
    migration_lock_key, migration_lock_key_for,
};
pub use leader::{
    LeaderBoard, MAX_BOARD_NAME, MAX_PUBLISHED_VALUE, Proclamation, check_board_name,
    check_published_value, check_stored_text, stored_time,
};
pub use lock::{DistributedLock, LockGuard, LockRegistry, ReleaseOutcome};
pub use many::{AcquireMany, LockGroup, owned_keys};
pub use options::{AcquireOptions, InvalidTimeoutError, LockMode, WaitStrategy, deadline_after};
pub use semaphore::{
    MAX_PERMITS, PermitDerivation, PermitGuard, PermitHolder, PermitHolders, PermitInfo, Semaphore,
    check_permits, permits_disagree,
};

/// The lock API in one `use`: `use locks_port::prelude::*;` (or the adapter's
/// re-export, `use locks_postgres::prelude::*;`). The traits, so their methods are in
/// scope, and the types every call names.
pub mod prelude {
    pub use crate::{
        AcquireMany, AcquireOptions, AcquisitionErrorKind, DistributedLock, LockAcquisitionError,
        LockError, LockGroup, LockGuard, LockInfo, LockMode, LockRegistry, LostReason, LostSignal,
        PermitGuard, PermitInfo, ReleaseOutcome, Semaphore, WaitStrategy, lock_id,
        migration_lock_key_for,
    };
    pub use uuid::Uuid;
}

/// Re-exported so callers name the same `time` and `uuid` versions as the port.
pub use time;
pub use uuid;
