#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod assign;
mod assignment;
#[cfg(feature = "conformance")]
pub mod conformance;
mod group;
mod member;
mod membership;
pub mod metrics;
mod observe;
mod renewal;
mod task;
mod terms;

pub use assign::target_share;
pub use group::{MAX_NAME_BYTES, MAX_SHARDS, MIN_MEMBER_SLOTS, ShardGroup};
pub use member::{
    DEFAULT_BACKOFF, DEFAULT_REJOIN_WAIT, DEFAULT_RENEWAL_EXPIRY, DEFAULT_TICK, MIN_RENEWAL_EXPIRY,
    ShardMember,
};
pub use observe::{DEFAULT_WATCH_INTERVAL, ShardOwner, ShardWatch, Shards, owners, owners_by_name};
pub use task::{DEFAULT_DRAIN_GRACE, DEFAULT_TAKEOVER_DELAY, Owned};
pub use terms::{Begun, MemoryTerms, ShardTerms, Term, carried_loss_notice};

/// The port this crate runs on, re-exported so one dependency is enough.
pub use locks_port;
/// Re-exported so callers name the same [`Meter`](opentelemetry::metrics::Meter) type as
/// [`ShardMember::meter`].
pub use opentelemetry;
/// Re-exported: terms begin at a `time::OffsetDateTime`.
pub use time;
