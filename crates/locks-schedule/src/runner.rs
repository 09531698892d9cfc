//! `run_once_per_slot`: one firing of a scheduled job on one host.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use locks_port::{
    AcquisitionErrorKind, DistributedLock, LockAcquisitionError, LockGuard, LostSignal,
};
use opentelemetry::metrics::Meter;
use time::OffsetDateTime;

use crate::claim::{Claim, SlotKind};
use crate::ledger::{Attempt, ClaimAnswer, Ledger, LedgerError, Outcome};
use crate::metrics::Metrics;
use crate::policy::{CrashPolicy, MissedSlots, Overlap};
use crate::{Schedule, ScheduleError, Slot};

/// How many times a firing re-reads the ledger's clock when a slot boundary passes
/// between reading it and claiming.
const MAX_CLAIMS: usize = 3;

/// A job on a schedule, with its policies: what every host's scheduler fires.
///
/// ```
/// use std::num::NonZeroU32;
/// use locks_schedule::{CrashPolicy, MissedSlots, Overlap, ScheduledJob};
///
/// let job = ScheduledJob::new("nightly-report", "0 2 * * *".parse().unwrap())
///     .overlap(Overlap::Skip)
///     .crash(CrashPolicy::AtLeastOnce { max_attempts: NonZeroU32::new(3).unwrap() })
///     .missed(MissedSlots::RunLatest);
/// assert_eq!(job.lock_key(None), "schedule:nightly-report");
/// ```
#[derive(Clone)]
pub struct ScheduledJob {
    name: String,
    schedule: Schedule,
    overlap: Overlap,
    crash: CrashPolicy,
    missed: MissedSlots,
    holder: String,
    metrics: Metrics,
}

impl fmt::Debug for ScheduledJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduledJob")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("overlap", &self.overlap)
            .field("crash", &self.crash)
            .field("missed", &self.missed)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// What the job is told when it runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobContext {
    /// The slot being run.
    pub slot: Slot,
    /// 1 for the slot's first attempt.
    pub attempt: u32,
    /// How the attempt before ended (`Abandoned` for a runner that died), if any.
    pub previous: Option<Outcome>,
    /// Whether this run is of a slot before the current one (a missed slot caught up, or
    /// a crashed run re-run).
    pub catch_up: bool,
    /// How long after the slot began the run started, on the ledger's clock.
    pub lateness: Duration,
    /// Fires if the job's lock is lost while the job runs: stop, the slot may be taken
    /// over (at-least-once) or marked abandoned (at-most-once).
    pub lost: LostSignal,
}

/// What a firing did with one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// This firing ran the job.
    Ran {
        /// The attempt it ran.
        attempt: u32,
        /// How it ended.
        outcome: Outcome,
        /// Whether the lock was lost before the job returned.
        lock_lost: bool,
        /// Whether the outcome was recorded (`false`: another runner settled the slot
        /// meanwhile, after the lock was lost).
        recorded: bool,
    },
    /// The slot had already run (or been settled) with this outcome: nothing ran.
    AlreadyRun(Outcome),
    /// This firing settled the slot without running it: `Abandoned` (a dead runner's
    /// slot, no attempts left) or `Missed` (a gap recorded).
    Settled(Outcome),
    /// The job's lock was held (an earlier run still going): nothing ran.
    Busy,
}

impl Verdict {
    /// Whether this firing ran the job.
    #[must_use]
    pub fn ran(&self) -> bool {
        matches!(self, Self::Ran { .. })
    }
}

/// What one firing did: with the current slot, and with the slot before it (a missed slot
/// or a crashed run, per the policies; `None` when there was nothing to do about it).
/// `Debug` shows times in RFC 3339 (UTC), as [`RunRecord`](crate::RunRecord)'s does.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// The current slot on the ledger's clock.
    pub slot: Slot,
    /// What happened to it.
    pub verdict: Verdict,
    /// The slot before, and what happened to it, if anything did.
    pub previous: Option<(Slot, Verdict)>,
    /// The starts of earlier slots (before the slot before) whose rows this firing found
    /// `running` and marked `abandoned`: their runners died, or lost the ledger mid-run
    /// (a failover), at least two slots ago. A firing holding the job's lock
    /// ([`Overlap::Skip`], [`Overlap::Wait`]) marks every such row; under
    /// [`Overlap::Allow`], only those whose slot's own lock it could take (a run still
    /// going holds it). See [`Ledger::abandon_stale`].
    pub abandoned_earlier: Vec<OffsetDateTime>,
}

impl fmt::Debug for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let abandoned: Vec<String> = (self.abandoned_earlier.iter())
            .map(|&t| crate::schedule::rfc3339(t))
            .collect();
        f.debug_struct("RunReport")
            .field("slot", &self.slot)
            .field("verdict", &self.verdict)
            .field("previous", &self.previous)
            .field("abandoned_earlier", &abandoned)
            .finish()
    }
}

/// A firing failed: nothing ran after the failure (a run that had started is recorded
/// as `running` and settled under the crash policy by the next firing in its slot or
/// the one after).
///
/// Each variant shows its cause's message (the lock's, the ledger's, the schedule's),
/// which names the fix when there is one (a missing ledger table: create it with
/// `locks_schedule_postgres::install_ledger`); [`source`](std::error::Error::source) is
/// the cause's own source, so a chain of errors says nothing twice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The lock could not be taken (not contention: a backend failure), or the job's name
    /// or holder is one no ledger keeps (kind `Configuration`: a NUL, or a name of more
    /// than [`MAX_JOB_NAME`](crate::MAX_JOB_NAME) bytes; see
    /// [`check_job_name`](crate::check_job_name), [`check_holder`](crate::check_holder)).
    #[error(transparent)]
    Lock(LockAcquisitionError),
    /// The ledger failed.
    #[error(transparent)]
    Ledger(LedgerError),
    /// The schedule has no slot at the ledger's time.
    #[error(transparent)]
    Schedule(ScheduleError),
    /// The ledger's clock left the slot between reading it and claiming, three times
    /// running (a period shorter than a round trip).
    #[error(
        "the ledger's clock passed a slot boundary at every claim: the period is shorter \
         than a round trip to the ledger; give the schedule a longer period"
    )]
    ClockRacing,
}

impl From<LedgerError> for RunError {
    fn from(error: LedgerError) -> Self {
        Self::Ledger(error)
    }
}

impl From<ScheduleError> for RunError {
    fn from(error: ScheduleError) -> Self {
        Self::Schedule(error)
    }
}

enum Settle {
    NotDue(OffsetDateTime),
    Verdict(Option<Verdict>),
}

impl ScheduledJob {
    /// A job named `name` (its ledger rows and its lock key) on `schedule`, with the
    /// default policies: overlap [`Skip`](Overlap::Skip), crash
    /// [`AtMostOnce`](CrashPolicy::AtMostOnce), missed slots
    /// [`Skip`](MissedSlots::Skip), the holder `pid@host`, metrics from the global meter
    /// provider.
    ///
    /// The name has at most [`MAX_JOB_NAME`](crate::MAX_JOB_NAME) bytes and no NUL (the
    /// ledger's key holds it): a job with another name is built, but each firing of it
    /// fails with a `Configuration` error ([`check_job_name`](crate::check_job_name)).
    #[must_use]
    pub fn new(name: impl Into<String>, schedule: Schedule) -> Self {
        let name = name.into();
        Self {
            metrics: Metrics::new(&name, None),
            name,
            schedule,
            overlap: Overlap::Skip,
            crash: CrashPolicy::AtMostOnce,
            missed: MissedSlots::Skip,
            holder: default_holder(),
        }
    }

    /// What a firing does while an earlier run holds the lock.
    #[must_use]
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = overlap;
        self
    }

    /// What a run that died or failed means for its slot.
    #[must_use]
    pub fn crash(mut self, crash: CrashPolicy) -> Self {
        self.crash = crash;
        self
    }

    /// What a slot nobody fired in means.
    #[must_use]
    pub fn missed(mut self, missed: MissedSlots) -> Self {
        self.missed = missed;
        self
    }

    /// Who this runner is, in the ledger's `holder` column. Any text but a NUL (the
    /// ledger's `text` cannot hold it): a job with such a holder is built, but each firing
    /// of it fails with a `Configuration` error ([`check_holder`](crate::check_holder)).
    #[must_use]
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = holder.into();
        self
    }

    /// The meter the job's instruments come from (see the crate's metrics table).
    #[must_use]
    pub fn meter(mut self, meter: &Meter) -> Self {
        self.metrics = Metrics::new(&self.name, Some(meter));
        self
    }

    /// The job's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The job's schedule.
    #[must_use]
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The lock key of the job (`schedule:{name}`), or of one slot of it under
    /// [`Overlap::Allow`] (`schedule:{name}@{slot}`).
    #[must_use]
    pub fn lock_key(&self, slot: Option<&Slot>) -> String {
        match slot {
            Some(slot) => self.slot_lock_key(slot.start()),
            None => format!("schedule:{}", self.name),
        }
    }

    /// The lock key of the slot starting at `start` under [`Overlap::Allow`]: the start
    /// alone names it, whatever the schedule.
    fn slot_lock_key(&self, start: OffsetDateTime) -> String {
        format!(
            "schedule:{}@{}",
            self.name,
            crate::schedule::slot_name(start)
        )
    }

    /// One firing: takes the job's lock, settles the slot before the current one (a dead
    /// or failed run under the crash policy, a gap under the missed-slot policy), then
    /// claims the current slot in the ledger and runs `run` if the claim is granted.
    /// Call it when this host's scheduler fires (at each slot boundary of its own clock,
    /// or from cron); which slot is current is the ledger's clock's answer. To fire at
    /// each slot from this process, [`run_every_slot`](Self::run_every_slot) is that
    /// loop.
    ///
    /// # Skew
    /// Hosts' clocks only decide when they fire: a slot runs at most once whatever they
    /// say, and every slot in which at least one host fires runs. A host whose clock is
    /// off by `d` fires `d` early or late, so with every host off by less than a period
    /// each slot still gets a firing from each host, in the slot or just after it; beyond
    /// a period a host fires in another slot than it means to (still at most once; a slot
    /// no host fired in is recorded as missed by the next firing).
    ///
    /// # Errors
    /// [`RunError`] when the lock's backend, the ledger or the schedule fails; a
    /// [`RunError::Lock`] of kind `Configuration` when the job's name has a NUL or more
    /// than [`MAX_JOB_NAME`](crate::MAX_JOB_NAME) bytes ([`check_job_name`](crate::check_job_name)),
    /// or its holder a NUL ([`check_holder`](crate::check_holder)), before anything is
    /// asked of the ledger or the locks. The job's own error is not one: the run is
    /// recorded `failed` with it ([`recorded_detail`](crate::recorded_detail)).
    ///
    /// # Cancel safety
    /// Dropping the future releases the lock (the guard drops). If the job had been
    /// claimed, its row stays `running` and the next firing (in its slot or the one after)
    /// settles it under the crash policy, as it would a crashed runner's. A row no firing
    /// reaches by then is marked `abandoned` by a later firing
    /// ([`RunReport::abandoned_earlier`]).
    pub async fn run_once_per_slot<L, G, F, Fut, E>(
        &self,
        locks: &L,
        ledger: &G,
        mut run: F,
    ) -> Result<RunReport, RunError>
    where
        L: DistributedLock,
        G: Ledger,
        F: FnMut(JobContext) -> Fut + Send,
        Fut: Future<Output = Result<(), E>> + Send,
        E: fmt::Display,
    {
        // A name or a holder a ledger cannot keep fails alike on every ledger, before
        // anything is asked of the ledger or the locks.
        crate::check_job_name(&self.name)
            .and_then(|()| crate::check_holder(&self.name, &self.holder))
            .map_err(RunError::Lock)?;
        let now = ledger.now().await?;
        let mut current = self.schedule.slot_at(now)?;
        let mut previous = self.schedule.previous(&current)?;
        let shared = match self.overlap {
            Overlap::Allow => None,
            _ => match self.lock(locks, &self.lock_key(None)).await? {
                Some(guard) => Some(guard),
                None => {
                    self.metrics.busy();
                    return Ok(RunReport {
                        slot: current,
                        verdict: Verdict::Busy,
                        previous: None,
                        abandoned_earlier: Vec::new(),
                    });
                }
            },
        };
        if let Overlap::Wait(_) = self.overlap {
            // The wait for the lock may have crossed slot boundaries: the slot to claim
            // is the one the ledger's clock is in now, and the slot before it is the one
            // the crash and missed-slot policies settle.
            current = self.schedule.slot_at(ledger.now().await?)?;
            previous = self.schedule.previous(&current)?;
        }
        // The claims below settle this slot and the one before; the rows before those
        // still `running` are settled here.
        let abandoned_earlier = self
            .abandon_earlier(locks, ledger, shared.is_some(), &previous)
            .await?;
        for _ in &abandoned_earlier {
            self.metrics.ran(Outcome::Abandoned);
        }
        let previous_verdict = self
            .settle_locked(
                locks,
                ledger,
                shared.as_ref(),
                previous,
                SlotKind::Previous,
                &mut run,
            )
            .await?;
        let mut previous = match previous_verdict {
            Settle::Verdict(verdict) => verdict.map(|verdict| (previous, verdict)),
            Settle::NotDue(_) => None,
        };
        // The slot this firing is for: if the clock leaves it before it is claimed (a
        // catch-up or a re-run of the slot before outlasted it, or a claim raced the
        // boundary), it becomes the slot before the one claimed, and is settled as such.
        let mut fired_in = Some(current);
        for _ in 0..MAX_CLAIMS {
            let settled = self
                .settle_locked(
                    locks,
                    ledger,
                    shared.as_ref(),
                    current,
                    SlotKind::Current,
                    &mut run,
                )
                .await?;
            match settled {
                Settle::NotDue(now) => {
                    let next = self.schedule.slot_at(now)?;
                    if let Some(left) = fired_in.take()
                        && next.start() > left.start()
                        && self.schedule.previous(&next)? == left
                    {
                        let settled = self
                            .settle_locked(
                                locks,
                                ledger,
                                shared.as_ref(),
                                left,
                                SlotKind::Previous,
                                &mut run,
                            )
                            .await?;
                        if let Settle::Verdict(Some(verdict)) = settled {
                            previous = Some((left, verdict));
                        }
                    }
                    current = next;
                }
                Settle::Verdict(verdict) => {
                    if let Some(guard) = shared {
                        guard.release().await;
                    }
                    return Ok(RunReport {
                        slot: current,
                        verdict: verdict.unwrap_or(Verdict::AlreadyRun(Outcome::Missed)),
                        previous,
                        abandoned_earlier,
                    });
                }
            }
        }
        Err(RunError::ClockRacing)
    }

    /// Marks `abandoned` the job's rows before `previous` still `running` whose runners
    /// are gone: all of them when this firing holds the job's lock (`shared`: no other
    /// runner of the job runs anything), else (under [`Overlap::Allow`]) each one whose
    /// slot's own lock is free, taken for the marking and released after. A slot's lock
    /// key is its start alone, so a row whose start is not one of this schedule's (the
    /// schedule changed since) is settled the same way: its run, if still going, holds
    /// that key.
    async fn abandon_earlier<L: DistributedLock, G: Ledger>(
        &self,
        locks: &L,
        ledger: &G,
        shared: bool,
        previous: &Slot,
    ) -> Result<Vec<OffsetDateTime>, RunError> {
        let stale = ledger.running_before(&self.name, previous.start()).await?;
        if stale.is_empty() {
            return Ok(stale);
        }
        if shared {
            return Ok(ledger.abandon_stale(&self.name, &stale).await?);
        }
        let mut abandoned = Vec::new();
        for start in stale {
            let Some(guard) = locks
                .try_acquire(&self.slot_lock_key(start))
                .await
                .map_err(RunError::Lock)?
            else {
                continue; // its run is still going
            };
            let marked = ledger.abandon_stale(&self.name, &[start]).await;
            guard.release().await;
            abandoned.extend(marked?);
        }
        Ok(abandoned)
    }

    /// The lock, or `None` when it is held elsewhere (at once under `Skip` and `Allow`,
    /// after the wait under `Wait`).
    async fn lock<L: DistributedLock>(
        &self,
        locks: &L,
        key: &str,
    ) -> Result<Option<L::Guard>, RunError> {
        match self.overlap {
            Overlap::Wait(timeout) => match locks.acquire(key, timeout).await {
                Ok(guard) => Ok(Some(guard)),
                Err(error) if error.kind() == AcquisitionErrorKind::Timeout => Ok(None),
                Err(error) => Err(RunError::Lock(error)),
            },
            Overlap::Skip | Overlap::Allow => locks.try_acquire(key).await.map_err(RunError::Lock),
        }
    }

    /// Settles `slot` holding `shared` (the job's lock), or else (under
    /// [`Overlap::Allow`]) holding the slot's own lock, taken here and released after.
    async fn settle_locked<L, G, F, Fut, E>(
        &self,
        locks: &L,
        ledger: &G,
        shared: Option<&L::Guard>,
        slot: Slot,
        kind: SlotKind,
        run: &mut F,
    ) -> Result<Settle, RunError>
    where
        L: DistributedLock,
        G: Ledger,
        F: FnMut(JobContext) -> Fut + Send,
        Fut: Future<Output = Result<(), E>> + Send,
        E: fmt::Display,
    {
        if let Some(guard) = shared {
            return self.settle(ledger, guard, slot, kind, run).await;
        }
        let Some(guard) = self.lock(locks, &self.lock_key(Some(&slot))).await? else {
            self.metrics.busy();
            return Ok(Settle::Verdict(Some(Verdict::Busy)));
        };
        let settled = self.settle(ledger, &guard, slot, kind, run).await;
        guard.release().await;
        settled
    }

    /// Claims `slot` holding `guard` and runs the job if granted.
    async fn settle<G, F, Fut, E>(
        &self,
        ledger: &G,
        guard: &impl LockGuard,
        slot: Slot,
        kind: SlotKind,
        run: &mut F,
    ) -> Result<Settle, RunError>
    where
        G: Ledger,
        F: FnMut(JobContext) -> Fut + Send,
        Fut: Future<Output = Result<(), E>> + Send,
        E: fmt::Display,
    {
        let claim = Claim {
            name: &self.name,
            slot,
            kind,
            holder: &self.holder,
            crash: self.crash,
            missed: self.missed,
        };
        let (attempt, previous, started) = match ledger.claim(&claim).await? {
            ClaimAnswer::NotDue { now } => return Ok(Settle::NotDue(now)),
            ClaimAnswer::NothingToDo => return Ok(Settle::Verdict(None)),
            ClaimAnswer::Done(outcome) => {
                self.metrics.already_run(outcome);
                return Ok(Settle::Verdict(Some(Verdict::AlreadyRun(outcome))));
            }
            ClaimAnswer::Settled(outcome) => {
                if outcome == Outcome::Missed {
                    self.metrics.missed();
                } else {
                    self.metrics.ran(outcome);
                }
                return Ok(Settle::Verdict(Some(Verdict::Settled(outcome))));
            }
            ClaimAnswer::Claimed {
                attempt,
                previous,
                started,
            } => (attempt, previous, started),
        };
        let lateness = Duration::try_from(started - slot.start()).unwrap_or(Duration::ZERO);
        let catch_up = kind == SlotKind::Previous;
        self.metrics.late(lateness, catch_up);
        let context = JobContext {
            slot,
            attempt,
            previous,
            catch_up,
            lateness,
            lost: guard.lost(),
        };
        let (outcome, detail) = match run(context).await {
            Ok(()) => (Outcome::Succeeded, None),
            Err(error) => (Outcome::Failed, Some(error.to_string())),
        };
        let lock_lost = guard.is_lost();
        let attempt_id = Attempt {
            name: &self.name,
            slot: slot.start(),
            attempt,
            holder: &self.holder,
        };
        let recorded = ledger
            .finish(&attempt_id, outcome, detail.as_deref())
            .await?;
        self.metrics.ran(outcome);
        Ok(Settle::Verdict(Some(Verdict::Ran {
            attempt,
            outcome,
            lock_lost,
            recorded,
        })))
    }
}

/// `pid@host`: the host from `/proc/sys/kernel/hostname` (Linux) or `$HOSTNAME`.
fn default_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{}@{host}", std::process::id())
}
