//! Scheduled jobs across a failover: a throwaway primary with a streaming standby, and
//! schedulers on pools of the multi-host URL (`target_session_attrs=read-write`), so they
//! reach the promoted standby once it takes writes. The primary stops at once
//! (`pg_ctl stop -m immediate`), the standby is promoted after a failover manager's delay.
//!
//! With synchronous replication the ledger's exactly-once holds: every claim a scheduler
//! saw committed is on the standby, so no slot runs twice, and the loops resume on the
//! promoted standby within [`CLOCK_RETRY_PAUSE`] + a period (+ slack for connecting). With
//! asynchronous replication a claim the old primary had not shipped is lost, and the slot
//! runs again. What happens to the slots of the failover window is in ADR 0021.
//!
//! Its own test binary: every test starts its own pair of clusters (one test at a time, so
//! the slot timing does not share two cores with another pair's start-up).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Pool;
use locks_schedule::{
    CLOCK_RETRY_PAUSE, JobContext, Ledger, MissedSlots, Outcome, RunRecord, Schedule, ScheduledJob,
    Slot,
};
use locks_schedule_postgres::{PostgresLedger, install_ledger};
use throwaway_pg::PrimaryWithStandby;
use throwaway_pg::testing::unique;
use tokio::sync::Notify;

/// The synchronous case's slots.
const SCHEDULE: &str = "every 500ms";
const PERIOD: Duration = Duration::from_millis(500);
/// How many schedulers loop on the job (each its own lock manager and ledger pool).
const SCHEDULERS: usize = 3;
/// The run during which the primary is stopped (by the job itself, so the stop lands while
/// a run holds the lock and its claim is committed): about three seconds of slots before.
const STOP_AT_RUN: usize = 6;
/// The failover manager's delay between the primary's death and the promotion: three
/// periods, so the first firing on the promoted standby is at least two slots after the
/// slot that was running when the primary died.
const PROMOTION_DELAY: Duration = Duration::from_millis(1500);
/// Connecting anew (the first host refuses, the second is tried), taking the lock and
/// claiming, on two shared cores.
const SLACK: Duration = Duration::from_secs(1);
/// The documented resumption bound: a loop whose ledger could not say the time asks again
/// after [`CLOCK_RETRY_PAUSE`] and then fires at once in the slot the clock is in; a loop
/// that found the clock in the slot it had fired in waits for the next boundary (at most a
/// period).
const RESUME_BOUND: Duration = CLOCK_RETRY_PAUSE
    .saturating_add(PERIOD)
    .saturating_add(SLACK);
/// How long the loops run on the promoted standby after it is promoted.
const RUN_AFTER: Duration = Duration::from_secs(4);
/// The lock managers' keepalive.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// The asynchronous case's slots: long enough that the failover and the other host's
/// firing land in the slot that ran on the old primary, or the one after.
const ASYNC_SCHEDULE: &str = "every 3s";

/// One test at a time: each starts two clusters and times slots.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts the pair off the runtime's worker (starting clusters blocks for seconds).
async fn pair(synchronous: bool) -> Arc<PrimaryWithStandby> {
    Arc::new(
        blocking(move || {
            PrimaryWithStandby::builder()
                .synchronous(synchronous)
                .start()
                .expect("start a primary with a streaming standby")
        })
        .await,
    )
}

/// Runs a blocking cluster operation off the runtime's worker.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("a blocking task")
}

fn pool(url: &str, size: usize) -> Pool {
    locks_postgres::plain_pool(url, size).expect("a pool")
}

/// Installs the ledger table through the multi-host URL (on the primary).
async fn install(url: &str) {
    let admin = pool(url, 1);
    install_ledger(&admin.get().await.expect("a connection"))
        .await
        .expect("install the ledger");
}

fn lock(mutex: &Mutex<Vec<Run>>) -> std::sync::MutexGuard<'_, Vec<Run>> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One run of the job, as the job saw it.
#[derive(Debug, Clone)]
struct Run {
    slot: Slot,
    scheduler: usize,
    at: Instant,
    catch_up: bool,
}

/// What the schedulers' jobs share with the test.
struct Shared {
    pair: Arc<PrimaryWithStandby>,
    runs: Mutex<Vec<Run>>,
    /// Notified by the run that stopped the primary, once it is stopped.
    stopped: Notify,
}

fn holder(scheduler: usize) -> String {
    format!("scheduler-{scheduler}")
}

/// A scheduler: its own lock manager and ledger on the multi-host URL, looping
/// `run_every_slot`; its job records each run, and the [`STOP_AT_RUN`]th run stops the
/// primary before it returns.
fn scheduler(
    index: usize,
    name: &str,
    url: &str,
    shared: &Arc<Shared>,
) -> tokio::task::JoinHandle<()> {
    let locks = PostgresLockManager::builder(pool(url, 2))
        .holder_id(holder(index))
        .keepalive(Some(KEEPALIVE))
        .build();
    let ledger = PostgresLedger::new(pool(url, 2));
    let job = ScheduledJob::new(name, SCHEDULE.parse::<Schedule>().expect("a schedule"))
        .holder(holder(index));
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let ended = job
            .run_every_slot(&locks, &ledger, |context: JobContext| {
                let shared = Arc::clone(&shared);
                async move {
                    let count = {
                        let mut runs = lock(&shared.runs);
                        runs.push(Run {
                            slot: context.slot,
                            scheduler: index,
                            at: Instant::now(),
                            catch_up: context.catch_up,
                        });
                        runs.len()
                    };
                    if count == STOP_AT_RUN {
                        let pair = Arc::clone(&shared.pair);
                        blocking(move || pair.stop_primary_immediately())
                            .await
                            .expect("stop the primary");
                        shared.stopped.notify_one();
                    }
                    Ok::<(), String>(())
                }
            })
            .await;
        panic!("scheduler {index}'s loop ended: {ended:?}");
    })
}

/// The slots from `first` to `last`, both included.
fn slots_between(schedule: &Schedule, first: Slot, last: Slot) -> Vec<Slot> {
    let mut slots = vec![first];
    let mut slot = first;
    while slot < last {
        slot = schedule.slot_at(slot.next()).expect("a slot");
        slots.push(slot);
    }
    slots
}

/// Synchronous replication, three schedulers on 500 ms slots, the primary stopped while a
/// run holds the lock and the standby promoted 1.5 s later:
///
/// - no slot runs twice, and every run's claim is in the promoted standby's ledger under
///   its scheduler, attempt 1 (the claims were on the standby before the runs began);
/// - every slot before the stop and after the resumption runs (none missed);
/// - the first run on the promoted standby starts within [`RESUME_BOUND`] (1 s
///   [`CLOCK_RETRY_PAUSE`] + a 500 ms period + 1 s slack) of the promotion;
/// - the failover window's slots do not run: under the default `MissedSlots::Skip` the
///   first firing on the promoted standby records the slot before its own as `missed`
///   (the one before that if its claim crossed a boundary), and the window's other slots
///   get no row at all;
/// - the run the primary died under ran once; its outcome could not be recorded, and no
///   claim reaches its row (a claim settles its slot and the one before, and the first
///   firing came two or more slots later): the first firing on the promoted standby,
///   holding the job's lock, marks it `abandoned` (before 2026-12-07 it stayed
///   `running`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_synchronous_replication_each_slot_runs_once_across_a_failover() {
    let _serial = SERIAL.lock().await;
    let pair = pair(true).await;
    let url = pair.multi_host_url();
    install(&url).await;
    let name = unique("failover");
    let schedule: Schedule = SCHEDULE.parse().expect("a schedule");
    let shared = Arc::new(Shared {
        pair: Arc::clone(&pair),
        runs: Mutex::new(Vec::new()),
        stopped: Notify::new(),
    });
    let loops: Vec<_> = (0..SCHEDULERS)
        .map(|index| scheduler(index, &name, &url, &shared))
        .collect();

    tokio::time::timeout(Duration::from_secs(30), shared.stopped.notified())
        .await
        .expect("the primary is stopped by a run within 30 s");
    let stopped_at = Instant::now();
    tokio::time::sleep(PROMOTION_DELAY).await;
    blocking({
        let pair = Arc::clone(&pair);
        move || pair.promote_standby().expect("promote the standby")
    })
    .await;
    let promoted_at = Instant::now();
    let resumed_at = loop {
        if let Some(run) = lock(&shared.runs).get(STOP_AT_RUN) {
            break run.at;
        }
        assert!(
            promoted_at.elapsed() < Duration::from_secs(20),
            "no run on the promoted standby within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(RUN_AFTER.saturating_sub(promoted_at.elapsed())).await;
    for handle in &loops {
        assert!(!handle.is_finished(), "a loop ended: {:?}", loops);
    }
    for handle in loops {
        handle.abort();
        let _ = handle.await;
    }

    let runs = lock(&shared.runs).clone();
    let ledger = PostgresLedger::new(pool(&url, 1));
    let rows: BTreeMap<Slot, RunRecord> = ledger
        .runs(Some(&name), 1000)
        .await
        .expect("the promoted standby's ledger")
        .into_iter()
        .map(|row| (schedule.slot_at(row.slot).expect("a slot"), row))
        .collect();
    let mut by_slot: BTreeMap<Slot, Vec<&Run>> = BTreeMap::new();
    for run in &runs {
        by_slot.entry(run.slot).or_default().push(run);
    }
    let (died_under, first_after) = (runs[STOP_AT_RUN - 1].slot, runs[STOP_AT_RUN].slot);
    let resumed_after = resumed_at.saturating_duration_since(promoted_at);
    let window = slots_between(&schedule, died_under, first_after);
    let window = &window[1..window.len() - 1];
    let shown_runs: Vec<String> = runs
        .iter()
        .map(|run| format!("{} by {}", run.slot, run.scheduler))
        .collect();
    let shown_rows: Vec<String> = rows
        .iter()
        .map(|(slot, row)| format!("{slot} {} {}", row.holder, row.outcome.as_str()))
        .collect();
    eprintln!(
        "synchronous failover: promoted {:?} after the stop; first run on the promoted \
         standby {resumed_after:?} after the promotion (bound {RESUME_BOUND:?}); window of \
         {} slots not run; {} runs ({} before the stop); rows: {shown_rows:?}",
        promoted_at - stopped_at,
        window.len(),
        runs.len(),
        STOP_AT_RUN,
    );

    for (slot, runs) in &by_slot {
        assert_eq!(
            runs.len(),
            1,
            "slot {slot} ran {} times: {runs:?}",
            runs.len()
        );
    }
    assert!(
        runs.iter().all(|run| !run.catch_up),
        "no catch-up under MissedSlots::Skip: {shown_runs:?}"
    );
    for run in &runs {
        let row = rows.get(&run.slot).unwrap_or_else(|| {
            panic!(
                "slot {} ran but its claim was lost: {shown_rows:?}",
                run.slot
            )
        });
        assert_eq!(
            (row.holder.as_str(), row.attempt),
            (holder(run.scheduler).as_str(), 1),
            "slot {}: {row:?}",
            run.slot
        );
    }
    for slot in slots_between(&schedule, runs[0].slot, died_under)
        .into_iter()
        .chain(slots_between(
            &schedule,
            first_after,
            runs[runs.len() - 1].slot,
        ))
    {
        assert!(
            by_slot.contains_key(&slot),
            "slot {slot} did not run while the servers were up: {shown_runs:?}"
        );
    }
    assert!(
        resumed_after <= RESUME_BOUND,
        "the first run on the promoted standby came {resumed_after:?} after the promotion \
         (bound {RESUME_BOUND:?})"
    );
    assert!(
        window.len() >= 2,
        "the promotion came {PROMOTION_DELAY:?} after the stop: {window:?}"
    );
    let window_rows: Vec<(&Slot, &RunRecord)> =
        rows.range(window[0]..=window[window.len() - 1]).collect();
    assert_eq!(
        window_rows.len(),
        1,
        "one missed slot recorded: {shown_rows:?}"
    );
    let (missed, row) = window_rows[0];
    assert_eq!(row.outcome, Outcome::Missed, "{row:?}");
    assert!(
        window[window.len() - 2..].contains(missed),
        "the slot recorded missed is just before the first firing's: {shown_rows:?}"
    );
    let died = &rows[&died_under];
    assert_eq!(
        died.outcome,
        Outcome::Abandoned,
        "the run the primary died under: its outcome was never recorded, and a later \
         firing holding the job's lock settles it: {died:?}"
    );
    assert!(died.finished.is_some(), "{died:?}");
}

/// Fires `job` once, recording a run in `runs` as `who`.
async fn fire(
    job: &ScheduledJob,
    locks: &PostgresLockManager,
    ledger: &PostgresLedger,
    runs: &Arc<Mutex<Vec<(Slot, &'static str)>>>,
    who: &'static str,
) -> Result<locks_schedule::RunReport, locks_schedule::RunError> {
    let runs = Arc::clone(runs);
    job.run_once_per_slot(locks, ledger, move |context: JobContext| {
        runs.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((context.slot, who));
        async { Ok::<(), String>(()) }
    })
    .await
}

/// Sleeps until the ledger's clock is 100 ms into the next slot.
async fn next_slot(ledger: &PostgresLedger, schedule: &Schedule) {
    let now = ledger.now().await.expect("the server's clock");
    let slot = schedule.slot_at(now).expect("a slot");
    let wait = Duration::try_from(slot.next() - now).unwrap_or(Duration::ZERO);
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
}

/// Why the synchronous standby matters: with asynchronous streaming, a slot whose claim
/// the old primary had not shipped runs again on the promoted standby. The standby is cut
/// off (as a lagging standby would be) after one slot ran and was replayed; the next slot
/// runs on the old primary, which then dies; the standby is promoted and another host
/// fires. It finds no row for that slot and runs it again: as the current slot if still in
/// it, as the latest missed slot (`MissedSlots::RunLatest`) if in the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_asynchronous_replication_a_slot_run_on_the_old_primary_runs_again() {
    let _serial = SERIAL.lock().await;
    let pair = pair(false).await;
    let url = pair.multi_host_url();
    install(&url).await;
    let name = unique("async-failover");
    let job = |holder: &str| {
        ScheduledJob::new(&name, ASYNC_SCHEDULE.parse().expect("a schedule"))
            .missed(MissedSlots::RunLatest)
            .holder(holder)
    };
    let (old_host, new_host) = (job("old-host"), job("new-host"));
    let (old_locks, old_ledger) = (
        PostgresLockManager::new(pool(&url, 2)),
        PostgresLedger::new(pool(&url, 2)),
    );
    let (new_locks, new_ledger) = (
        PostgresLockManager::new(pool(&url, 2)),
        PostgresLedger::new(pool(&url, 2)),
    );
    let runs = Arc::new(Mutex::new(Vec::new()));

    next_slot(&old_ledger, old_host.schedule()).await;
    let shipped = fire(&old_host, &old_locks, &old_ledger, &runs, "old-host")
        .await
        .expect("a firing");
    assert!(shipped.verdict.ran(), "{shipped:?}");
    blocking({
        let pair = Arc::clone(&pair);
        move || pair.cut_standby_off().expect("cut the standby off")
    })
    .await;

    next_slot(&old_ledger, old_host.schedule()).await;
    let unshipped = fire(&old_host, &old_locks, &old_ledger, &runs, "old-host")
        .await
        .expect("a firing");
    assert!(unshipped.verdict.ran(), "{unshipped:?}");
    let failed_over = Instant::now();
    blocking({
        let pair = Arc::clone(&pair);
        move || {
            pair.stop_primary_immediately().expect("stop the primary");
            pair.promote_standby().expect("promote the standby");
        }
    })
    .await;
    let after = loop {
        match fire(&new_host, &new_locks, &new_ledger, &runs, "new-host").await {
            Ok(report) => break report,
            Err(error) => {
                assert!(
                    failed_over.elapsed() < Duration::from_secs(10),
                    "no firing on the promoted standby within 10 s: {error}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let runs = runs.lock().unwrap_or_else(PoisonError::into_inner).clone();
    eprintln!(
        "asynchronous failover, standby cut off: firing on the promoted standby {:?} after \
         the stop: {after:?}; runs: {runs:?}",
        failed_over.elapsed()
    );
    let slot = unshipped.slot;
    let again = runs.iter().filter(|(ran, _)| *ran == slot).count();
    assert_eq!(
        again, 2,
        "slot {slot} ran on the old primary, its claim was not shipped, and it ran again on \
         the promoted standby: {runs:?}"
    );
    let ran_again = (after.slot == slot && after.verdict.ran())
        || after
            .previous
            .as_ref()
            .is_some_and(|(previous, verdict)| *previous == slot && verdict.ran());
    assert!(ran_again, "{after:?}");
    let row = new_ledger
        .runs(Some(&name), 10)
        .await
        .expect("runs")
        .into_iter()
        .find(|row| row.slot == slot.start())
        .expect("the slot's row on the promoted standby");
    assert_eq!(
        row.holder, "new-host",
        "the old primary's claim is gone: {row:?}"
    );
}
