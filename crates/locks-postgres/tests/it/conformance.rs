//! The port's contract suite against real PostgreSQL: managers on one pool contend
//! on the server like separate processes.

use locks_port::conformance::{Harness, MAX_CONCURRENT_ACQUISITIONS};
use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Pool;

/// Managers sharing one pool; each has its own bookkeeping.
pub(crate) struct PostgresHarness {
    pool: Pool,
}

impl Harness for PostgresHarness {
    type Manager = PostgresLockManager;

    fn manager(&self) -> PostgresLockManager {
        PostgresLockManager::builder(self.pool.clone())
            .holder_id("conformance")
            .build()
    }
}

fn harness() -> PostgresHarness {
    // Room for every lock a case holds or waits for at once, plus headroom.
    PostgresHarness {
        pool: crate::support::pool(MAX_CONCURRENT_ACQUISITIONS * 2),
    }
}

locks_port::conformance_suite!(harness());
locks_port::acquire_many_suite!(harness());
