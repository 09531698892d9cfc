//! The port's contract suite, against managers sharing one table.

use locks_conformance::Harness;
use locks_memory::{InMemoryLockManager, InMemoryLockTable};

/// Managers on one table; checks when dropped that every case left the table empty.
pub(crate) struct MemoryHarness {
    table: InMemoryLockTable,
}

impl MemoryHarness {
    pub(crate) fn new() -> Self {
        Self {
            table: InMemoryLockTable::new(),
        }
    }
}

impl Harness for MemoryHarness {
    type Manager = InMemoryLockManager;

    fn manager(&self) -> InMemoryLockManager {
        self.table.manager()
    }
}

impl Drop for MemoryHarness {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert!(
                self.table.is_empty(),
                "the case left {} lock table entries behind: {:?}",
                self.table.len(),
                self.table
            );
        }
    }
}

locks_conformance::conformance_suite!(MemoryHarness::new());
locks_conformance::acquire_many_suite!(MemoryHarness::new());
locks_conformance::semaphore_suite!(MemoryHarness::new());

/// The leader board's contract, on two managers of one table.
#[tokio::test]
async fn the_leader_board_keeps_its_contract() {
    let table = locks_memory::InMemoryLockTable::new();
    let (first, second) = (
        table.manager_with_holder_id("first"),
        table.manager_with_holder_id("second"),
    );
    locks_conformance::leader_board_contract(&first, &second, "board").await;
}
