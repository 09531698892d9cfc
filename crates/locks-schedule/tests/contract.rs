//! The schedule's contract on the in-memory ledger and lock manager, on a manual clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_memory::{InMemoryLockManager, InMemoryLockTable};
use locks_schedule::conformance::{self, Harness};
use locks_schedule::{
    Attempt, Claim, ClaimAnswer, Clock, JobContext, Ledger, LedgerError, ManualClock, MemoryLedger,
    Outcome, RunRecord, Schedule, ScheduledJob, SlotKind,
};
use time::macros::datetime;

struct Memory {
    hosts: [InMemoryLockManager; 2],
    clock: ManualClock,
    ledger: MemoryLedger<ManualClock>,
    next: AtomicU64,
}

impl Harness for Memory {
    type Locks = InMemoryLockManager;
    type Ledger = MemoryLedger<ManualClock>;

    fn locks(&self, host: usize) -> &InMemoryLockManager {
        &self.hosts[host]
    }

    fn ledger(&self) -> &Self::Ledger {
        &self.ledger
    }

    fn schedule(&self) -> Schedule {
        "every 1m at :00:30".parse().expect("a schedule")
    }

    fn job_name(&self, case: &str) -> String {
        format!("{case}-{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    async fn next_slot(&self) {
        let slot = self.schedule().slot_at(self.clock.now()).expect("a slot");
        self.clock
            .set(slot.next() + time::Duration::milliseconds(5));
    }
}

#[tokio::test]
async fn the_memory_ledger_keeps_the_contract() {
    let table = InMemoryLockTable::new();
    let clock = ManualClock::new(datetime!(2026-12-04 06:00:00 UTC));
    let harness = Memory {
        // Two managers on one table contend like two hosts on one database.
        hosts: [
            table.manager_with_holder_id("host-0"),
            table.manager_with_holder_id("host-1"),
        ],
        ledger: MemoryLedger::new(clock.clone()),
        clock,
        next: AtomicU64::new(0),
    };
    conformance::run_all(&harness).await;
}

/// The in-memory ledger's clock on tokio's timer: paused in the loop tests, so the
/// slots pass as fast as the loops sleep through them. It can be moved ahead of the
/// timer, as a server's clock runs ahead of a host whose timer is slow.
#[derive(Clone)]
struct TimerClock {
    start: tokio::time::Instant,
    at: time::OffsetDateTime,
    ahead_ms: Arc<AtomicU64>,
}

impl TimerClock {
    fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            // A quarter into a slot, so the hosts' first firings are not on a boundary.
            at: datetime!(2026-12-05 06:00:00.25 UTC),
            ahead_ms: Arc::default(),
        }
    }

    fn jump(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).expect("a short jump");
        self.ahead_ms.fetch_add(by, Ordering::Relaxed);
    }
}

impl Clock for TimerClock {
    fn now(&self) -> time::OffsetDateTime {
        self.at
            + self.start.elapsed()
            + Duration::from_millis(self.ahead_ms.load(Ordering::Relaxed))
    }
}

/// A long wait follows the ledger's clock, not this host's timer: with the ledger's
/// clock 9 minutes ahead of the timer mid-wait, a 10-minute schedule fires within a nap
/// (`MAX_NAP`, 60 s) of the ledger's boundary, not when the timer would have reached it.
#[tokio::test(start_paused = true)]
async fn a_long_wait_follows_the_ledgers_clock() {
    let clock = TimerClock::new();
    let ledger = MemoryLedger::new(clock.clone());
    let locks = InMemoryLockTable::new().manager_with_holder_id("host");
    let job = ScheduledJob::new("ten-minutes", "every 10m".parse().expect("a schedule"));
    let runs: Mutex<Vec<tokio::time::Instant>> = Mutex::default();
    let firing_loop = job.run_every_slot(&locks, &ledger, |_: JobContext| {
        runs.lock().expect("runs").push(tokio::time::Instant::now());
        async { Ok::<(), String>(()) }
    });
    let start = tokio::time::Instant::now();
    let jump = async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        clock.jump(Duration::from_secs(9 * 60));
        std::future::pending::<()>().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::join!(firing_loop, jump)
    })
    .await;
    let runs: Vec<Duration> = runs
        .into_inner()
        .expect("runs")
        .iter()
        .map(|at| *at - start)
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0], Duration::ZERO, "the loop fires at once");
    assert!(
        runs[1] <= locks_schedule::MAX_NAP + Duration::from_secs(1),
        "the second firing came {:?} after the start, not within a nap of the ledger's \
         boundary (at 30 s on the timer)",
        runs[1]
    );
}

/// The firing loop on three hosts up to 2.9 s off: each slot of 40 runs once, nothing
/// runs once the loops are dropped.
#[tokio::test(start_paused = true)]
async fn the_firing_loop_runs_each_slot_once_across_skewed_hosts() {
    let table = InMemoryLockTable::new();
    let hosts = [0, 1, 2].map(|host| table.manager_with_holder_id(format!("host-{host}")));
    let ledger = MemoryLedger::new(TimerClock::new());
    conformance::every_slot_runs_each_slot_once(
        [&hosts[0], &hosts[1], &hosts[2]],
        &ledger,
        "looping",
        40,
    )
    .await;
}

/// Control: the same loops on a ledger that grants every claim (no record of what ran)
/// run slots more than once, so the check above can fail.
#[tokio::test(start_paused = true)]
async fn control_a_ledger_that_grants_every_claim_runs_slots_twice() {
    let table = InMemoryLockTable::new();
    let hosts = [0, 1, 2].map(|host| table.manager_with_holder_id(format!("host-{host}")));
    // Every current slot granted, nothing recorded.
    let ledger = Intercepted {
        ledger: MemoryLedger::new(TimerClock::new()),
        intercept: Box::new(|claim| {
            Some(Ok(match claim.kind {
                SlotKind::Previous => ClaimAnswer::NothingToDo,
                SlotKind::Current => ClaimAnswer::Claimed {
                    attempt: 1,
                    previous: None,
                    started: claim.slot.start(),
                },
            }))
        }),
    };
    let runs =
        conformance::run_skewed_loops([&hosts[0], &hosts[1], &hosts[2]], &ledger, "granted", 20)
            .await;
    assert!(runs.doubled() > 0, "{runs:?}");
}

/// A job that runs past the next boundary is followed by a firing at once, late, in the
/// slot the ledger's clock is in; the slot it ran through is settled by the missed-slot
/// policy (`Skip`: recorded as missed), never run in a burst.
#[tokio::test(start_paused = true)]
async fn a_slow_job_is_followed_at_once_and_the_slot_it_ran_through_is_missed() {
    let ledger = MemoryLedger::new(TimerClock::new());
    let locks = InMemoryLockTable::new().manager_with_holder_id("host");
    let job = ScheduledJob::new("slow", "1s".parse().expect("a schedule"));
    let runs: Mutex<Vec<(time::OffsetDateTime, Duration, bool)>> = Mutex::default();
    let firing_loop = job.run_every_slot(&locks, &ledger, |context: JobContext| {
        let first = runs.lock().expect("runs").is_empty();
        runs.lock()
            .expect("runs")
            .push((context.slot.start(), context.lateness, context.catch_up));
        async move {
            if first {
                tokio::time::sleep(Duration::from_millis(2_500)).await;
            }
            Ok::<(), String>(())
        }
    });
    let _ = tokio::time::timeout(Duration::from_millis(3_500), firing_loop).await;
    let second = |s: u8| datetime!(2026-12-05 06:00:00 UTC) + Duration::from_secs(s.into());
    assert_eq!(
        runs.into_inner().expect("runs"),
        [
            (second(0), Duration::from_millis(250), false),
            // Right after the first run returned (at 06:00:02.75), 750 ms into its slot.
            (second(2), Duration::from_millis(750), false),
            (second(3), Duration::ZERO, false),
        ]
    );
    let rows = ledger.runs(Some("slow"), 10).await.expect("runs");
    let outcomes: Vec<(time::OffsetDateTime, Outcome)> = rows
        .iter()
        .rev()
        .map(|row| (row.slot, row.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            (second(0), Outcome::Succeeded),
            (second(1), Outcome::Missed),
            (second(2), Outcome::Succeeded),
            (second(3), Outcome::Succeeded),
        ]
    );
}

/// A firing that fails is retried at the next boundary (the loop goes on); an error no
/// later firing can fix (a schedule with no slot) ends the loop with it.
#[tokio::test(start_paused = true)]
async fn a_failed_firing_is_retried_and_a_schedule_without_slots_ends_the_loop() {
    let locks = InMemoryLockTable::new().manager_with_holder_id("host");
    // The first claim fails, as with a server briefly away.
    let failed = AtomicU64::new(0);
    let ledger = Intercepted {
        ledger: MemoryLedger::new(TimerClock::new()),
        intercept: Box::new(|_| {
            (failed.fetch_add(1, Ordering::Relaxed) == 0)
                .then(|| Err(LedgerError::new("the server is away", None)))
        }),
    };
    let job = ScheduledJob::new("flaky", "1s".parse().expect("a schedule"));
    let runs: Mutex<Vec<time::OffsetDateTime>> = Mutex::default();
    let firing_loop = job.run_every_slot(&locks, &ledger, |context: JobContext| {
        runs.lock().expect("runs").push(context.slot.start());
        async { Ok::<(), String>(()) }
    });
    let ended = tokio::time::timeout(Duration::from_millis(2_500), firing_loop).await;
    assert!(ended.is_err(), "the loop goes on after a failed firing");
    assert!(
        failed.load(Ordering::Relaxed) > 1,
        "claims after the failed one"
    );
    assert_eq!(
        runs.into_inner().expect("runs"),
        [
            datetime!(2026-12-05 06:00:01 UTC),
            datetime!(2026-12-05 06:00:02 UTC)
        ],
        "the failed slot is not run again in a hurry; the next boundaries are"
    );

    let never = ScheduledJob::new("never", Schedule::cron("0 0 30 2 *").expect("a cron"));
    let ledger = MemoryLedger::new(TimerClock::new());
    let ended = tokio::time::timeout(
        Duration::from_secs(5),
        never.run_every_slot(&locks, &ledger, |_: JobContext| async {
            Ok::<(), String>(())
        }),
    )
    .await
    .expect("the loop ends at once");
    let Err(error @ locks_schedule::RunError::Schedule(_)) = ended else {
        panic!("{ended:?}");
    };
    assert!(
        error
            .to_string()
            .starts_with("invalid schedule \"0 0 30 2 *\""),
        "{error}"
    );
}

/// What a misbehaving ledger answers a claim instead of the ledger (`None`: the ledger
/// answers).
type Intercept<'a> =
    Box<dyn Fn(&Claim<'_>) -> Option<Result<ClaimAnswer, LedgerError>> + Send + Sync + 'a>;

/// The in-memory ledger with its claims intercepted: the tests' misbehaving ledgers.
struct Intercepted<'a> {
    ledger: MemoryLedger<TimerClock>,
    intercept: Intercept<'a>,
}

impl Ledger for Intercepted<'_> {
    async fn now(&self) -> Result<time::OffsetDateTime, LedgerError> {
        self.ledger.now().await
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimAnswer, LedgerError> {
        match (self.intercept)(claim) {
            Some(answer) => answer,
            None => self.ledger.claim(claim).await,
        }
    }

    async fn finish(
        &self,
        attempt: &Attempt<'_>,
        outcome: Outcome,
        detail: Option<&str>,
    ) -> Result<bool, LedgerError> {
        self.ledger.finish(attempt, outcome, detail).await
    }

    async fn running_before(
        &self,
        name: &str,
        before: time::OffsetDateTime,
    ) -> Result<Vec<time::OffsetDateTime>, LedgerError> {
        self.ledger.running_before(name, before).await
    }

    async fn abandon_stale(
        &self,
        name: &str,
        slots: &[time::OffsetDateTime],
    ) -> Result<Vec<time::OffsetDateTime>, LedgerError> {
        self.ledger.abandon_stale(name, slots).await
    }

    async fn runs(&self, name: Option<&str>, limit: u32) -> Result<Vec<RunRecord>, LedgerError> {
        self.ledger.runs(name, limit).await
    }

    async fn prune(&self, before: time::OffsetDateTime) -> Result<u64, LedgerError> {
        self.ledger.prune(before).await
    }
}

/// Under `Overlap::Allow` a run holds its slot's own lock, `schedule:{name}@{start}`,
/// whose key is the slot's start alone. A run that died under an earlier schedule (a
/// deploy that changed the schedule and killed the runner) left a `running` row at a
/// start the new schedule does not have; its key is the same, so a later firing can take
/// it and mark the row abandoned, as it does for a start of the current schedule.
#[tokio::test]
async fn under_allow_a_dead_run_of_an_earlier_schedule_is_abandoned() {
    let table = InMemoryLockTable::new();
    let (host_0, host_1) = (
        table.manager_with_holder_id("host-0"),
        table.manager_with_holder_id("host-1"),
    );
    let clock = ManualClock::new(datetime!(2026-12-04 06:01:10 UTC));
    let ledger = MemoryLedger::new(clock.clone());
    let every_minute: Schedule = "every 1m".parse().expect("a schedule");
    let old = ScheduledJob::new("changed", every_minute)
        .overlap(locks_schedule::Overlap::Allow)
        .holder("old");
    // The old runner claims 06:01:00 and dies mid-job (its firing is dropped).
    let (started, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started = Mutex::new(Some(started));
    let firing = async {
        old.run_once_per_slot(&host_0, &ledger, |_: JobContext| {
            if let Some(started) = started.lock().expect("started").take() {
                let _ = started.send(());
            }
            std::future::pending::<Result<(), String>>()
        })
        .await
    };
    tokio::select! {
        report = firing => panic!("the job never returns: {report:?}"),
        _ = started_rx => {}
    }
    let dead = datetime!(2026-12-04 06:01:00 UTC);
    let rows = ledger.runs(Some("changed"), 10).await.expect("rows");
    assert_eq!((rows[0].slot, rows[0].outcome), (dead, Outcome::Running));
    // The new schedule's slots start at :30; the dead run's start is none of them.
    let new = ScheduledJob::new("changed", "every 1m at :00:30".parse().expect("a schedule"))
        .overlap(locks_schedule::Overlap::Allow)
        .holder("new");
    clock.set(datetime!(2026-12-04 06:05:40 UTC));
    let dead_key = new.lock_key(Some(
        &locks_schedule::Slot::new(dead, datetime!(2026-12-04 06:02:00 UTC)).expect("a slot"),
    ));
    assert_eq!(dead_key, "schedule:changed@2026-12-04T06:01:00.000000Z");
    // Its slot's lock held stands for its run still going: the row is left.
    let held = locks_port::DistributedLock::try_acquire(&host_0, &dead_key)
        .await
        .expect("the lock manager")
        .expect("the dead run's lock is free");
    let report = new
        .run_once_per_slot(&host_1, &ledger, |_: JobContext| async {
            Ok::<(), String>(())
        })
        .await
        .expect("a firing");
    assert!(report.abandoned_earlier.is_empty(), "{report:?}");
    locks_port::LockGuard::release(held).await;
    let report = new
        .run_once_per_slot(&host_1, &ledger, |_: JobContext| async {
            Ok::<(), String>(())
        })
        .await
        .expect("a firing");
    assert_eq!(report.abandoned_earlier, [dead], "{report:?}");
    let rows = ledger.runs(Some("changed"), 10).await.expect("rows");
    let row = rows
        .iter()
        .find(|row| row.slot == dead)
        .expect("the dead row");
    assert_eq!(row.outcome, Outcome::Abandoned, "{row:?}");
}

/// Under `Overlap::Wait` a firing may wait past slot boundaries for the job's lock; it
/// then claims the slot the ledger's clock is in, and the slot before that one is the one
/// the missed-slot policy settles. Here a firing begins in S1 (S0 ran), waits into S2:
/// S1 had no run, so under `MissedSlots::RunLatest` it is the latest missed slot and runs
/// once, before S2. Reading "the slot before" from the clock before the wait settled S0
/// (done already) and left S1 with no row at all: neither run nor recorded as missed,
/// and no later firing looks at it (its previous slot is S2, which ran).
#[tokio::test]
async fn a_firing_that_waited_past_a_boundary_settles_the_slot_before_the_one_it_claims() {
    let table = InMemoryLockTable::new();
    let (host_0, host_1) = (
        table.manager_with_holder_id("host-0"),
        table.manager_with_holder_id("host-1"),
    );
    let s0 = datetime!(2026-12-04 06:00:00 UTC);
    let (s1, s2) = (
        datetime!(2026-12-04 06:01:00 UTC),
        datetime!(2026-12-04 06:02:00 UTC),
    );
    let clock = ManualClock::new(s0 + time::Duration::seconds(1));
    let ledger = MemoryLedger::new(clock.clone());
    let job = ScheduledJob::new("waits", "every 1m".parse().expect("a schedule"))
        .overlap(locks_schedule::Overlap::Wait(Duration::from_secs(3600)))
        .missed(locks_schedule::MissedSlots::RunLatest);
    let ran = Mutex::new(Vec::new());
    let run = |context: JobContext| {
        ran.lock().expect("ran").push(context.slot.start());
        async { Ok::<(), String>(()) }
    };
    let first = job.run_once_per_slot(&host_0, &ledger, run).await;
    assert!(first.expect("a firing").verdict.ran());
    // Something holds the job's lock (a long run of another host's) from S1 into S2.
    let held = locks_port::DistributedLock::try_acquire(&host_0, &job.lock_key(None))
        .await
        .expect("the lock manager")
        .expect("the job's lock is free");
    clock.set(s1 + time::Duration::seconds(1));
    let firing = job.run_once_per_slot(&host_1, &ledger, run);
    let mut firing = std::pin::pin!(firing);
    tokio::select! {
        biased;
        report = &mut firing => panic!("the lock is held: {report:?}"),
        () = std::future::ready(()) => {}
    }
    clock.set(s2 + time::Duration::seconds(30));
    locks_port::LockGuard::release(held).await;
    let report = firing.await.expect("a firing");
    assert_eq!(report.slot.start(), s2, "{report:?}");
    assert!(report.verdict.ran(), "{report:?}");
    let Some((previous, verdict)) = report.previous.clone() else {
        panic!("S1 was not settled: {report:?}");
    };
    assert_eq!(previous.start(), s1, "{report:?}");
    assert!(verdict.ran(), "{report:?}");
    assert_eq!(*ran.lock().expect("ran"), [s0, s1, s2]);
}

/// A catch-up run (the latest missed slot, `MissedSlots::RunLatest`) that lasts past the
/// end of the slot the firing is in: the firing then claims the slot the clock has moved
/// to, and the slot it was fired in, now the one before, is settled too (here: it is
/// the latest missed slot, so it runs). Before, that slot was left with no row: no later
/// firing looks at it (their slot before is the one this firing ran).
#[tokio::test]
async fn a_catch_up_that_outlasts_its_slot_leaves_no_slot_unsettled() {
    let table = InMemoryLockTable::new();
    let host = table.manager_with_holder_id("host-0");
    let at = |minute: i64| datetime!(2026-12-04 06:00:00 UTC) + time::Duration::minutes(minute);
    let clock = ManualClock::new(at(0) + time::Duration::seconds(1));
    let ledger = MemoryLedger::new(clock.clone());
    let job = ScheduledJob::new("slow-catch-up", "every 1m".parse().expect("a schedule"))
        .missed(locks_schedule::MissedSlots::RunLatest);
    let ran = Mutex::new(Vec::new());
    let run = |context: JobContext| {
        ran.lock().expect("ran").push(context.slot.start());
        // The catch-up of minute 1 lasts into minute 3.
        if context.catch_up && context.slot.start() == at(1) {
            clock.set(at(3) + time::Duration::seconds(10));
        }
        async { Ok::<(), String>(()) }
    };
    job.run_once_per_slot(&host, &ledger, run)
        .await
        .expect("a firing");
    // Nobody fires in minute 1; a firing in minute 2 catches minute 1 up.
    clock.set(at(2) + time::Duration::seconds(1));
    let report = job
        .run_once_per_slot(&host, &ledger, run)
        .await
        .expect("a firing");
    assert_eq!(report.slot.start(), at(3), "{report:?}");
    let rows = ledger.runs(Some("slow-catch-up"), 10).await.expect("rows");
    let slots: Vec<_> = rows.iter().map(|row| (row.slot, row.outcome)).collect();
    assert!(
        slots.iter().any(|(slot, _)| *slot == at(2)),
        "minute 2, fired in, has no row: {slots:?}"
    );
    assert_eq!(*ran.lock().expect("ran"), [at(0), at(1), at(2), at(3)]);
}
