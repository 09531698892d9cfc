//! The lost-lock monitor's state, kept in the manager: whether the monitor task runs,
//! the per-reason counts of lost locks, and the held connections outside the book (a
//! semaphore's permits). What the monitor does with it is a floor up, in `monitor.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use locks_port::{LossNotifier, LostReason};
use tokio::time::Instant;

use crate::connection::Session;
use crate::metrics::Metrics;
use crate::settings::KeyVisibility;
use crate::slot::{SessionSlot, new_slot};

/// How many locks a manager lost, by reason (see
/// [`PostgresLockManager::lost_lock_counts`](crate::PostgresLockManager::lost_lock_counts)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostLockCounts {
    /// The session ended ([`LostReason::ConnectionClosed`]).
    pub connection_closed: u64,
    /// A keepalive got no answer in time ([`LostReason::KeepaliveFailed`]).
    pub keepalive_failed: u64,
}

impl LostLockCounts {
    /// Every loss.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.connection_closed + self.keepalive_failed
    }
}

/// The monitor's state in the manager.
#[derive(Default)]
pub(crate) struct Health {
    /// Whether the monitor task runs.
    pub(crate) monitor_running: AtomicBool,
    pub(crate) lost: LostCounts,
    /// The held connections outside the bookkeeping (permits), while held.
    watched: Mutex<Vec<Weak<Watched>>>,
}

impl Health {
    pub(crate) fn watched(&self) -> MutexGuard<'_, Vec<Weak<Watched>>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A held connection outside the bookkeeping, of a strategy that holds a session of its
/// own (a semaphore's permit: its slot lock). The monitor looks at it and keeps it alive
/// exactly as it does a lock's connection, and is the one that decides it is lost: the
/// session is taken out of the slot and discarded, the loss counted, the strategy told
/// ([`Holder`]), the owner's signal fired.
pub(crate) struct Watched {
    slot: SessionSlot,
    notifier: LossNotifier,
    /// What the strategy counts and says of this holder.
    pub(crate) holder: Box<dyn Holder>,
}

/// What a strategy with a session of its own per holder (the semaphore's) adds to the
/// monitor's own work when one of its holders is lost: its instruments and its event.
/// The monitor decides the loss, counts it in the manager's lost-lock counts and fires
/// the owner's signal; the strategy says nothing about whether a holder is lost.
pub(crate) trait Holder: Send + Sync {
    /// The holder's session was taken from it by the monitor (the holder no longer
    /// holds anything): a held-count gauge goes down here.
    fn gone(&self, metrics: &Metrics);

    /// The holder was lost for `reason`, by the monitor or found at its release: the
    /// strategy's loss instrument and event.
    fn lost(&self, metrics: &Metrics, keys: KeyVisibility, reason: LostReason);
}

impl Watched {
    pub(crate) fn new(session: Session, holder: Box<dyn Holder>) -> Arc<Self> {
        Arc::new(Self {
            slot: new_slot(session),
            notifier: LossNotifier::new(),
            holder,
        })
    }

    /// The session, `None` once released or lost.
    pub(crate) fn slot(&self) -> &SessionSlot {
        &self.slot
    }

    pub(crate) fn notifier(&self) -> &LossNotifier {
        &self.notifier
    }

    /// Whether a keepalive is due (see [`crate::slot::Slot::keepalive_due`]).
    pub(crate) fn keepalive_due(&self, now: Instant, cadence: Duration) -> bool {
        self.slot.keepalive_due(now, cadence)
    }

    /// The connection answered a keepalive at `now`.
    pub(crate) fn answered(&self, now: Instant) {
        self.slot.answered(now);
    }
}

#[derive(Default)]
pub(crate) struct LostCounts {
    connection_closed: AtomicU64,
    keepalive_failed: AtomicU64,
}

impl LostCounts {
    pub(crate) fn counter(&self, reason: LostReason) -> &AtomicU64 {
        match reason {
            LostReason::KeepaliveFailed => &self.keepalive_failed,
            _ => &self.connection_closed,
        }
    }

    /// Adds `count` losses of `reason`.
    pub(crate) fn add(&self, reason: LostReason, count: u64) {
        self.counter(reason).fetch_add(count, Ordering::AcqRel);
    }

    pub(crate) fn snapshot(&self) -> LostLockCounts {
        LostLockCounts {
            connection_closed: self.connection_closed.load(Ordering::Relaxed),
            keepalive_failed: self.keepalive_failed.load(Ordering::Relaxed),
        }
    }
}
