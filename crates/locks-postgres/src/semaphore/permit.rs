//! The guard of a held permit. Its connection is watched by the manager's one
//! lost-lock monitor ([`crate::health::Watched`]), exactly as a held lock's: the monitor
//! decides when it is lost.

use std::fmt;
use std::sync::Arc;

use locks_port::{LostReason, LostSignal, PermitGuard, PermitInfo, ReleaseOutcome};

use crate::connection::Session;
use crate::health::{Holder, Watched};
use crate::inner::Inner;
use crate::limit::Limit;
use crate::metrics::Metrics;
use crate::settings::KeyVisibility;

/// What the guard and its release share.
struct Shared {
    inner: Arc<Inner>,
    /// The permit's connection (`None` once released or lost), as the monitor watches it.
    watched: Arc<Watched>,
}

/// A permit held through a [`PostgresLockManager`](crate::PostgresLockManager): a slot
/// lock on a connection of its own.
///
/// Dropping it releases the permit in the background (one statement, then the connection
/// goes back to the pool); without a Tokio runtime the connection is closed instead,
/// which frees the permit as well. [`lost`](PermitGuard::lost) fires when the connection
/// ends or stops answering its keepalive, as for a lock.
#[must_use = "dropping the permit releases it"]
pub struct PostgresPermit {
    shared: Arc<Shared>,
    info: PermitInfo,
    lost: LostSignal,
}

impl PostgresPermit {
    pub(super) fn new(inner: Arc<Inner>, session: Session, info: PermitInfo, class: i32) -> Self {
        let holder = PermitHolder {
            class,
            name: Box::from(info.name()),
        };
        let watched = Watched::new(session, Box::new(holder));
        let lost = watched.notifier().signal();
        inner.metrics().permits_changed(1);
        inner.watch(&watched);
        let shared = Arc::new(Shared { inner, watched });
        Self { shared, info, lost }
    }
}

/// What the monitor tells the semaphore of a permit it watches.
struct PermitHolder {
    /// The semaphore's class (for the permits' metrics) and name (for the event).
    class: i32,
    name: Box<str>,
}

impl Holder for PermitHolder {
    fn gone(&self, metrics: &Metrics) {
        metrics.permits_changed(-1);
    }

    fn lost(&self, metrics: &Metrics, keys: KeyVisibility, reason: LostReason) {
        metrics.permit_lost(self.class, reason);
        tracing::warn!(
            semaphore = %keys.shown(&self.name).unwrap_or(""),
            reason = reason.as_str(),
            "permit lost"
        );
    }
}

/// Frees the permit on its connection and gives the connection back; closes it when
/// the leave is not confirmed. Whether the permit was lost meanwhile is the monitor's
/// to say ([`Inner::watched_released`]).
async fn release(shared: &Shared) -> ReleaseOutcome {
    let session = shared.watched.slot().lock().await.take();
    let Some(mut session) = session else {
        return match shared.watched.notifier().signal().reason() {
            Some(reason) if reason != LostReason::Released => ReleaseOutcome::Lost(reason),
            _ => ReleaseOutcome::AlreadyReleased,
        };
    };
    shared.inner.metrics().permits_changed(-1);
    let limit = Limit::Waiting(shared.inner.settings().answer_timeout);
    let left = super::left(&mut session, limit).await;
    shared
        .inner
        .watched_released(&shared.watched, session, left)
}

impl PermitGuard for PostgresPermit {
    fn info(&self) -> &PermitInfo {
        &self.info
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Releases the permit now and reports how: `Unlocked`, `Lost(reason)` when it was
    /// lost before, `SessionClosed` when the unlock was not confirmed.
    ///
    /// # Cancel safety
    /// Dropping the future part-way closes the connection, which frees the permit.
    async fn release(self) -> ReleaseOutcome {
        release(&self.shared).await
    }
}

impl Drop for PostgresPermit {
    fn drop(&mut self) {
        // Released or lost: nothing to do. (Busy: the monitor is pinging; release after
        // it.)
        if self
            .shared
            .watched
            .slot()
            .try_lock()
            .is_ok_and(|slot| slot.is_none())
        {
            return;
        }
        let shared = Arc::clone(&self.shared);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    release(&shared).await;
                });
            }
            Err(_) => {
                if let Ok(mut slot) = shared.watched.slot().try_lock()
                    && slot.take().is_some()
                {
                    shared.inner.metrics().permits_changed(-1);
                }
            }
        }
    }
}

impl fmt::Debug for PostgresPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresPermit")
            .field("info", &self.info)
            .field("lost", &self.lost.reason())
            .finish()
    }
}
