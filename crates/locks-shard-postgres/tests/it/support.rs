//! What the tests share: pools, the installed term table, managers with holder ids.

use locks_postgres::PostgresLockManager;
use locks_shard_postgres::deadpool_postgres::Pool;
use locks_shard_postgres::{PostgresShardTerms, install_shard_terms};
use tokio::sync::OnceCell;

pub(crate) use throwaway_pg::testing::{admin, database_url, unique};

/// A pool on the test server.
pub(crate) fn pool(size: usize) -> Pool {
    locks_postgres::plain_pool(&database_url(), size).expect("a pool")
}

/// A pool for progress writes: a writer frozen inside its transaction (holding the term
/// row `FOR SHARE`) would hold the next term's begin off until its session ends, so its
/// sessions end an idle transaction after 1 s, as the crate's documentation advises.
pub(crate) fn writes_pool(size: usize) -> Pool {
    let mut config: locks_shard_postgres::tokio_postgres::Config =
        database_url().parse().expect("the test server's URL");
    config.options("-c idle_in_transaction_session_timeout=1000");
    locks_postgres::plain_pool_with_config(config, size).expect("a pool")
}

/// The term store on the test server, its table installed once per test process.
pub(crate) async fn terms() -> PostgresShardTerms {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let client = admin().await;
            install_shard_terms(&client)
                .await
                .expect("install the term table");
            install_shard_terms(&client)
                .await
                .expect("installing twice is harmless");
        })
        .await;
    PostgresShardTerms::new(pool(8))
}

/// A lock manager on the test server with its own pool: one "host".
pub(crate) fn manager(holder_id: &str, size: usize) -> PostgresLockManager {
    PostgresLockManager::builder(pool(size))
        .holder_id(holder_id)
        .build()
}
