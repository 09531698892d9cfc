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

    /// The sessions holding or queued on the semaphore's turnstile `(class, -1)`: a
    /// waiter enters (takes the marker, and `permit_holders` counts it) one statement
    /// before it joins this queue, the server's, which serves it in order.
    async fn queued_permit_waiters(&self, name: &str) -> Option<usize> {
        let class = self.manager().semaphore_class(name);
        let client = self.pool.get().await.expect("a pooled connection");
        let row = client
            .query_one(
                "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' \
                 AND objsubid = 2 AND classid = $1::int4::oid AND objid = (-1)::int4::oid",
                &[&class],
            )
            .await
            .expect("pg_locks");
        Some(usize::try_from(row.get::<_, i64>(0)).expect("a count"))
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
