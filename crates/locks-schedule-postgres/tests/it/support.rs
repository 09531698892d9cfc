//! What the tests share: pools, the installed ledger, waiting for slot boundaries on the
//! server's clock.

use std::time::Duration;

use deadpool_postgres::Pool;
use locks_postgres::PostgresLockManager;
use locks_schedule::{Ledger, Schedule};
use locks_schedule_postgres::{PostgresLedger, install_ledger};
use tokio::sync::{OnceCell, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) use throwaway_pg::testing::{database_url, unique};

/// The contract's retention check prunes the whole ledger table (every job's rows before
/// a cut-off, but each job's latest), and the tests of this binary run at once: a test
/// that reads back more than its jobs' latest rows holds this shared
/// ([`rows_kept`]), the contract test alone ([`pruning`]), so a prune never deletes rows
/// another test is about to count (one did: the firing loop's ledger read back 1 row
/// of 9).
static LEDGER_ROWS: RwLock<()> = RwLock::const_new(());

/// Held while a test counts on its rows staying in the ledger.
pub(crate) async fn rows_kept() -> RwLockReadGuard<'static, ()> {
    LEDGER_ROWS.read().await
}

/// Held while a test may prune the ledger.
pub(crate) async fn pruning() -> RwLockWriteGuard<'static, ()> {
    LEDGER_ROWS.write().await
}

/// A pool on the test server (or on `url`).
pub(crate) fn pool_on(url: &str, size: usize) -> Pool {
    locks_postgres::plain_pool(url, size).expect("a pool")
}

/// The ledger on the test server, its table installed once per test process.
pub(crate) async fn ledger() -> PostgresLedger {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let url = database_url();
    INSTALLED
        .get_or_init(|| async {
            let client = throwaway_pg::testing::connect(&url).await;
            install_ledger(&client).await.expect("install the ledger");
            install_ledger(&client)
                .await
                .expect("installing twice is harmless");
        })
        .await;
    PostgresLedger::new(pool_on(&url, 4))
}

/// A lock manager on the test server: one "host".
pub(crate) fn manager() -> PostgresLockManager {
    PostgresLockManager::new(pool_on(&database_url(), 4))
}

/// Sleeps until the server's clock is `into` past the start of the next slot.
pub(crate) async fn next_slot(ledger: &impl Ledger, schedule: &Schedule, into: Duration) {
    let now = ledger.now().await.expect("the server's clock");
    let slot = schedule.slot_at(now).expect("a slot");
    let wait = Duration::try_from(slot.next() - now).unwrap_or(Duration::ZERO);
    tokio::time::sleep(wait + into).await;
}
