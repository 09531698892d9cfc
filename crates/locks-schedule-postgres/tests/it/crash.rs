//! Runners SIGKILLed mid-job under each crash policy, and the server restarted mid-job.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_postgres::PostgresLockManager;
use locks_schedule::{
    CrashPolicy, JobContext, Ledger, Outcome, RunReport, Schedule, ScheduledJob, Slot, Verdict,
};
use locks_schedule_postgres::{PostgresLedger, install_ledger};
use throwaway_pg::ThrowawayPostgres;
use throwaway_pg::testing::child::{Child, env, say};

use crate::support::{database_url, ledger, manager, next_slot, pool_on, rows_kept, unique};

const ROLE: &str = "SCHEDULE_CHILD_ROLE";
const JOB: &str = "SCHEDULE_JOB";
const POLICY: &str = "SCHEDULE_CRASH_POLICY";

/// The crash tests' slots: long enough for a kill and a second firing inside one slot.
const PERIOD: &str = "6s";

fn policy(name: &str) -> CrashPolicy {
    match name {
        "at_most_once" => CrashPolicy::AtMostOnce,
        "at_least_once" => CrashPolicy::AtLeastOnce {
            max_attempts: NonZeroU32::new(3).expect("3"),
        },
        other => panic!("unknown crash policy {other}"),
    }
}

fn job(name: &str, crash: CrashPolicy, holder: &str) -> ScheduledJob {
    ScheduledJob::new(name, PERIOD.parse::<Schedule>().expect("a schedule"))
        .crash(crash)
        .holder(holder)
}

/// The child: fires once with a job that says `running {slot}` and never returns (the
/// parent kills it).
pub(crate) async fn child_crash() {
    let name = env(JOB);
    let job = job(&name, policy(&env(POLICY)), "killed-child");
    let locks = PostgresLockManager::new(pool_on(&database_url(), 2));
    let ledger = ledger().await;
    let report = job
        .run_once_per_slot(&locks, &ledger, |context: JobContext| async move {
            say(&format!("running {}", context.slot));
            std::future::pending::<Result<(), String>>().await
        })
        .await;
    panic!("the job never returns, yet the firing did: {report:?}");
}

/// What `report` says about `slot`, as the current slot or as the one before.
fn verdict_for(report: &RunReport, slot: &Slot) -> Option<Verdict> {
    if report.slot == *slot {
        return Some(report.verdict.clone());
    }
    report
        .previous
        .as_ref()
        .filter(|(previous, _)| previous == slot)
        .map(|(_, verdict)| verdict.clone())
}

/// What [`kill_mid_job`] returns: the job's name, the killed run's slot, the second
/// firing's report and what its job saw.
type Killed = (String, Slot, RunReport, Option<(u32, Option<Outcome>)>);

/// Starts a child that claims the current slot and runs forever, SIGKILLs it mid-job,
/// then fires from this process (another host) until the dead session's lock is free.
async fn kill_mid_job(crash: &str) -> Killed {
    let ledger = ledger().await;
    let name = unique("killed");
    let job = job(&name, policy(crash), "survivor");
    next_slot(&ledger, job.schedule(), Duration::from_millis(100)).await;
    let mut child = Child::spawn(
        format!("{crash} runner"),
        "skew::child_entry",
        [(ROLE, "crash"), (JOB, name.as_str()), (POLICY, crash)],
    );
    let running = child.expect("running").await;
    child.kill();
    let slot = job
        .schedule()
        .slot_at(ledger.now().await.expect("now"))
        .expect("slot");
    assert_eq!(running, slot.to_string(), "the child ran the current slot");
    let rows = ledger.runs(Some(&name), 5).await.expect("runs");
    assert_eq!(
        rows[0].outcome,
        Outcome::Running,
        "the killed run's row: {rows:?}"
    );
    let locks = manager();
    let seen = Arc::new(Mutex::new(None));
    for _ in 0..100 {
        let seen_by_job = Arc::clone(&seen);
        let report = job
            .run_once_per_slot(&locks, &ledger, move |context: JobContext| {
                *seen_by_job.lock().expect("seen") = Some((context.attempt, context.previous));
                async { Ok::<(), String>(()) }
            })
            .await
            .expect("a firing");
        if report.verdict != Verdict::Busy {
            let seen = *seen.lock().expect("seen");
            return (name, slot, report, seen);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the killed runner's lock stayed held for 2 s");
}

/// At-most-once: the killed runner's slot is marked abandoned and not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runner_slot_is_abandoned_at_most_once() {
    let _rows = rows_kept().await;
    let (name, slot, report, seen) = kill_mid_job("at_most_once").await;
    assert_eq!(
        verdict_for(&report, &slot),
        Some(Verdict::Settled(Outcome::Abandoned)),
        "{report:?}"
    );
    assert_eq!(seen, None, "the job did not run again");
    // This job's rows only: the at-least-once test beside it kills a runner of the same
    // holder name, often in the same slot, whose row stays `running` until re-run.
    let rows = ledger().await.runs(Some(&name), 5).await.expect("runs");
    let row = rows
        .iter()
        .find(|row| row.slot == slot.start() && row.holder == "killed-child")
        .expect("the row");
    assert_eq!((row.outcome, row.attempt), (Outcome::Abandoned, 1));
    assert_eq!(row.detail.as_deref(), Some("the runner killed-child died"));
}

/// At-least-once: the next firing runs the killed runner's slot again as attempt 2, and
/// the job is told the first attempt was abandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runner_slot_is_rerun_at_least_once() {
    let _rows = rows_kept().await;
    let (_, slot, report, seen) = kill_mid_job("at_least_once").await;
    assert!(
        matches!(
            verdict_for(&report, &slot),
            Some(Verdict::Ran {
                attempt: 2,
                outcome: Outcome::Succeeded,
                ..
            })
        ),
        "{report:?}"
    );
    assert_eq!(seen, Some((2, Some(Outcome::Abandoned))));
}

/// The server restarts while a run holds the lock: the job is told the lock is lost, its
/// outcome is recorded once the server is back, and the next firing in the slot (under
/// at-least-once) runs attempt 2 knowing attempt 1 failed; no slot runs twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_job_is_told_and_settled() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(ThrowawayPostgres::start)
            .await
            .expect("join")
            .expect("a cluster"),
    );
    let url = cluster.url();
    let admin = throwaway_pg::testing::connect(&url).await;
    install_ledger(&admin).await.expect("install");
    drop(admin);
    let ledger = PostgresLedger::new(pool_on(&url, 2));
    let locks = PostgresLockManager::builder(pool_on(&url, 2))
        .keepalive(Some(Duration::from_millis(500)))
        .build();
    let crash = CrashPolicy::AtLeastOnce {
        max_attempts: NonZeroU32::new(3).expect("3"),
    };
    let name = unique("restarted");
    let job = ScheduledJob::new(&name, "20s".parse().expect("20s"))
        .crash(crash)
        .holder("host-a");
    next_slot(&ledger, job.schedule(), Duration::from_millis(100)).await;
    let restarter = Arc::clone(&cluster);
    let report = job
        .run_once_per_slot(&locks, &ledger, move |context: JobContext| {
            let restarter = Arc::clone(&restarter);
            async move {
                tokio::task::spawn_blocking(move || restarter.restart())
                    .await
                    .expect("join")
                    .expect("restart");
                match tokio::time::timeout(Duration::from_secs(5), context.lost.clone()).await {
                    Ok(reason) => Err(format!("lock lost: {reason:?}")),
                    Err(_) => Ok(()),
                }
            }
        })
        .await
        .expect("the firing completes once the server is back");
    let Verdict::Ran {
        attempt: 1,
        outcome,
        lock_lost,
        recorded,
    } = report.verdict.clone()
    else {
        panic!("{report:?}");
    };
    assert!(
        lock_lost,
        "the restart ended the lock's session: {report:?}"
    );
    assert_eq!(outcome, Outcome::Failed, "the job saw the loss: {report:?}");
    assert!(recorded, "the outcome is recorded on the restarted server");
    let second = ScheduledJob::new(&name, "20s".parse().expect("20s"))
        .crash(crash)
        .holder("host-b");
    let seen = Arc::new(Mutex::new(None));
    let seen_by_job = Arc::clone(&seen);
    let rerun = second
        .run_once_per_slot(
            &PostgresLockManager::new(pool_on(&url, 2)),
            &ledger,
            move |context: JobContext| {
                *seen_by_job.lock().expect("seen") =
                    Some((context.slot, context.attempt, context.previous));
                async { Ok::<(), String>(()) }
            },
        )
        .await
        .expect("a firing");
    assert_eq!(rerun.slot, report.slot, "still the same slot: {rerun:?}");
    assert!(
        matches!(
            rerun.verdict,
            Verdict::Ran {
                attempt: 2,
                outcome: Outcome::Succeeded,
                ..
            }
        ),
        "{rerun:?}"
    );
    assert_eq!(
        *seen.lock().expect("seen"),
        Some((report.slot, 2, Some(Outcome::Failed)))
    );
    let rows = ledger.runs(Some(&name), 5).await.expect("runs");
    assert_eq!(rows.len(), 1, "{rows:?}");
    drop((locks, ledger));
    let cluster = Arc::into_inner(cluster).expect("the last handle");
    tokio::task::spawn_blocking(move || cluster.destroy())
        .await
        .expect("join")
        .expect("destroy");
}
