//! The schedule's contract on the PostgreSQL ledger and lock manager (two managers: two
//! hosts), on the server's clock.

use std::time::Duration;

use locks_postgres::PostgresLockManager;
use locks_schedule::Schedule;
use locks_schedule::conformance::{self, Harness};
use locks_schedule_postgres::PostgresLedger;

use crate::support::{ledger, manager, next_slot, pruning, unique};

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
    // Its retention check prunes every job's older rows.
    let _alone = pruning().await;
    let harness = Postgres {
        hosts: [manager(), manager()],
        ledger: ledger().await,
    };
    conformance::run_all(&harness).await;
}

/// The ledger installs from a pooled client as the leader board does (`&client`), and
/// the old `&**client` form still compiles and runs; both are idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_ledger_takes_a_pooled_client_as_the_board_does() {
    let _installed = ledger().await;
    let pool = crate::support::pool_on(&crate::support::database_url(), 1);
    let client = pool.get().await.expect("a connection");
    locks_schedule_postgres::install_ledger(&client)
        .await
        .expect("install with &client");
    locks_postgres::install_leader_board(&client)
        .await
        .expect("the board's install, the same form");
    // What the earlier example wrote; clippy calls it needless, so it is only kept working.
    #[allow(clippy::explicit_auto_deref)]
    locks_schedule_postgres::install_ledger(&**client)
        .await
        .expect("the old form still works");
    let table: Option<String> = client
        .query_one("SELECT to_regclass('scheduled_job_runs')::text", &[])
        .await
        .expect("the catalog")
        .get(0);
    assert_eq!(table.as_deref(), Some("scheduled_job_runs"));
}
