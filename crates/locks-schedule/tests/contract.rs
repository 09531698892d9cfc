//! The schedule's contract on the in-memory ledger and lock manager, on a manual clock.

use std::sync::atomic::{AtomicU64, Ordering};

use locks_memory::InMemoryLockManager;
use locks_schedule::conformance::{self, Harness};
use locks_schedule::{Clock, ManualClock, MemoryLedger, Schedule};
use time::macros::datetime;

struct Memory {
    locks: InMemoryLockManager,
    clock: ManualClock,
    ledger: MemoryLedger<ManualClock>,
    next: AtomicU64,
}

impl Harness for Memory {
    type Locks = InMemoryLockManager;
    type Ledger = MemoryLedger<ManualClock>;

    fn locks(&self, _host: usize) -> &InMemoryLockManager {
        // One process, one manager: its locks contend with each other like two hosts'.
        &self.locks
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
    let clock = ManualClock::new(datetime!(2026-12-04 06:00:00 UTC));
    let harness = Memory {
        locks: InMemoryLockManager::new(),
        ledger: MemoryLedger::new(clock.clone()),
        clock,
        next: AtomicU64::new(0),
    };
    conformance::run_all(&harness).await;
}
