//! The schedule's contract on the in-memory ledger and lock manager, on a manual clock.

use std::sync::atomic::{AtomicU64, Ordering};

use locks_memory::{InMemoryLockManager, InMemoryLockTable};
use locks_schedule::conformance::{self, Harness};
use locks_schedule::{Clock, ManualClock, MemoryLedger, Schedule};
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
