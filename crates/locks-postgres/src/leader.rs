//! Leader election on a semaphore of one permit: campaign, run a task while leading,
//! stop it the moment the permit is lost, back off, campaign again (ADR 0018).
//!
//! Generic over the port's [`Semaphore`], so it runs on the in-memory manager too.

use std::future::Future;
use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, LockAcquisitionError, LostReason, LostSignal,
    PermitGuard, ReleaseOutcome, Semaphore,
};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Meter, UpDownCounter};
use time::OffsetDateTime;
use tokio::sync::watch;

/// Whether this process leads: an up-down counter, 1 while a term runs its task and 0
/// otherwise (Kubernetes' leader gauge), `{leader}`; attribute `leader.election` (the
/// election's name) only when [`LeaderElection::metrics_name`] asks for it.
pub(crate) const IS_LEADER: &str = "eventsource.leader.is_leader";
/// Terms this process has led (each a transition to leading; their sum over a fleet's
/// processes is the election's transitions, as Kubernetes' `leaseTransitions`).
pub(crate) const TERMS: &str = "eventsource.leader.terms";

/// Where this process stands, as [`LeaderElection::subscribe`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Leadership {
    /// Not leading: campaigning, backing off, or not started.
    Following,
    /// Leading since `since`; `fencing_token` when the manager hands them out.
    Leading {
        /// When this process won.
        since: OffsetDateTime,
        /// The grant's fencing token, when fencing is on.
        fencing_token: Option<i64>,
    },
}

impl Leadership {
    /// Whether this process leads.
    #[must_use]
    pub fn is_leading(&self) -> bool {
        matches!(self, Self::Leading { .. })
    }
}

/// Who leads now, as the backend shows it (see [`LeaderElection::who_leads`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's holder id, when its manager has one.
    pub holder_id: Option<String>,
    /// Since when it leads (to the second on PostgreSQL), when known.
    pub since: Option<OffsetDateTime>,
}

/// How one term ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum TermEnd<T> {
    /// The task finished while leading; leadership was released.
    Finished(T),
    /// Leadership was lost; the task was stopped (its future dropped) first.
    Lost(LostReason),
}

/// Campaigns for the leadership of `name`: the holder of the one permit of the
/// semaphore `name` leads.
///
/// ```no_run
/// use std::time::Duration;
/// use locks_postgres::{LeaderElection, PostgresLockManager};
///
/// # async fn run(manager: PostgresLockManager) -> Result<(), Box<dyn std::error::Error>> {
/// let election = LeaderElection::new(manager, "scheduler");
/// let mut changes = election.subscribe();
/// tokio::spawn(async move {
///     while changes.changed().await.is_ok() {
///         println!("leading: {}", changes.borrow().is_leading());
///     }
/// });
/// // Runs the scheduler while leading; a lost leadership stops it, and the election
/// // campaigns again after the back-off. Returns only when the task finishes.
/// let output = election
///     .run(|lost| async move {
///         // ... schedule; `lost` can be awaited or checked too ...
///         let _ = lost;
///         tokio::time::sleep(Duration::from_secs(3600)).await;
///     })
///     .await?;
/// # let _ = output; Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaderElection<S> {
    semaphores: S,
    name: String,
    backoff: Duration,
    takeover_delay: Duration,
    state: watch::Sender<Leadership>,
    is_leader: UpDownCounter<i64>,
    terms: Counter<u64>,
    /// `leader.election`, when asked for.
    attributes: Vec<KeyValue>,
}

/// The back-off between a lost term (or a failed campaign) and the next campaign.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);

/// How long a winner waits before it starts its task, so that a leader whose session
/// was ended has noticed and stopped first: above the leader's health-check interval
/// (200 ms by default) with room for scheduling.
pub const DEFAULT_TAKEOVER_DELAY: Duration = Duration::from_millis(500);

impl<S: Semaphore> LeaderElection<S> {
    /// An election for `name` on `semaphores`, with the default back-off and takeover
    /// delay.
    ///
    /// A leader holds two permits (the election's, and the one of [`leading_name`]
    /// while its task runs): on PostgreSQL that is two pool connections, and a third for
    /// [`who_leads`](Self::who_leads) meanwhile. With a pool of one connection the
    /// winner would wait for the second forever.
    ///
    /// Its instruments, `eventsource.leader.is_leader` and `eventsource.leader.terms` (a
    /// counter of the terms this process led), are made on the global meter provider as
    /// it is now (a no-op when none is installed); [`meter`](Self::meter) gives another
    /// meter.
    pub fn new(semaphores: S, name: impl Into<String>) -> Self {
        let meter = opentelemetry::global::meter_with_scope(crate::metrics::scope());
        Self {
            semaphores,
            name: name.into(),
            backoff: DEFAULT_BACKOFF,
            takeover_delay: DEFAULT_TAKEOVER_DELAY,
            state: watch::Sender::new(Leadership::Following),
            is_leader: is_leader(&meter),
            terms: terms(&meter),
            attributes: Vec::new(),
        }
    }

    /// Records the election's instruments on `meter` instead of the global provider's.
    #[must_use]
    pub fn meter(mut self, meter: &Meter) -> Self {
        self.is_leader = is_leader(meter);
        self.terms = terms(meter);
        self
    }

    /// Adds the election's name to `eventsource.leader.is_leader` as `leader.election`
    /// (off by default: names are key text, so this is the user's choice; one series per
    /// election).
    #[must_use]
    pub fn metrics_name(mut self, on: bool) -> Self {
        self.attributes = if on {
            vec![KeyValue::new("leader.election", self.name.clone())]
        } else {
            Vec::new()
        };
        self
    }

    /// The pause before campaigning again after a lost term or a failed campaign.
    #[must_use]
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long a winner waits before starting its task (see
    /// [`DEFAULT_TAKEOVER_DELAY`]). It must exceed the time a leader needs to notice a
    /// loss (its manager's health-check interval); zero gives up the ordering.
    #[must_use]
    pub fn takeover_delay(mut self, delay: Duration) -> Self {
        self.takeover_delay = delay;
        self
    }

    /// Follows this process's leadership: every change, starting with `Following`.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.state.subscribe()
    }

    /// Who leads `name` now, without campaigning; `None` when nobody does. It names a
    /// process only while its task runs: the leader holds a second permit, of
    /// [`leading_name`], from just before its task starts until just after it stops, and
    /// this reads that one (a winner waiting out the takeover delay is not named).
    ///
    /// # Errors
    /// A backend failure, as from [`Semaphore::permit_holders`].
    pub async fn who_leads(&self) -> Result<Option<Leader>, LockAcquisitionError> {
        let holders = self
            .semaphores
            .permit_holders(&leading_name(&self.name))
            .await?;
        Ok(holders.held.into_iter().next().map(|held| Leader {
            holder_id: held.holder_id,
            since: held.since,
        }))
    }

    /// One term: waits to lead, runs `task` while leading, and says how it ended.
    ///
    /// # Errors
    /// The campaign's error (the permit could not be waited for).
    ///
    /// # Cancel safety
    /// Dropping the future stops the task and gives up the leadership.
    pub async fn term<F, Fut, T>(&self, task: F) -> Result<TermEnd<T>, LockAcquisitionError>
    where
        F: FnOnce(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        let permit = self
            .semaphores
            .acquire_permit(&self.name, 1, AcquireOptions::new())
            .await?;
        let lost = permit.lost();
        // A leader whose session just ended may not know yet: let it stop first.
        if tokio::time::timeout(self.takeover_delay, lost.clone())
            .await
            .is_ok()
        {
            return Ok(TermEnd::Lost(
                lost.reason().unwrap_or(LostReason::ConnectionClosed),
            ));
        }
        // The second permit, held while the task runs: it names this process to
        // `who_leads`, and a predecessor still running its task holds it until the
        // task stops, so two leaders' tasks never overlap.
        let leading_key = leading_name(&self.name);
        let leading = tokio::select! {
            biased;
            reason = lost.clone() => {
                permit.release().await;
                return Ok(TermEnd::Lost(reason));
            }
            leading = self.semaphores.acquire_permit(&leading_key, 1, AcquireOptions::new()) => {
                leading
            }
        };
        let leading = match leading {
            Ok(leading) => leading,
            Err(error) => {
                permit.release().await;
                return Err(error);
            }
        };
        self.state.send_replace(Leadership::Leading {
            since: OffsetDateTime::now_utc(),
            fencing_token: permit.info().fencing_token(),
        });
        self.is_leader.add(1, &self.attributes);
        self.terms.add(1, &self.attributes);
        // Says `Following` again when the term ends, or when this future is dropped
        // mid-term (after the task's future, made later, is dropped).
        let term = Term(self);
        let ended = tokio::select! {
            biased;
            reason = lost.clone() => TermEnd::Lost(reason),
            output = task(lost) => TermEnd::Finished(output),
        };
        // The task's future is dropped by now: it stopped before anyone hears of it.
        drop(term);
        leading.release().await;
        if let TermEnd::Lost(reason) = &ended {
            tracing::warn!(
                reason = reason.as_str(),
                "leadership lost; the task was stopped"
            );
        }
        let released = permit.release().await;
        debug_assert!(!matches!(released, ReleaseOutcome::InBackground));
        Ok(ended)
    }

    /// Campaigns until the task finishes while leading: each lost term stops the task
    /// and, after the back-off, campaigns again with a new task from `task`. Failed
    /// campaigns are retried after the back-off too, except configuration errors.
    ///
    /// # Errors
    /// A [`Configuration`](AcquisitionErrorKind::Configuration) error of the campaign
    /// (for example, other processes use `name` as a semaphore of more permits).
    ///
    /// # Cancel safety
    /// Dropping the future stops the task and gives up the leadership.
    pub async fn run<F, Fut, T>(&self, mut task: F) -> Result<T, LockAcquisitionError>
    where
        F: FnMut(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            match self.term(&mut task).await {
                Ok(TermEnd::Finished(output)) => return Ok(output),
                Ok(TermEnd::Lost(_)) => {}
                Err(error) if error.kind() == AcquisitionErrorKind::Configuration => {
                    return Err(error);
                }
                Err(error) => {
                    tracing::warn!(error = %error, "campaign failed; retrying after the back-off");
                }
            }
            tokio::time::sleep(self.backoff).await;
        }
    }
}

/// A term running its task: dropped, the election follows again.
/// The name of the semaphore a leader holds while its task runs: `name` and the suffix
/// `"\u{0}leading"` (no election name a user picks is likely to end so).
#[must_use]
pub fn leading_name(name: &str) -> String {
    format!("{name}\u{0}leading")
}

struct Term<'a, S>(&'a LeaderElection<S>);

impl<S> Drop for Term<'_, S> {
    fn drop(&mut self) {
        let election = self.0;
        election.state.send_replace(Leadership::Following);
        election.is_leader.add(-1, &election.attributes);
    }
}

fn is_leader(meter: &Meter) -> UpDownCounter<i64> {
    meter
        .i64_up_down_counter(IS_LEADER)
        .with_unit("{leader}")
        .with_description("Whether this process leads the election: 1 while leading, else 0.")
        .build()
}

fn terms(meter: &Meter) -> Counter<u64> {
    meter
        .u64_counter(TERMS)
        .with_unit("{term}")
        .with_description("Terms this process has led: each one a transition to leading.")
        .build()
}
