//! A server that takes TLS connections only (`ssl = on`, `hostssl` lines only in
//! `pg_hba.conf`, a certificate from a test CA): a dropped unbounded wait, of a lock
//! and of a permit, leaves the server's lock queue at once, because its cancel request
//! goes with the pool's TLS connector. (A cancel request in plain text is refused by the
//! driver under `sslmode=require`, and the wait would stay queued until granted.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_postgres::prelude::*;
use locks_postgres::tokio_postgres::{self, Client, Config};
use throwaway_pg::ThrowawayPostgres;
use throwaway_pg::testing::TestCa;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How soon a dropped wait must be gone from `pg_locks`.
const LEFT_WITHIN: Duration = Duration::from_millis(200);
const ROUNDS: usize = 20;

struct TlsServer {
    pg: ThrowawayPostgres,
    tls: MakeRustlsConnect,
    /// Its folder is removed on drop, after the server's.
    _ca: TestCa,
}

impl TlsServer {
    fn start() -> Self {
        let ca = TestCa::new("locks-tls");
        // TLS connections only over TCP.
        let pg = ca.server(true);
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(
                ca.ca_der().to_vec(),
            ))
            .expect("CA");
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Self {
            pg,
            tls: MakeRustlsConnect::new(config),
            _ca: ca,
        }
    }

    fn config(&self, sslmode: &str) -> Config {
        format!(
            "host=localhost hostaddr=127.0.0.1 port={} user=postgres dbname=postgres sslmode={sslmode}",
            self.pg.port()
        )
        .parse()
        .expect("config")
    }

    fn manager(&self) -> PostgresLockManager {
        let pool =
            locks_postgres::tls_pool(self.config("require"), self.tls.clone(), 4).expect("pool");
        PostgresLockManager::builder(pool).build()
    }

    async fn admin(&self) -> Client {
        let (client, connection) = self
            .config("require")
            .connect(self.tls.clone())
            .await
            .expect("admin connection over TLS");
        tokio::spawn(connection);
        client
    }
}

/// Sessions still working on a wait: queued for an advisory lock (a lock's wait), or
/// running a statement (a permit's wait runs on the server, looking at the slots between
/// pauses, and holds the queue's turnstile meanwhile).
async fn waiting(admin: &Client) -> i64 {
    admin
        .query_one(
            "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted) \
             + (SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                AND backend_type = 'client backend' AND pid <> pg_backend_pid())",
            &[],
        )
        .await
        .expect("pg_locks and pg_stat_activity")
        .get(0)
}

/// Starts `wait`, waits until the server queues it, drops it, and measures how long its
/// entry stays in `pg_locks`.
async fn dropped_wait_left_after<F>(admin: &Client, wait: F) -> Duration
where
    F: std::future::Future + Send + 'static,
    F::Output: Send,
{
    let task = tokio::spawn(wait);
    let queued_by = Instant::now() + Duration::from_secs(10);
    while waiting(admin).await == 0 {
        assert!(
            Instant::now() < queued_by,
            "the wait never reached the server's queue"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    task.abort();
    let _ = task.await;
    let dropped = Instant::now();
    while waiting(admin).await > 0 {
        if dropped.elapsed() > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    dropped.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_leaves_the_queue_at_once_on_a_tls_only_server() {
    let server = TlsServer::start();
    // Plain text is refused: the server really takes TLS only.
    assert!(
        server
            .config("disable")
            .connect(tokio_postgres::NoTls)
            .await
            .is_err(),
        "a plain-text connection was accepted"
    );
    let admin = server.admin().await;
    let holder = server.manager();
    let waiter = server.manager();

    let mut lock_figures = Vec::new();
    let guard = holder
        .acquire("tls:lock", Duration::from_secs(5))
        .await
        .expect("lock");
    for _ in 0..ROUNDS {
        let waiter = waiter.clone();
        lock_figures.push(
            dropped_wait_left_after(&admin, async move {
                waiter.acquire("tls:lock", AcquireOptions::new()).await
            })
            .await,
        );
    }
    guard.release().await;

    let mut permit_figures = Vec::new();
    let permit = holder
        .acquire_permit("tls:permit", 1, Duration::from_secs(5))
        .await
        .expect("permit");
    for _ in 0..ROUNDS {
        let waiter = waiter.clone();
        permit_figures.push(
            dropped_wait_left_after(&admin, async move {
                waiter
                    .acquire_permit("tls:permit", 1, AcquireOptions::new())
                    .await
            })
            .await,
        );
    }
    permit.release().await;

    eprintln!("dropped lock waits left pg_locks after {lock_figures:?}");
    eprintln!("dropped permit waits left pg_locks after {permit_figures:?}");
    for (what, figures) in [("lock", &lock_figures), ("permit", &permit_figures)] {
        for (round, left) in figures.iter().enumerate() {
            assert!(
                *left <= LEFT_WITHIN,
                "round {round}: a dropped {what} wait stayed in pg_locks for {left:?}"
            );
        }
    }
}
