//! What the tests share: pools, the installed term table, managers with holder ids, and
//! clusters of a test's own.

use locks_postgres::PostgresLockManager;
use locks_shard_postgres::deadpool_postgres::Pool;
use locks_shard_postgres::{PostgresShardTerms, install_shard_terms};
use tokio::sync::OnceCell;

use throwaway_pg::ThrowawayPostgres;
pub(crate) use throwaway_pg::testing::{admin, connect, database_url, unique};

/// A pool on the test server.
pub(crate) fn pool(size: usize) -> Pool {
    pool_at(&database_url(), size)
}

/// A pool on the server at `url`.
pub(crate) fn pool_at(url: &str, size: usize) -> Pool {
    locks_postgres::plain_pool(url, size).expect("a pool")
}

/// A pool for progress writes: a writer frozen inside its transaction (holding the term
/// row `FOR SHARE`) would hold the next term's begin off until its session ends, so its
/// sessions end an idle transaction after 1 s, as the crate's documentation advises.
pub(crate) fn writes_pool(size: usize) -> Pool {
    writes_pool_at(&database_url(), size)
}

/// [`writes_pool`] on the server at `url`.
pub(crate) fn writes_pool_at(url: &str, size: usize) -> Pool {
    let mut config: locks_shard_postgres::tokio_postgres::Config =
        url.parse().expect("the server's URL");
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
    manager_at(&database_url(), holder_id, size)
}

/// A lock manager on the server at `url` with its own pool.
pub(crate) fn manager_at(url: &str, holder_id: &str, size: usize) -> PostgresLockManager {
    PostgresLockManager::builder(pool_at(url, size))
        .holder_id(holder_id)
        .build()
}

/// A cluster of one test alone (`what` it is for), for faults the shared server must not
/// see (a restart), with the term tables installed. Dropping it stops the server and
/// removes its folder, also when the test fails; drop it with [`drop_cluster`].
pub(crate) async fn own_cluster(what: &str) -> ThrowawayPostgres {
    let cluster = tokio::task::block_in_place(ThrowawayPostgres::start)
        .unwrap_or_else(|error| panic!("a throwaway PostgreSQL cluster for {what}: {error}"));
    install_shard_terms(&connect(&cluster.url()).await)
        .await
        .expect("install the term table");
    cluster
}

/// Stops `cluster` and removes its folder, off the runtime's worker.
pub(crate) fn drop_cluster(cluster: ThrowawayPostgres) {
    tokio::task::block_in_place(|| drop(cluster));
}
