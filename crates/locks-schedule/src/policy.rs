//! The policies of a scheduled job: overlap, crash and missed slots.

use std::num::NonZeroU32;
use std::time::Duration;

/// What a firing does when the job's lock is held (an earlier slot's run still going).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Overlap {
    /// Give up at once: the firing reports [`Verdict::Busy`](crate::Verdict::Busy). The
    /// default.
    Skip,
    /// Wait up to this long for the lock, then claim the slot the ledger's clock is in
    /// (read again once the lock is taken), settling the slot before that one.
    Wait(Duration),
    /// Run beside it: each slot has a lock of its own, so only runs of the same slot
    /// exclude each other.
    Allow,
}

/// What a run that did not finish (its runner died, or it failed) means for its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPolicy {
    /// The slot counts as done: a dead runner's row is marked `abandoned` by the next
    /// runner that holds the lock, and a failed run is not retried. The default.
    AtMostOnce,
    /// Another firing (in the slot, or in the next one) runs it again once the lock is
    /// free, up to `max_attempts` attempts in all; the job sees its attempt number and the
    /// previous outcome.
    AtLeastOnce {
        /// Attempts in all, the first included.
        max_attempts: NonZeroU32,
    },
}

/// What a firing does about the slot before the current one when nobody fired in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissedSlots {
    /// Record it as `missed` and run only the current slot. The default.
    Skip,
    /// Run the latest missed slot once (never the ones before it: no burst), then the
    /// current one.
    RunLatest,
}
