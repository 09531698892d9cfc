//! The schedule's contract on the PostgreSQL ledger and lock manager (two managers: two
//! hosts), on the server's clock.

use std::time::Duration;

use locks_postgres::PostgresLockManager;
use locks_schedule::Schedule;
use locks_schedule::conformance::{self, Harness};
use locks_schedule_postgres::PostgresLedger;

use crate::support::{ledger, manager, next_slot, unique};

struct Postgres {
    hosts: [PostgresLockManager; 2],
    ledger: PostgresLedger,
}

impl Harness for Postgres {
    type Locks = PostgresLockManager;
    type Ledger = PostgresLedger;

    fn locks(&self, host: usize) -> &PostgresLockManager {
        &self.hosts[host]
    }

    fn ledger(&self) -> &PostgresLedger {
        &self.ledger
    }

    fn schedule(&self) -> Schedule {
        "2s".parse().expect("a schedule")
    }

    fn job_name(&self, case: &str) -> String {
        unique(case)
    }

    async fn next_slot(&self) {
        next_slot(&self.ledger, &self.schedule(), Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_ledger_keeps_the_contract() {
    let harness = Postgres {
        hosts: [manager(), manager()],
        ledger: ledger().await,
    };
    conformance::run_all(&harness).await;
}
