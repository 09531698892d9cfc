//! The guard of a held permit and its watch: the connection checked every health-check
//! interval (ended: lost) and pinged every keepalive cadence (no answer: lost), as a
//! held lock's.

use std::fmt;
use std::sync::{Arc, Weak};

use locks_port::{LossNotifier, LostReason, LostSignal, PermitGuard, PermitInfo, ReleaseOutcome};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;
use tokio_postgres::CancelToken;

use super::sql;
use crate::connect::{Canceller, connection_ended};
use crate::connection::Session;
use crate::manager::Inner;

/// Sends a cancel request (with the pool's TLS connector) for the statement in flight if
/// dropped before [`disarm`](Self::disarm): a dropped wait leaves the server's queue at
/// once.
pub(super) struct CancelOnDrop<'a>(Option<(&'a Canceller, CancelToken)>);

impl<'a> CancelOnDrop<'a> {
    pub(super) fn new(canceller: &'a Canceller, token: CancelToken) -> Self {
        Self(Some((canceller, token)))
    }

    pub(super) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some((canceller, token)) = self.0.take() {
            canceller.cancel(token);
        }
    }
}

/// What the guard and its watch share.
struct Shared {
    inner: Arc<Inner>,
    name: Arc<str>,
    /// The semaphore's class (for the metrics).
    class: i32,
    /// The permit's connection; `None` once released or lost.
    session: AsyncMutex<Option<Session>>,
    notifier: LossNotifier,
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
        let notifier = LossNotifier::new();
        let lost = notifier.signal();
        inner.metrics().permits_changed(1);
        let shared = Arc::new(Shared {
            inner,
            name: Arc::from(info.name()),
            class,
            session: AsyncMutex::new(Some(session)),
            notifier,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(watch(Arc::downgrade(&shared)));
        }
        Self { shared, info, lost }
    }
}

/// Frees the permit on its connection and gives the connection back; closes it when
/// the unlock is not confirmed.
async fn release(shared: &Shared) -> ReleaseOutcome {
    let session = shared.session.lock().await.take();
    let Some(session) = session else {
        return match shared.notifier.signal().reason() {
            Some(reason) if reason != LostReason::Released => ReleaseOutcome::Lost(reason),
            _ => ReleaseOutcome::AlreadyReleased,
        };
    };
    shared.inner.metrics().permits_changed(-1);
    let object = session.object();
    let answer = tokio::time::timeout(shared.inner.settings().answer_timeout, async {
        let statement = object.prepare_cached(sql::LEAVE).await?;
        let row = object.query_one(&statement, &[&session.marker()]).await?;
        row.try_get::<_, Option<bool>>(0)
    })
    .await;
    let outcome = if matches!(answer, Ok(Ok(Some(true)))) {
        session.into_pool();
        ReleaseOutcome::Unlocked
    } else {
        if session.is_closed() {
            // The session had ended under the holder before the watch saw it: the
            // permit was lost while held, and the loss counts say so.
            shared
                .inner
                .permit_lost(shared.class, LostReason::ConnectionClosed);
        }
        session.close();
        ReleaseOutcome::SessionClosed
    };
    shared.notifier.notify(LostReason::Released);
    outcome
}

/// Watches one permit's connection until it is released or lost.
async fn watch(shared: Weak<Shared>) {
    let Some((check, keepalive)) = shared.upgrade().map(|shared| {
        let settings = shared.inner.settings();
        (settings.health_check_interval, settings.keepalive)
    }) else {
        return;
    };
    let mut last_answer = Instant::now();
    let mut ended = connection_ended();
    loop {
        // A connection of this crate's pools that ends says so at once: look now.
        tokio::select! {
            () = tokio::time::sleep(check) => {}
            _ = ended.changed() => {}
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut slot = shared.session.lock().await;
        let Some(session) = slot.as_ref() else {
            return;
        };
        if session.is_closed() {
            slot.take();
            drop(slot);
            shared.lose(LostReason::ConnectionClosed);
            tracing::warn!(
                semaphore = %shared_name(&shared),
                reason = LostReason::ConnectionClosed.as_str(),
                "permit lost"
            );
            return;
        }
        let due = keepalive.is_some_and(|cadence| last_answer.elapsed() >= cadence);
        if due {
            let object = session.object();
            let answer = tokio::time::timeout(shared.inner.settings().answer_timeout, async {
                let statement = object.prepare_cached(sql::PING).await?;
                object.query_one(&statement, &[&session.marker()]).await
            })
            .await;
            if matches!(answer, Ok(Ok(_))) {
                last_answer = Instant::now();
            } else {
                let reason = if session.is_closed() {
                    LostReason::ConnectionClosed
                } else {
                    LostReason::KeepaliveFailed
                };
                if let Some(session) = slot.take() {
                    session.close();
                }
                drop(slot);
                shared.lose(reason);
                tracing::warn!(
                    semaphore = %shared_name(&shared),
                    reason = reason.as_str(),
                    "permit lost"
                );
                return;
            }
        }
    }
}

impl Shared {
    /// The permit was lost (its session already taken out): counted, then its guard told.
    fn lose(&self, reason: LostReason) {
        self.inner.metrics().permits_changed(-1);
        self.inner.permit_lost(self.class, reason);
        self.notifier.notify(reason);
    }
}

/// The semaphore's name for events, unless the manager keeps keys out of them.
fn shared_name(shared: &Shared) -> &str {
    shared.inner.shown(&shared.name).unwrap_or("")
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
        // Released or lost: nothing to do. (Busy: the watch is pinging; release after it.)
        if self
            .shared
            .session
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
                if let Ok(mut slot) = shared.session.try_lock()
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
