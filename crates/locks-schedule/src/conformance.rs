//! The schedule's contract, run by every ledger (feature `conformance`): the in-memory
//! one on a manual clock, the PostgreSQL one on the server's clock.
//!
//! Each case takes a [`Harness`]: two hosts' lock managers (which may be one manager in a
//! single-process double), one ledger, and a way to move to the start of the next slot.
//! Every case panics with what broke.

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use locks_port::DistributedLock;

mod every_slot;
mod stored_text;

pub use every_slot::{
    LOOP_SKEWS_MS, LoopRuns, SkewedLedger, every_slot_runs_each_slot_once, run_skewed_loops,
};
pub use stored_text::{
    a_job_error_holding_a_nul_is_recorded, holders_a_ledger_cannot_keep_are_refused,
    job_names_a_ledger_cannot_keep_are_refused,
};

use crate::{
    CrashPolicy, JobContext, Ledger, MissedSlots, Outcome, Overlap, RunReport, Schedule,
    ScheduledJob, Verdict,
};

/// What a contract case needs of a ledger under test.
pub trait Harness: Send + Sync {
    /// The lock manager type.
    type Locks: DistributedLock;
    /// The ledger type.
    type Ledger: Ledger;

    /// Host `host`'s lock manager (`host` is 0 or 1).
    fn locks(&self, host: usize) -> &Self::Locks;
    /// The ledger every host shares.
    fn ledger(&self) -> &Self::Ledger;
    /// The schedule the cases use; slots long enough for a case's few firings (the
    /// PostgreSQL harness: a few seconds).
    fn schedule(&self) -> Schedule;
    /// A job name no other case uses.
    fn job_name(&self, case: &str) -> String;
    /// Returns once the ledger's clock is just past the start of the next slot.
    fn next_slot(&self) -> impl Future<Output = ()> + Send;
}

/// Every case, in order.
pub async fn run_all<H: Harness>(harness: &H) {
    one_run_per_slot(harness).await;
    overlap_skip_is_busy(harness).await;
    overlap_wait_runs_once_the_lock_frees(harness).await;
    overlap_allow_runs_beside_another_slot(harness).await;
    at_most_once_abandons_a_dead_run(harness).await;
    at_least_once_reruns_a_dead_run(harness).await;
    at_least_once_retries_failures_up_to_the_bound(harness).await;
    a_dead_run_is_settled_in_the_next_slot(harness).await;
    an_older_dead_run_is_abandoned_by_a_later_firing(harness).await;
    missed_slots_are_recorded(harness).await;
    the_latest_missed_slot_runs_once(harness).await;
    prune_keeps_each_jobs_latest_row(harness).await;
    job_names_a_ledger_cannot_keep_are_refused(harness).await;
    holders_a_ledger_cannot_keep_are_refused(harness).await;
    a_job_error_holding_a_nul_is_recorded(harness).await;
}

/// What the jobs of a case were told, run by run.
#[derive(Debug, Default)]
struct Seen {
    runs: Mutex<Vec<(u32, Option<Outcome>)>>,
}

impl Seen {
    fn record(&self, context: &JobContext) {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.push((context.attempt, context.previous));
    }

    fn attempts(&self) -> Vec<(u32, Option<Outcome>)> {
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn count(&self) -> usize {
        self.attempts().len()
    }
}

/// The attempt and outcome of a verdict that ran the job.
fn ran(verdict: &Verdict) -> Option<(u32, Outcome)> {
    match verdict {
        Verdict::Ran {
            attempt, outcome, ..
        } => Some((*attempt, *outcome)),
        _ => None,
    }
}

/// The latest `limit` ledger rows of `job`.
async fn rows<H: Harness>(harness: &H, job: &ScheduledJob, limit: u32) -> Vec<crate::RunRecord> {
    harness
        .ledger()
        .runs(Some(job.name()), limit)
        .await
        .expect("runs")
}

fn job<H: Harness>(harness: &H, case: &str) -> ScheduledJob {
    ScheduledJob::new(harness.job_name(case), harness.schedule()).holder(case.to_owned())
}

/// Host `host` takes `key` (a lock a runner would hold), which must be free.
async fn hold<H: Harness>(
    harness: &H,
    host: usize,
    key: &str,
) -> <H::Locks as DistributedLock>::Guard {
    (harness.locks(host).try_acquire(key).await)
        .expect("lock")
        .unwrap_or_else(|| panic!("{key} is free"))
}

async fn fire<H: Harness>(harness: &H, host: usize, job: &ScheduledJob, runs: &Seen) -> RunReport {
    job.run_once_per_slot(harness.locks(host), harness.ledger(), |context| {
        runs.record(&context);
        async { Ok::<(), std::convert::Infallible>(()) }
    })
    .await
    .expect("a firing")
}

/// A firing whose job never returns, dropped part-way: a runner that dies mid-job.
/// Returns once the job had started.
async fn die_mid_job<H: Harness>(harness: &H, host: usize, job: &ScheduledJob) {
    let started = Arc::new(tokio::sync::Notify::new());
    let signal = Arc::clone(&started);
    let firing = job.run_once_per_slot(harness.locks(host), harness.ledger(), move |_context| {
        let signal = Arc::clone(&signal);
        async move {
            signal.notify_one();
            std::future::pending::<Result<(), std::convert::Infallible>>().await
        }
    });
    tokio::select! {
        result = firing => panic!("the job never returns, yet the firing did: {result:?}"),
        () = started.notified() => {}
    }
}

/// Fires until `done` says so of a firing's report (a lock a dropped guard left behind
/// may be released in the background), for up to 5 s; `waiting` says what for.
async fn fire_until<H: Harness>(
    harness: &H,
    host: usize,
    job: &ScheduledJob,
    runs: &Seen,
    done: impl Fn(&RunReport) -> bool,
    waiting: &str,
) -> RunReport {
    for _ in 0..100 {
        let report = fire(harness, host, job, runs).await;
        if done(&report) {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("after 5 s: {waiting}");
}

/// Fires until the lock a dead firing left behind is free (its release may run in the
/// background), for up to 5 s.
async fn fire_when_free<H: Harness>(
    harness: &H,
    host: usize,
    job: &ScheduledJob,
    runs: &Seen,
) -> RunReport {
    let free = |report: &RunReport| report.verdict != Verdict::Busy;
    let waiting = "the job's lock stayed held after its holder was dropped";
    fire_until(harness, host, job, runs, free, waiting).await
}

/// Two hosts fire in one slot: one runs, the other finds it run; the next slot runs again.
pub async fn one_run_per_slot<H: Harness>(harness: &H) {
    let job = job(harness, "one_run");
    let runs = Seen::default();
    harness.next_slot().await;
    let first = fire(harness, 0, &job, &runs).await;
    assert_eq!(
        first.verdict,
        Verdict::Ran {
            attempt: 1,
            outcome: Outcome::Succeeded,
            lock_lost: false,
            recorded: true
        }
    );
    assert_eq!(first.previous, None, "a new job has nothing to catch up");
    let second = fire(harness, 1, &job, &runs).await;
    assert_eq!(second.slot, first.slot);
    assert_eq!(second.verdict, Verdict::AlreadyRun(Outcome::Succeeded));
    assert_eq!(runs.count(), 1);
    harness.next_slot().await;
    let next = fire(harness, 1, &job, &runs).await;
    assert!(next.verdict.ran(), "{next:?}");
    assert!(next.slot.start() > first.slot.start());
    assert_eq!(next.previous, None, "the slot before ran");
    let rows = rows(harness, &job, 10).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|row| row.outcome == Outcome::Succeeded && row.finished.is_some())
    );
}

/// A firing that finds the job's lock held does nothing.
pub async fn overlap_skip_is_busy<H: Harness>(harness: &H) {
    let job = job(harness, "busy").overlap(Overlap::Skip);
    let runs = Seen::default();
    let guard = hold(harness, 1, &job.lock_key(None)).await;
    let report = fire(harness, 0, &job, &runs).await;
    assert_eq!(report.verdict, Verdict::Busy);
    assert_eq!(runs.count(), 0);
    drop(guard);
}

/// At-most-once: a dead runner's slot is marked abandoned, not run again.
pub async fn at_most_once_abandons_a_dead_run<H: Harness>(harness: &H) {
    let job = job(harness, "at_most_once").crash(CrashPolicy::AtMostOnce);
    let runs = Seen::default();
    harness.next_slot().await;
    die_mid_job(harness, 0, &job).await;
    let report = fire_when_free(harness, 1, &job, &runs).await;
    assert_eq!(
        report.verdict,
        Verdict::Settled(Outcome::Abandoned),
        "{report:?}"
    );
    let again = fire(harness, 1, &job, &runs).await;
    assert_eq!(again.verdict, Verdict::AlreadyRun(Outcome::Abandoned));
    assert_eq!(runs.count(), 0);
}

/// At-least-once: the next firing runs a dead runner's slot again, as attempt 2, told
/// the previous attempt was abandoned.
pub async fn at_least_once_reruns_a_dead_run<H: Harness>(harness: &H) {
    let max_attempts = NonZeroU32::new(2).expect("2");
    let job = job(harness, "at_least_once").crash(CrashPolicy::AtLeastOnce { max_attempts });
    harness.next_slot().await;
    die_mid_job(harness, 0, &job).await;
    let runs = Seen::default();
    let report = fire_when_free(harness, 1, &job, &runs).await;
    assert_eq!(
        ran(&report.verdict),
        Some((2, Outcome::Succeeded)),
        "{report:?}"
    );
    assert_eq!(runs.attempts(), [(2, Some(Outcome::Abandoned))]);
}

/// At-least-once retries a failed run up to `max_attempts` attempts in all.
pub async fn at_least_once_retries_failures_up_to_the_bound<H: Harness>(harness: &H) {
    let max_attempts = NonZeroU32::new(2).expect("2");
    let job = job(harness, "retries").crash(CrashPolicy::AtLeastOnce { max_attempts });
    harness.next_slot().await;
    let mut verdicts = Vec::new();
    for host in [0, 1, 0] {
        let report = job
            .run_once_per_slot(
                harness.locks(host),
                harness.ledger(),
                |context: JobContext| async move {
                    Err::<(), String>(format!("attempt {} failed", context.attempt))
                },
            )
            .await
            .expect("a firing");
        verdicts.push(report.verdict);
    }
    assert_eq!(
        ran(&verdicts[0]),
        Some((1, Outcome::Failed)),
        "{verdicts:?}"
    );
    assert_eq!(
        ran(&verdicts[1]),
        Some((2, Outcome::Failed)),
        "{verdicts:?}"
    );
    assert_eq!(
        verdicts[2],
        Verdict::AlreadyRun(Outcome::Failed),
        "the bound of 2 attempts"
    );
    let rows = rows(harness, &job, 1).await;
    assert_eq!(rows[0].detail.as_deref(), Some("attempt 2 failed"));
}

/// A dead run is settled by the first firing of the next slot: re-run (at-least-once) as
/// a catch-up, before the current slot runs.
pub async fn a_dead_run_is_settled_in_the_next_slot<H: Harness>(harness: &H) {
    let max_attempts = NonZeroU32::new(3).expect("3");
    let job = job(harness, "dead_then_next").crash(CrashPolicy::AtLeastOnce { max_attempts });
    let runs = Seen::default();
    harness.next_slot().await;
    die_mid_job(harness, 0, &job).await;
    harness.next_slot().await;
    let report = fire_when_free(harness, 1, &job, &runs).await;
    let (_, previous) = report.previous.clone().expect("the dead slot settled");
    assert_eq!(ran(&previous), Some((2, Outcome::Succeeded)), "{report:?}");
    assert!(report.verdict.ran(), "{report:?}");
    assert_eq!(runs.count(), 2);
}

/// A dead run two slots back, which no claim reaches (a claim settles its slot and the
/// one before): the next firing that holds the job's lock (`Overlap::Skip`) marks its row
/// `abandoned` and reports it, once. Under `Overlap::Allow` a firing marks it only once
/// the slot's own lock is free: held (a run still going), the row stays `running`.
pub async fn an_older_dead_run_is_abandoned_by_a_later_firing<H: Harness>(harness: &H) {
    let skip = job(harness, "older_dead_skip").overlap(Overlap::Skip);
    let allow = job(harness, "older_dead_allow").overlap(Overlap::Allow);
    let runs = Seen::default();
    harness.next_slot().await;
    die_mid_job(harness, 0, &skip).await;
    die_mid_job(harness, 0, &allow).await;
    let dead = rows(harness, &skip, 1).await[0].slot;
    harness.next_slot().await;
    harness.next_slot().await;
    let report = fire_when_free(harness, 1, &skip, &runs).await;
    assert_eq!(report.abandoned_earlier, [dead], "{report:?}");
    assert!(report.verdict.ran(), "{report:?}");
    let dead_row = async |job| {
        let rows = rows(harness, job, 10).await;
        rows.into_iter()
            .find(|row| row.slot == dead)
            .expect("the dead run's row")
    };
    let row = dead_row(&skip).await;
    assert_eq!(row.outcome, Outcome::Abandoned, "{row:?}");
    assert!(row.finished.is_some(), "{row:?}");
    assert_eq!(
        row.detail.as_deref(),
        Some("the runner older_dead_skip died"),
        "{row:?}"
    );
    let again = fire(harness, 0, &skip, &runs).await;
    assert!(
        again.abandoned_earlier.is_empty(),
        "settled once: {again:?}"
    );
    // Under Allow, the old slot's lock held stands for its run still going.
    let dead_slot = harness
        .schedule()
        .slot_at(dead)
        .expect("the dead run's slot");
    let still_running = hold(harness, 0, &allow.lock_key(Some(&dead_slot))).await;
    let report = fire(harness, 1, &allow, &runs).await;
    assert!(report.abandoned_earlier.is_empty(), "{report:?}");
    assert_eq!(dead_row(&allow).await.outcome, Outcome::Running);
    drop(still_running);
    let marked = |report: &RunReport| !report.abandoned_earlier.is_empty();
    let waiting = "the dead run stayed running after its slot's lock was dropped";
    let report = fire_until(harness, 1, &allow, &runs, marked, waiting).await;
    assert_eq!(report.abandoned_earlier, [dead], "{report:?}");
    assert_eq!(dead_row(&allow).await.outcome, Outcome::Abandoned);
}

async fn miss_three_slots<H: Harness>(harness: &H, job: &ScheduledJob, runs: &Seen) -> RunReport {
    harness.next_slot().await;
    assert!(fire(harness, 0, job, runs).await.verdict.ran());
    for _ in 0..4 {
        harness.next_slot().await;
    }
    fire(harness, 1, job, runs).await
}

/// Every host down for three slots, `MissedSlots::Skip`: the next firing records the
/// latest missed slot as missed and runs only the current one.
pub async fn missed_slots_are_recorded<H: Harness>(harness: &H) {
    let job = job(harness, "missed_skip").missed(MissedSlots::Skip);
    let runs = Seen::default();
    let report = miss_three_slots(harness, &job, &runs).await;
    let (_, previous) = report.previous.clone().expect("the gap found");
    assert_eq!(previous, Verdict::Settled(Outcome::Missed), "{report:?}");
    assert!(report.verdict.ran());
    assert_eq!(runs.count(), 2);
    let again = fire(harness, 0, &job, &runs).await;
    assert_eq!(again.previous, None, "the gap is recorded once");
    assert_eq!(again.verdict, Verdict::AlreadyRun(Outcome::Succeeded));
}

/// Every host down for three slots, `MissedSlots::RunLatest`: the next firing runs the
/// latest missed slot once (not the three), then the current one.
pub async fn the_latest_missed_slot_runs_once<H: Harness>(harness: &H) {
    let job = job(harness, "missed_run_latest").missed(MissedSlots::RunLatest);
    let runs = Seen::default();
    let report = miss_three_slots(harness, &job, &runs).await;
    let (slot, previous) = report.previous.clone().expect("the gap found");
    assert_eq!(ran(&previous), Some((1, Outcome::Succeeded)), "{report:?}");
    assert_eq!(
        harness.schedule().previous(&report.slot).expect("previous"),
        slot
    );
    assert!(report.verdict.ran());
    assert_eq!(runs.count(), 3, "one run, one catch-up, the current slot");
    let again = fire(harness, 0, &job, &runs).await;
    assert_eq!(again.previous, None, "the catch-up runs once");
    assert_eq!(runs.count(), 3);
    let rows = rows(harness, &job, 10).await;
    assert_eq!(
        rows.len(),
        3,
        "no row for the two earlier missed slots: {rows:?}"
    );
}

/// `Overlap::Wait`: a firing waits for the holder, then runs; past its timeout it is busy.
pub async fn overlap_wait_runs_once_the_lock_frees<H: Harness>(harness: &H) {
    let job = job(harness, "wait").overlap(Overlap::Wait(Duration::from_secs(5)));
    let runs = Seen::default();
    harness.next_slot().await;
    let guard = hold(harness, 1, &job.lock_key(None)).await;
    let (report, ()) = tokio::join!(fire(harness, 0, &job, &runs), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(guard);
    });
    assert!(report.verdict.ran(), "{report:?}");
    let short = job
        .clone()
        .overlap(Overlap::Wait(Duration::from_millis(100)));
    let guard = hold(harness, 1, &short.lock_key(None)).await;
    assert_eq!(fire(harness, 0, &short, &runs).await.verdict, Verdict::Busy);
    drop(guard);
    let longest = job.clone().overlap(Overlap::Wait(Duration::MAX));
    let report = fire_when_free(harness, 0, &longest, &runs).await;
    assert_eq!(
        report.verdict,
        Verdict::AlreadyRun(Outcome::Succeeded),
        "a wait of Duration::MAX saturates"
    );
}

/// `Overlap::Allow`: a slot's run holds only that slot's lock, so the next slot runs
/// beside it.
pub async fn overlap_allow_runs_beside_another_slot<H: Harness>(harness: &H) {
    let job = job(harness, "allow").overlap(Overlap::Allow);
    let runs = Seen::default();
    harness.next_slot().await;
    let now = harness.ledger().now().await.expect("now");
    let current = harness.schedule().slot_at(now).expect("slot");
    let previous = harness.schedule().previous(&current).expect("previous");
    let still_running = hold(harness, 1, &job.lock_key(Some(&previous))).await;
    let report = fire(harness, 0, &job, &runs).await;
    assert!(report.verdict.ran(), "{report:?}");
    assert_eq!(report.previous, Some((previous, Verdict::Busy)));
    let same_slot = hold(harness, 1, &job.lock_key(Some(&current))).await;
    assert_eq!(
        fire(harness, 0, &job, &runs).await.verdict,
        Verdict::Busy,
        "the slot's own lock still excludes"
    );
    drop((still_running, same_slot));
}

/// Retention: `prune` deletes rows of slots before the cut-off, except each job's latest.
pub async fn prune_keeps_each_jobs_latest_row<H: Harness>(harness: &H) {
    let job = job(harness, "prune");
    let runs = Seen::default();
    harness.next_slot().await;
    assert!(fire(harness, 0, &job, &runs).await.verdict.ran());
    harness.next_slot().await;
    let latest = fire(harness, 0, &job, &runs).await;
    assert!(latest.verdict.ran());
    // Not later: other tests may share the ledger, and their rows are theirs.
    let cut_off = latest.slot.start();
    let deleted = harness.ledger().prune(cut_off).await.expect("prune");
    assert!(deleted >= 1, "deleted {deleted}");
    let rows = rows(harness, &job, 10).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].slot, latest.slot.start());
    let missed = fire(harness, 0, &job, &runs).await;
    assert_eq!(
        missed.previous, None,
        "the kept row still says nothing was missed"
    );
}
