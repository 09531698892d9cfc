//! What the workspace's test suites share (feature `testing`): the test server's URL, an
//! admin connection, names no other test uses, the advisory locks `pg_locks` shows,
//! child processes of a test binary ([`child`]), a server and children across a
//! network pair that can be cut ([`near`]), and a test CA with a TLS server
//! ([`TestCa`]).
//!
//! Everything here panics instead of returning errors: it is for tests.

pub mod child;
pub mod near;
mod tls;

pub use tls::TestCa;

use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::{Client, NoTls};

/// The URL of the test server: `$LOCKS_DATABASE_URL`, or a throwaway cluster started once
/// for this test process ([`crate::database_url`]); panics saying what to install.
#[must_use]
pub fn database_url() -> String {
    crate::database_url().unwrap_or_else(|error| {
        panic!("no PostgreSQL for the tests: set LOCKS_DATABASE_URL or install PostgreSQL: {error}")
    })
}

/// A plain connection to `url`, its connection driven by a spawned task (call it inside a
/// Tokio runtime).
pub async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
}

/// A throwaway cluster of its own with a lock table sized by `max_locks_per_transaction`
/// and `max_connections` (it holds their product), started off the runtime's threads (call
/// it inside a Tokio runtime); `why` names it in the panic if it cannot start.
pub async fn cluster_with_lock_table(
    max_locks_per_transaction: u64,
    max_connections: u64,
    why: &'static str,
) -> crate::ThrowawayPostgres {
    tokio::task::spawn_blocking(move || {
        crate::ThrowawayPostgres::builder()
            .setting(
                "max_locks_per_transaction",
                max_locks_per_transaction.to_string(),
            )
            .setting("max_connections", max_connections.to_string())
            .start()
            .unwrap_or_else(|error| panic!("start {why}: {error}"))
    })
    .await
    .expect("the start-up thread")
}

/// A plain connection to the test server, for inspecting it (`pg_locks`,
/// `pg_terminate_backend`).
pub async fn admin() -> Client {
    connect(&database_url()).await
}

/// A database of its own on the test server, named [`unique`]`(name)`, for a test that
/// needs the tables a library creates to be absent, or in an older shape: its URL (the
/// test server's, in the same form, with this database) and its name, for
/// [`drop_database`] when the test is done.
pub async fn own_database(name: &str) -> (String, String) {
    let database = unique(name);
    (admin().await)
        .batch_execute(&format!("CREATE DATABASE \"{database}\""))
        .await
        .expect("a database of its own");
    let url = database_url();
    let url = match url.rsplit_once('/') {
        Some((base, _)) if url.contains("://") => format!("{base}/{database}"),
        // key=value settings: a later setting wins.
        _ => format!("{url} dbname={database}"),
    };
    (url, database)
}

/// Drops a database [`own_database`] made, ending the sessions still on it.
pub async fn drop_database(database: &str) {
    (admin().await)
        .batch_execute(&format!("DROP DATABASE \"{database}\" WITH (FORCE)"))
        .await
        .expect("drop the database");
}

/// `name` made unique to this call: `{name}_{pid}_{nanos}_{n}`, with the nanoseconds of
/// the current second and a counter of this process. A valid SQL identifier when `name`
/// is one (at most 38 characters more than `name`), so it also names tables and databases.
#[must_use]
pub fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    format!(
        "{name}_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A session's row of one advisory lock in `pg_locks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvisoryLock {
    /// The backend holding or waiting for it.
    pub pid: i32,
    /// Held (`true`) or waited for (`false`).
    pub granted: bool,
    /// `ExclusiveLock` or `ShareLock`.
    pub mode: String,
    /// In the database the client is connected to.
    pub here: bool,
}

/// Every session's row of the advisory lock `lock_id` (a bigint lock,
/// `pg_advisory_lock(bigint)`), in any database: holders first, then by pid.
pub async fn advisory_lock(client: &Client, lock_id: i64) -> Vec<AdvisoryLock> {
    let bits = u64::from_be_bytes(lock_id.to_be_bytes());
    let high = i64::try_from(bits >> 32).expect("32 bits");
    let low = i64::try_from(bits & 0xFFFF_FFFF).expect("32 bits");
    client
        .query(
            "SELECT pid, granted, mode, \
             database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND classid::bigint = $1 AND objid::bigint = $2 ORDER BY granted DESC, pid",
            &[&high, &low],
        )
        .await
        .expect("pg_locks")
        .iter()
        .map(|row| AdvisoryLock {
            pid: row.get(0),
            granted: row.get(1),
            mode: row.get(2),
            here: row.get(3),
        })
        .collect()
}

/// How many sessions hold (`granted`) or wait for (`!granted`) the advisory lock
/// `lock_id`.
pub async fn advisory_count(client: &Client, lock_id: i64, granted: bool) -> i64 {
    let rows = advisory_lock(client, lock_id).await;
    let count = rows.iter().filter(|row| row.granted == granted).count();
    i64::try_from(count).expect("a count")
}

/// How many advisory locks of any kind are granted on the server.
pub async fn granted_advisory_locks(client: &Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
            &[],
        )
        .await
        .expect("pg_locks")
        .get(0)
}
