//! The firing loop on the PostgreSQL ledger: three hosts up to 2.9 s off loop on 1 s
//! slots of the server's clock; each host fires once per slot, each slot runs once, and
//! nothing runs once the loops are dropped.

use locks_schedule::conformance;

use crate::support::{ledger, manager, rows_kept, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_firing_loop_runs_each_slot_once_across_skewed_hosts() {
    let _rows = rows_kept().await;
    let ledger = ledger().await;
    let hosts = [manager(), manager(), manager()];
    conformance::every_slot_runs_each_slot_once(
        [&hosts[0], &hosts[1], &hosts[2]],
        &ledger,
        &unique("looping"),
        8,
    )
    .await;
}
