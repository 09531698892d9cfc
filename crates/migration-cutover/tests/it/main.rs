//! The integration tests of `migration-cutover`, on the in-memory adapters and the
//! in-memory lock manager.

mod contract;
mod failures;
mod happy_path;
mod held_lock;
mod lost_lock;
mod no_lock;
mod ordering;
mod paused_writes;
mod start;
mod support;
