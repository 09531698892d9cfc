//! Shared set-up: a pool on the test server.

use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::{self, NoTls};

/// The URL of the test server: `LOCKS_DATABASE_URL`, or a throwaway cluster started
/// once for this test process.
pub(crate) fn database_url() -> String {
    throwaway_pg::database_url().unwrap_or_else(|error| {
        panic!("no PostgreSQL for the tests: set LOCKS_DATABASE_URL or install PostgreSQL: {error}")
    })
}

/// A pool of `size` connections on the test server.
pub(crate) fn pool(size: usize) -> Pool {
    locks_postgres::plain_pool(&database_url(), size).expect("pool")
}

/// A plain connection for inspecting the server (`pg_locks`, `pg_terminate_backend`).
pub(crate) async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&database_url(), NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
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
    let bits = u64::from_be_bytes(lock_id.to_be_bytes());
    let high = i64::try_from(bits >> 32).expect("32 bits");
    let low = i64::try_from(bits & 0xFFFF_FFFF).expect("32 bits");
    admin
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2",
            &[&high, &low],
        )
        .await
        .expect("pg_locks")
        .get(0)
}

/// A key no other test uses.
pub(crate) fn unique_key(name: &str) -> String {
    format!("it:{name}:{}", uuid_like())
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
