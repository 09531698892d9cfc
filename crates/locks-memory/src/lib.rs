#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod guard;
mod manager;
mod many;
mod semaphore;
mod table;

pub use guard::InMemoryLockGuard;
pub use manager::{InMemoryLockManager, InMemoryLockManagerBuilder};
pub use many::InMemoryLocks;
pub use semaphore::InMemoryPermit;
pub use table::InMemoryLockTable;

/// Re-exported so callers name the same port version (traits, options, errors).
pub use locks_port;
