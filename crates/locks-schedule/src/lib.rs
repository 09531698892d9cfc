#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod ledger;
mod memory;
pub mod metrics;
mod policy;
mod runner;
mod schedule;

pub use ledger::{
    Attempt, Claim, ClaimAnswer, Decision, Ledger, LedgerError, Outcome, RunRecord, SlotKind,
    SlotRow,
};
pub use memory::{Clock, ManualClock, MemoryLedger, SystemClock};
pub use policy::{CrashPolicy, MissedSlots, Overlap};
pub use runner::{JobContext, RunError, RunReport, ScheduledJob, Verdict};
pub use schedule::{MAX_COUNTED_SLOTS, MAX_PERIOD, MIN_PERIOD, Schedule, ScheduleError, Slot};

/// The port this crate runs on, re-exported so one dependency is enough.
pub use locks_port;
/// Re-exported so callers name the same [`Meter`](opentelemetry::metrics::Meter) type as
/// [`ScheduledJob::meter`].
pub use opentelemetry;
/// Re-exported: slots and ledger times are `time::OffsetDateTime`.
pub use time;

#[cfg(feature = "conformance")]
pub mod conformance;
