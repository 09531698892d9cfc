#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod election;
pub mod metrics;
mod observe;

pub use election::{
    DEFAULT_BACKOFF, DEFAULT_TAKEOVER_DELAY, LeaderElection, Leadership, TermEnd, retire_live_term,
};
pub use observe::{DEFAULT_WATCH_INTERVAL, Leader, LeaderWatch, NoBoard, leading_name};

/// The port this crate runs on, re-exported so one dependency is enough.
pub use locks_port;
/// Re-exported so callers name the same [`Meter`](opentelemetry::metrics::Meter) type as
/// [`LeaderElection::meter`].
pub use opentelemetry;
/// Re-exported: terms start at a `time::OffsetDateTime`.
pub use time;
