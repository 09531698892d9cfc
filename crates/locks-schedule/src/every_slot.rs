//! `run_every_slot`: the firing loop, one call that fires a job at each slot of its
//! schedule by the ledger's clock until its future is dropped (feature `tokio`).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use locks_port::{AcquisitionErrorKind, DistributedLock};
use time::OffsetDateTime;

use crate::ledger::Ledger;
use crate::runner::{JobContext, RunError, ScheduledJob};

/// How long [`ScheduledJob::run_every_slot`] waits before it asks the ledger's clock
/// again after the ledger failed to say the time.
pub const CLOCK_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The longest the firing loop sleeps on this host's timer before it reads the ledger's
/// clock again: a long wait (a daily job) follows the ledger's clock, not the host's
/// timer's drift.
pub const MAX_NAP: Duration = Duration::from_secs(60);

impl ScheduledJob {
    /// Fires the job at each slot of its schedule, [`run_once_per_slot`] by
    /// [`run_once_per_slot`], until the returned future is dropped: once at the start,
    /// then at each slot boundary of the **ledger's** clock (the database's, as the
    /// claims are; this host's clock is never read). Every policy of the job applies to
    /// each firing as it would to a call of `run_once_per_slot`. It sleeps on tokio's timer
    /// between readings of the ledger's clock, at most [`MAX_NAP`] at a time, so a long
    /// period (a daily job) follows the ledger's clock rather than this host's timer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_schedule::{JobContext, MemoryLedger, ScheduledJob, SystemClock};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (ledger, locks) = (MemoryLedger::new(SystemClock), locks_memory::InMemoryLockManager::new());
    /// let job = ScheduledJob::new("report", "every 1s".parse().unwrap());
    /// let firing_loop = job.run_every_slot(&locks, &ledger, |context: JobContext| async move {
    ///     println!("running slot {}", context.slot);
    ///     Ok::<(), String>(())
    /// });
    /// // Runs until dropped: here after 1.5 s (a service keeps it for its lifetime).
    /// let _ = tokio::time::timeout(Duration::from_millis(1500), firing_loop).await;
    /// # }
    /// ```
    ///
    /// # Missed slots and slow jobs
    /// The loop fires once per slot boundary; a job still running at the next boundary
    /// delays that firing (on this host) until it returns, and the loop then fires at once
    /// in the slot the ledger's clock is in, late (its
    /// [`lateness`](JobContext::lateness) says by how much). Meanwhile other hosts'
    /// firings find the lock held: [`Verdict::Busy`](crate::Verdict::Busy) under
    /// [`Overlap::Skip`](crate::Overlap::Skip), a wait under `Wait`, a run of their own slot
    /// under `Allow`. A slot nobody fired in (every host down, or busy with a long run) is
    /// settled by the next firing under the job's
    /// [`MissedSlots`](crate::MissedSlots) policy: recorded as `missed`, or the latest one run
    /// once. The loop never fires a burst of the slots it slept through.
    ///
    /// # Errors
    /// Only what no later firing can fix: the schedule has no slot at the ledger's time
    /// ([`RunError::Schedule`]), the lock manager refuses the job's key or configuration
    /// ([`RunError::Lock`] of kind `InvalidKey` or `Configuration`; so does a job name
    /// with a NUL or past [`MAX_JOB_NAME`](crate::MAX_JOB_NAME) bytes), or the period is
    /// shorter than a round trip to the ledger ([`RunError::ClockRacing`]). Any other
    /// failed firing (an unreachable server, a missing ledger table) is logged as a
    /// `tracing` warning with the error, and the loop fires again at the next boundary;
    /// a claim that failed wrote nothing, and a run whose outcome could not be recorded
    /// is settled under the crash policy by the next firing in its slot or the one after,
    /// or, once older than that, marked `abandoned` by a later firing (under
    /// [`Overlap::Allow`](crate::Overlap::Allow), once its slot's lock is free).
    /// When the ledger cannot say
    /// the time, the loop asks again after [`CLOCK_RETRY_PAUSE`].
    ///
    /// # Cancel safety
    /// Dropping the future stops the loop. Between firings (the loop sleeps there almost
    /// all the time) it holds nothing: no lock, no connection, no claim. Dropped during a
    /// firing, it does what dropping [`run_once_per_slot`] does: the job's future is
    /// dropped, the lock released, and a claimed slot's row stays `running`, which the
    /// next firing of any host (in that slot or the one after) settles under the crash
    /// policy, as it would a crashed runner's.
    ///
    /// [`run_once_per_slot`]: ScheduledJob::run_once_per_slot
    pub async fn run_every_slot<L, G, F, Fut, E>(
        &self,
        locks: &L,
        ledger: &G,
        mut run: F,
    ) -> Result<Infallible, RunError>
    where
        L: DistributedLock,
        G: Ledger,
        F: FnMut(JobContext) -> Fut + Send,
        Fut: Future<Output = Result<(), E>> + Send,
        E: fmt::Display,
    {
        loop {
            let planned = self.schedule().slot_at(ledger_now(ledger).await)?;
            match self.run_once_per_slot(locks, ledger, &mut run).await {
                Ok(report) => {
                    if let Some(first) = report.abandoned_earlier.first() {
                        tracing::warn!(
                            job = self.name(),
                            runs = report.abandoned_earlier.len(),
                            first = %crate::schedule::rfc3339(*first),
                            "earlier runs were still `running` with their runners gone; \
                             marked abandoned"
                        );
                    }
                }
                Err(error) if gives_up(&error) => return Err(error),
                Err(error) => tracing::warn!(
                    job = self.name(),
                    error = %error,
                    "the firing failed; firing again at the next slot"
                ),
            }
            // A run that went past the boundary: the slot the clock is in now has had no
            // firing from this host yet, so fire at once.
            let now = ledger_now(ledger).await;
            let current = self.schedule().slot_at(now)?;
            if current.start() > planned.start() {
                continue;
            }
            wait_until(ledger, now, current.next()).await;
        }
    }
}

/// Whether the loop stops on `error`: no later firing would go otherwise.
fn gives_up(error: &RunError) -> bool {
    match error {
        RunError::Lock(error) => matches!(
            error.kind(),
            AcquisitionErrorKind::InvalidKey | AcquisitionErrorKind::Configuration
        ),
        RunError::Schedule(_) | RunError::ClockRacing => true,
        RunError::Ledger(_) => false,
    }
}

/// The ledger's clock, asked until it answers (a warning and [`CLOCK_RETRY_PAUSE`]
/// between failures).
async fn ledger_now<G: Ledger>(ledger: &G) -> OffsetDateTime {
    loop {
        match ledger.now().await {
            Ok(now) => return now,
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    "the ledger's clock did not answer; asking again in {CLOCK_RETRY_PAUSE:?}"
                );
                tokio::time::sleep(CLOCK_RETRY_PAUSE).await;
            }
        }
    }
}

/// Sleeps until the ledger's clock reaches `target`, `now` being its last reading:
/// naps of at most [`MAX_NAP`] on this host's timer, the ledger's clock read between.
async fn wait_until<G: Ledger>(ledger: &G, mut now: OffsetDateTime, target: OffsetDateTime) {
    while now < target {
        let left = Duration::try_from(target - now).unwrap_or(Duration::ZERO);
        tokio::time::sleep(left.min(MAX_NAP)).await;
        if left <= MAX_NAP {
            return;
        }
        now = ledger_now(ledger).await;
    }
}
