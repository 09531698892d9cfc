//! One ownership term on its own tokio task: the takeover delay, the user's task, its
//! stop (dropped at once on a loss, drained within the grace on a hand-off), then the
//! term ended and the shard's lock released, in that order.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use locks_port::{LockAcquisitionError, LockGuard, LossNotifier, LostReason, LostSignal};
use opentelemetry::KeyValue;
use time::OffsetDateTime;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use crate::metrics::Instruments;
use crate::terms::ShardTerms;

/// What a shard's task is given: which shard it runs, and the term it runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Owned {
    /// The group's name.
    pub group: Arc<str>,
    /// The shard's name.
    pub shard: Arc<str>,
    /// The shard's index in the group's list.
    pub index: usize,
    /// The term's fencing token: carry it with every progress write, and let the store
    /// refuse a write whose token is not the shard's latest.
    pub token: i64,
    /// When the term began, by the term store's clock.
    pub since: OffsetDateTime,
}

impl Owned {
    /// A term as a member hands it to a task, for a task's own unit tests.
    #[must_use]
    pub fn new(
        group: impl Into<Arc<str>>,
        shard: impl Into<Arc<str>>,
        index: usize,
        token: i64,
        since: OffsetDateTime,
    ) -> Self {
        Self {
            group: group.into(),
            shard: shard.into(),
            index,
            token,
            since,
        }
    }
}

/// How long a task may go on after it was told to stop for a hand-off (its signal fired
/// with [`LostReason::Released`]) before its future is dropped.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(5);

/// How long a member that took a shard whose previous term did not end cleanly (its
/// owner died, or lost the lock) waits before starting the task, counted from the grant
/// of the shard's lock (the previous owner's session had ended by then), so that an
/// owner whose session was ended has noticed and stopped first: what an owner records
/// in its terms when its manager does not know how soon it is told of a loss, and what
/// the next owner waits when a term recorded nothing; as the leader's
/// `DEFAULT_TAKEOVER_DELAY`, above the PostgreSQL adapter's health-check interval (200 ms by
/// default). An owner whose manager knows
/// ([`loss_notice_bound`](locks_port::DistributedLock::loss_notice_bound): 100 ms on
/// `locks_postgres::plain_pool` and `tls_pool`) records that instead (no less than an
/// unended term before it recorded), and the next owner waits what was recorded. A shard
/// handed over cleanly starts at once.
pub const DEFAULT_TAKEOVER_DELAY: Duration = Duration::from_millis(500);

/// The user's task and the shard's guard of one term: dropped, the task's future goes
/// first and the guard (which releases the lock) after it, whatever drops it (a loss, a
/// hand-off, `run` dropped, the runtime shutting down).
struct Holding<Fut, G> {
    task: Option<Pin<Box<Fut>>>,
    guard: Option<G>,
}

impl<Fut, G> Drop for Holding<Fut, G> {
    fn drop(&mut self) {
        self.task = None;
        self.guard = None;
    }
}

/// A term running on its tokio task. Dropped, the tokio task is aborted: its future,
/// and with it the user's task then the guard, is dropped by the runtime.
#[derive(Debug)]
pub(crate) struct Running {
    handoff: Option<oneshot::Sender<()>>,
    handle: JoinHandle<()>,
    shard: Arc<str>,
    token: i64,
    /// The member's slot the term store records for the term.
    slot: u32,
    /// When the term began, by the store's clock.
    since: OffsetDateTime,
    /// Set once the term lost its lock and let it go (its tokio task about to return).
    lost: Arc<AtomicBool>,
    /// The lock's own signal: lost before the term has let it go.
    lock: LostSignal,
    /// Set once the term's tokio task ended (its end written or left unended).
    finished: Arc<AtomicBool>,
}

impl Running {
    /// The shard's name, the term's token and the member slot the store records for it.
    pub(crate) fn term(&self) -> (&str, i64, u32) {
        (&self.shard, self.token, self.slot)
    }

    /// When the term began, by the store's clock.
    pub(crate) fn since(&self) -> OffsetDateTime {
        self.since
    }

    /// The store now records the term under `slot` (its member joined again under it).
    pub(crate) fn rejoined(&mut self, slot: u32) {
        self.slot = slot;
    }

    /// Asks the term to hand over: its task is told, drained within the grace, and the
    /// lock released. Returns `false` if it was asked already.
    pub(crate) fn hand_off(&mut self) -> bool {
        self.handoff.take().is_some_and(|tx| tx.send(()).is_ok())
    }

    /// Whether a hand-off was asked.
    pub(crate) fn is_stopping(&self) -> bool {
        self.handoff.is_none()
    }

    /// If the term's lock is lost but the term has not let it go yet (its end may still
    /// be written, or fail and be left to the member): what says when it has.
    pub(crate) fn letting_go(&self) -> Option<LettingGo> {
        (self.lock.is_lost() && !self.is_finished()).then(|| LettingGo(Arc::clone(&self.finished)))
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.lost_lock() || self.handle.is_finished()
    }

    /// Whether the term is over because its lock was lost (its lock let go): the
    /// member may take the shard back at once.
    pub(crate) fn lost_lock(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Drops the task at once (no drain, the term not ended) and waits until its tokio
    /// task is gone, the lock's guard dropped with it.
    pub(crate) async fn abort(mut self) {
        self.handle.abort();
        let _ = (&mut self.handle).await;
    }

    /// Hands over and waits until the lock is released.
    pub(crate) async fn stop(mut self) {
        self.hand_off();
        let handle = &mut self.handle;
        // A panicking task is over too; the runtime reported it.
        let _ = handle.await;
    }
}

/// A term whose lock is lost, letting it go (see [`Running::letting_go`]).
pub(crate) struct LettingGo(Arc<AtomicBool>);

impl LettingGo {
    /// Whether the term has let its lock go, its end written or left unended.
    pub(crate) fn done(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// What a member hears from its terms' tokio tasks.
#[derive(Debug, Default)]
pub(crate) struct Told {
    /// Told once a term lost its lock and let it go.
    pub(crate) lost: Notify,
    /// Terms whose task stopped but whose end could not be written (the term store
    /// unreachable, as through a server restart): the member ends them before it joins
    /// again, so that no observer names them under its new membership (same slot, same
    /// holder) as if they still ran.
    unended: Mutex<Vec<Owned>>,
}

impl Told {
    fn unended(&self) -> std::sync::MutexGuard<'_, Vec<Owned>> {
        self.unended.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the terms left unended, each while it is still its shard's latest (as
    /// [`ShardTerms::end`] does); those that fail again stay for the next try.
    ///
    /// # Errors
    /// The last failure, when a term is left.
    ///
    /// # Cancel safety
    /// A term leaves the list only once its end is written.
    pub(crate) async fn end_unended<T: ShardTerms>(
        &self,
        terms: &T,
    ) -> Result<(), LockAcquisitionError> {
        let left = self.unended().clone();
        let mut failed = None;
        for owned in left {
            match terms.end(&owned.group, &owned.shard, owned.token).await {
                Ok(()) => {
                    self.unended().retain(|term| term != &owned);
                    tracing::debug!(shard = %owned.shard, token = owned.token,
                        "a term left unended is ended");
                }
                Err(error) => failed = Some(error),
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// How many terms are left unended.
    pub(crate) fn unended_count(&self) -> usize {
        self.unended().len()
    }
}

/// What a term needs besides the task.
pub(crate) struct TermPlan<T> {
    pub(crate) owned: Owned,
    /// The member's slot the term began under.
    pub(crate) slot: u32,
    pub(crate) terms: T,
    /// Until when the task waits before it starts (the previous owner's loss notice
    /// counted from this member's grant of the lock), when the previous term did not end.
    pub(crate) wait_until: Option<tokio::time::Instant>,
    pub(crate) drain_grace: Duration,
    pub(crate) instruments: Instruments,
    pub(crate) attributes: Vec<KeyValue>,
    /// Told once the term lost its lock and let it go, or could not be ended.
    pub(crate) told: Arc<Told>,
}

enum Ended {
    Lost(LostReason),
    HandOff,
    Returned,
    /// The member dropped the term ([`Running`] dropped or aborted, its hand-off sender
    /// with it): the tokio task is being aborted, and if it runs first it does as the
    /// abort would, so the term is never ended for it.
    Dropped,
}

/// Starts the term on a tokio task of its own. `make` builds the user's future from the
/// term and the stop signal; it is built only once the takeover delay (if any) passed.
pub(crate) fn spawn<G, T, Fut>(
    guard: G,
    plan: TermPlan<T>,
    make: impl FnOnce(Owned, locks_port::LostSignal) -> Fut + Send + 'static,
) -> Running
where
    G: LockGuard + 'static,
    T: ShardTerms + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = oneshot::channel::<()>();
    let lost_flag = Arc::new(AtomicBool::new(false));
    let lost_told = Arc::clone(&lost_flag);
    let (shard, token, slot) = (Arc::clone(&plan.owned.shard), plan.owned.token, plan.slot);
    let since = plan.owned.since;
    let lock = guard.lost();
    let finished = Arc::new(AtomicBool::new(false));
    let over = Finished(Arc::clone(&finished));
    let handle = tokio::spawn(async move {
        // Set when this task ends, however it ends (returned, aborted, panicked).
        let _over = over;
        let lost = guard.lost();
        let mut holding: Holding<Fut, G> = Holding {
            task: None,
            guard: Some(guard),
        };
        let TermPlan {
            owned,
            slot: _,
            terms,
            wait_until,
            drain_grace,
            instruments,
            attributes,
            told,
        } = plan;
        if let Some(until) = wait_until {
            // The previous owner did not end its term: let it notice its loss and stop.
            // Some(whether the lock was lost) when the term ends before its task starts.
            let early = tokio::select! {
                biased;
                _ = lost.clone() => Some(true),
                told = &mut rx => match told {
                    Ok(()) => Some(false),
                    // Dropped, not handed over: no end recorded (see `Ended::Dropped`).
                    Err(_) => return,
                },
                () = tokio::time::sleep_until(until) => None,
            };
            if let Some(lost_lock) = early {
                // The previous owner may still be running until `until`. Ended now, this
                // term would tell the next owner (another member after a hand-off, or
                // this one taking the shard back) that no task can be running, and it
                // would start at once: so the end (and on a hand-off the lock with it)
                // waits until then. The next owner that begins first, after a loss, sees
                // this term not ended and waits this owner's own bound from its grant.
                tokio::time::sleep_until(until).await;
                finish(&mut holding, &terms, &owned, &told).await;
                if lost_lock {
                    lost_told.store(true, Ordering::Release);
                    told.lost.notify_one();
                }
                return;
            }
        }
        let stop = LossNotifier::new();
        holding.task = Some(Box::pin(make(owned.clone(), stop.signal())));
        instruments.owned.add(1, &attributes);
        tracing::debug!(shard = %owned.shard, token = owned.token, "shard task started");
        let ended = {
            let task = holding.task.as_mut().map(Pin::as_mut);
            match task {
                None => Ended::Returned,
                Some(mut task) => tokio::select! {
                    biased;
                    reason = lost.clone() => Ended::Lost(reason),
                    told = &mut rx => match told {
                        Ok(()) => Ended::HandOff,
                        Err(_) => Ended::Dropped,
                    },
                    () = &mut task => Ended::Returned,
                },
            }
        };
        let lost_lock = matches!(ended, Ended::Lost(_));
        match ended {
            Ended::Lost(reason) => {
                // Someone else may own the shard already: no drain.
                stop.notify(reason);
                tracing::warn!(shard = %owned.shard, reason = reason.as_str(),
                    "shard lock lost; its task was stopped");
            }
            Ended::HandOff => {
                stop.notify(LostReason::Released);
                instruments.handoffs.add(1, &attributes);
                if let Some(task) = holding.task.as_mut() {
                    tokio::select! {
                        biased;
                        _ = lost.clone() => {}
                        () = task.as_mut() => {}
                        () = tokio::time::sleep(drain_grace) => {
                            tracing::warn!(shard = %owned.shard, ?drain_grace,
                                "shard task did not stop within its drain grace; dropped");
                        }
                    }
                }
            }
            Ended::Returned => {}
            Ended::Dropped => {
                // The task's future, then the lock's guard: the term is not ended.
                drop(holding);
                instruments.owned.add(-1, &attributes);
                return;
            }
        }
        // The task's future is dropped before anything else happens.
        holding.task = None;
        instruments.owned.add(-1, &attributes);
        tracing::debug!(shard = %owned.shard, token = owned.token, "shard task stopped");
        finish(&mut holding, &terms, &owned, &told).await;
        if lost_lock {
            // The member may own the shard again at once (a terminated session: its
            // share has not changed). Not after a hand-off or a task that returned: the
            // first is not this member's any more, the second would be run again in a
            // loop as fast as the server answers.
            lost_told.store(true, Ordering::Release);
            told.lost.notify_one();
        }
    });
    Running {
        handoff: Some(tx),
        handle,
        shard,
        token,
        slot,
        since,
        lost: lost_flag,
        lock,
        finished,
    }
}

/// Sets its flag when dropped: the end of a term's tokio task.
struct Finished(Arc<AtomicBool>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Ends the term (its task has stopped) and releases the shard's lock. A term that
/// cannot be ended is left to the member to end before it joins again.
async fn finish<Fut, G: LockGuard, T: ShardTerms>(
    holding: &mut Holding<Fut, G>,
    terms: &T,
    owned: &Owned,
    told: &Told,
) {
    debug_assert!(holding.task.is_none());
    if let Err(error) = terms.end(&owned.group, &owned.shard, owned.token).await {
        tracing::warn!(shard = %owned.shard, error = %error,
            "the term could not be ended; the next owner waits its takeover delay");
        told.unended().push(owned.clone());
    }
    if let Some(guard) = holding.guard.take() {
        guard.release().await;
    }
}
