#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod board;
mod book;
mod faults;
mod guard;
mod manager;
mod many;
mod semaphore;
mod semaphore_table;
mod table;

pub use guard::InMemoryLockGuard;
pub use manager::{InMemoryLockManager, InMemoryLockManagerBuilder};
pub use many::InMemoryLockGroup;

/// The old name of [`InMemoryLockGroup`]; kept for one release.
#[deprecated(since = "0.2.0", note = "renamed to `InMemoryLockGroup`")]
pub type InMemoryLocks = InMemoryLockGroup;
pub use semaphore::InMemoryPermit;
pub use table::InMemoryLockTable;

/// Re-exported so callers name the same port version (traits, options, errors).
pub use locks_port;
