//! The port's contract suite against real PostgreSQL: managers on one pool contend
//! on the server like separate processes.

use locks_conformance::{Harness, MAX_CONCURRENT_ACQUISITIONS};
use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Pool;

/// Managers sharing one pool; each has its own bookkeeping.
pub(crate) struct PostgresHarness {
    pool: Pool,
    /// The managers' [`multiplex`](locks_postgres::PostgresLockManagerBuilder::multiplex)
    /// setting (1: one connection per lock).
    locks_per_connection: usize,
}

impl Harness for PostgresHarness {
    type Manager = PostgresLockManager;

    fn manager(&self) -> PostgresLockManager {
        PostgresLockManager::builder(self.pool.clone())
            .holder_id("conformance")
            .multiplex(self.locks_per_connection)
            .build()
    }
}

fn harness(locks_per_connection: usize) -> PostgresHarness {
    // Room for every lock a case holds or waits for at once, plus headroom.
    PostgresHarness {
        pool: crate::support::pool(MAX_CONCURRENT_ACQUISITIONS * 2),
        locks_per_connection,
    }
}

locks_conformance::conformance_suite!(harness(1));
locks_conformance::acquire_many_suite!(harness(1));
locks_conformance::semaphore_suite!(harness(1));

/// The same contract with locks sharing connections (up to 4 on each).
mod multiplexed {
    locks_conformance::conformance_suite!(super::harness(4));
    locks_conformance::acquire_many_suite!(super::harness(4));
    locks_conformance::semaphore_suite!(super::harness(4));
}
