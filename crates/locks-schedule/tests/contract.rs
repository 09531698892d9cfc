//! The schedule's contract on the in-memory ledger and lock manager, on a manual clock.

use std::sync::atomic::{AtomicU64, Ordering};

use locks_memory::{InMemoryLockManager, InMemoryLockTable};
use locks_schedule::conformance::{self, Harness};
use locks_schedule::{
    Attempt, Claim, ClaimAnswer, Clock, Ledger, LedgerError, ManualClock, MemoryLedger, Outcome,
    RunRecord, Schedule, SlotKind,
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
/// slots pass as fast as the loops sleep through them.
#[derive(Clone)]
struct TimerClock {
    start: tokio::time::Instant,
    at: time::OffsetDateTime,
}

impl TimerClock {
    fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
            // A quarter into a slot, so the hosts' first firings are not on a boundary.
            at: datetime!(2026-12-05 06:00:00.25 UTC),
        }
    }
}

impl Clock for TimerClock {
    fn now(&self) -> time::OffsetDateTime {
        self.at + self.start.elapsed()
    }
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
    let ledger = GrantsEveryClaim(MemoryLedger::new(TimerClock::new()));
    let runs =
        conformance::run_skewed_loops([&hosts[0], &hosts[1], &hosts[2]], &ledger, "granted", 20)
            .await;
    assert!(runs.doubled() > 0, "{runs:?}");
}

/// A ledger whose claims are always granted: the control's.
struct GrantsEveryClaim(MemoryLedger<TimerClock>);

impl Ledger for GrantsEveryClaim {
    async fn now(&self) -> Result<time::OffsetDateTime, LedgerError> {
        self.0.now().await
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimAnswer, LedgerError> {
        Ok(match claim.kind {
            SlotKind::Previous => ClaimAnswer::NothingToDo,
            SlotKind::Current => ClaimAnswer::Claimed {
                attempt: 1,
                previous: None,
                started: self.0.now().await?,
            },
        })
    }

    async fn finish(
        &self,
        _: &Attempt<'_>,
        _: Outcome,
        _: Option<&str>,
    ) -> Result<bool, LedgerError> {
        Ok(true)
    }

    async fn runs(&self, name: Option<&str>, limit: u32) -> Result<Vec<RunRecord>, LedgerError> {
        self.0.runs(name, limit).await
    }

    async fn prune(&self, before: time::OffsetDateTime) -> Result<u64, LedgerError> {
        self.0.prune(before).await
    }
}
