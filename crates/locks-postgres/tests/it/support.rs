//! Shared set-up: a pool on the test server; the rest comes from `throwaway_pg::testing`.

use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres;
pub(crate) use throwaway_pg::testing::{admin, database_url};

/// A pool of `size` connections on the test server.
pub(crate) fn pool(size: usize) -> Pool {
    locks_postgres::plain_pool(&database_url(), size).expect("pool")
}

/// The server's `server_version_num` (`130023` for 13.23): tests of features that differ
/// by version branch on it and assert each side.
pub(crate) async fn server_version_num(admin: &tokio_postgres::Client) -> i32 {
    let text: String = admin
        .query_one("SHOW server_version_num", &[])
        .await
        .expect("SHOW server_version_num")
        .get(0);
    text.parse().expect("server_version_num is a number")
}

/// How many sessions hold (granted) the advisory lock `lock_id`.
pub(crate) async fn holders(admin: &tokio_postgres::Client, lock_id: i64) -> i64 {
    throwaway_pg::testing::advisory_count(admin, lock_id, true).await
}

/// A key no other test uses.
pub(crate) fn unique_key(name: &str) -> String {
    format!("it:{}", throwaway_pg::testing::unique(name))
}
