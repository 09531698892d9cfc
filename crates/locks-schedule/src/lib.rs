#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod claim;
#[cfg(feature = "tokio")]
mod every_slot;
mod ledger;
mod memory;
pub mod metrics;
mod outcome;
mod parse;
mod policy;
mod runner;
mod schedule;

pub use claim::{Claim, Decision, SlotKind, SlotRow};
#[cfg(feature = "tokio")]
pub use every_slot::{CLOCK_RETRY_PAUSE, MAX_NAP};
pub use ledger::{
    Attempt, ClaimAnswer, Ledger, LedgerError, MAX_JOB_NAME, Outcome, RunRecord, check_holder,
    check_job_name, recorded_detail,
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
