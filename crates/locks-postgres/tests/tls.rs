//! A server that takes TLS connections only (`ssl = on`, `hostssl` lines only in
//! `pg_hba.conf`, a certificate from a test CA): a dropped unbounded wait, of a lock
//! and of a permit, leaves the server's lock queue at once, because its cancel request
//! goes with the pool's TLS connector. (A cancel request in plain text is refused by the
//! driver under `sslmode=require`, and the wait would stay queued until granted.)
//!
//! A pool built by hand over TLS, without the builder's `.tls(..)`, cannot send that
//! cancel request: the manager says so once, at WARN, naming the remedy. The binary
//! installs a global subscriber to see it (a scoped one can miss events that other
//! threads reached first, tokio-rs/tracing#3611).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use locks_postgres::prelude::*;
use locks_postgres::tokio_postgres::{self, Client, Config};
use throwaway_pg::ThrowawayPostgres;
use throwaway_pg::testing::TestCa;
use tokio_postgres_rustls::MakeRustlsConnect;
use tracing_subscriber::prelude::*;

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

    /// A pool over TLS built by hand (deadpool's own connector), as an application
    /// that already has one would: the manager is not told its TLS connector unless the
    /// builder's `.tls(..)` says it.
    fn hand_built_pool(&self) -> Pool {
        let manager = Manager::from_config(
            self.config("require"),
            self.tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(4)
            .runtime(Runtime::Tokio1)
            .build()
            .expect("pool")
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

/// Waits queued for an advisory lock.
async fn queued(admin: &Client) -> i64 {
    advisory(admin, false).await
}

/// Advisory lock entries on the server, granted or (`false`) queued.
async fn advisory(admin: &Client, granted: bool) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = $1",
            &[&granted],
        )
        .await
        .expect("pg_locks")
        .get(0)
}

/// Waits until the server holds no advisory lock, and says how long that took; fails
/// saying `what` if it still holds one after `bound`.
async fn nothing_held_within(admin: &Client, bound: Duration, what: &str) -> Duration {
    let from = Instant::now();
    while advisory(admin, true).await > 0 {
        assert!(from.elapsed() < bound, "{what} after {bound:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    from.elapsed()
}

/// Starts `wait`, waits until the server works on it, drops it, and measures how long
/// it stays there ([`waiting`]).
async fn dropped_wait_left_after<F>(admin: &Client, wait: F) -> Duration
where
    F: std::future::Future + Send + 'static,
    F::Output: Send,
{
    queue_and_drop(admin, wait, true).await;
    let dropped = Instant::now();
    while waiting(admin).await > 0 {
        if dropped.elapsed() > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    dropped.elapsed()
}

/// Starts `wait`, waits until the server works on it ([`waiting`]; only `queued` for
/// an advisory lock unless `any_wait`), and drops it.
async fn queue_and_drop<F>(admin: &Client, wait: F, any_wait: bool)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send,
{
    let task = tokio::spawn(wait);
    let queued_by = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = if any_wait {
            waiting(admin).await
        } else {
            queued(admin).await
        };
        if seen > 0 {
            break;
        }
        assert!(
            Instant::now() < queued_by,
            "the wait never reached the server's queue"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    task.abort();
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_tls_only_server_a_dropped_wait_leaves_the_queue_and_a_lost_holder_is_told_at_once() {
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
    // A dropped permit wait closes its connection, which frees the marker (and the
    // turnstile, if the cancel came while it held it); the server drops them when that
    // backend has exited, which need not be before the next statement here.
    let freed = nothing_held_within(
        &admin,
        Duration::from_secs(5),
        "the dropped waits' sessions still hold advisory locks",
    )
    .await;
    eprintln!("the dropped waits' sessions held nothing {freed:?} after the permit's release");

    // A tls_pool announces a connection's end as plain_pool does: the manager says how
    // soon its holders are told (a pool built by hand does not), and a holder whose
    // backend is terminated is told at once, not at its next keepalive (10 s).
    assert_eq!(
        holder.loss_notice_bound(),
        Some(locks_postgres::ANNOUNCED_LOSS_NOTICE)
    );
    let hand_built = PostgresLockManager::builder(server.hand_built_pool()).build();
    assert_eq!(hand_built.loss_notice_bound(), None);
    let guard = holder
        .acquire("tls:told", Duration::from_secs(5))
        .await
        .expect("lock");
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&locks_port::lock_id("tls:told")],
        )
        .await
        .expect("the holder's backend")
        .get(0);
    let terminated = Instant::now();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder was told");
    let told = terminated.elapsed();
    eprintln!("a terminated TLS holder was told after {told:?} ({reason:?})");
    assert!(told < Duration::from_secs(1), "told after {told:?}");

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

/// The WARN events of the whole run, as text (message and fields), from the global
/// subscriber installed at the first call.
fn warnings() -> &'static Mutex<Vec<String>> {
    static WARNINGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    WARNINGS.get_or_init(|| {
        tracing_subscriber::registry().with(Warnings).init();
        Mutex::new(Vec::new())
    })
}

struct Warnings;

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            warnings().lock().unwrap().push(fields.0);
        }
    }
}

/// The warnings so far that name the remedy of a cancel that cannot be sent.
fn unsent_cancel_warnings() -> Vec<String> {
    warnings()
        .lock()
        .unwrap()
        .iter()
        .filter(|text| text.contains("locks_postgres::tls_pool") && text.contains(".tls(..)"))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_cannot_be_sent_is_said_once_per_manager() {
    warnings();
    let server = TlsServer::start();
    let admin = server.admin().await;
    let holder = server.manager();
    let guard = holder
        .acquire("tls:unsent", Duration::from_secs(5))
        .await
        .expect("lock");
    let wait = |waiter: PostgresLockManager| async move {
        waiter.acquire("tls:unsent", AcquireOptions::new()).await
    };

    // A pool of tls_pool, and a hand-built one told with .tls(..): the cancel goes with
    // the TLS connector, the wait leaves at once, and nothing is said.
    let told = PostgresLockManager::builder(server.hand_built_pool())
        .tls(server.tls.clone())
        .build();
    for waiter in [server.manager(), told] {
        let left = dropped_wait_left_after(&admin, wait(waiter)).await;
        assert!(left <= LEFT_WITHIN, "a told wait stayed for {left:?}");
    }
    assert_eq!(unsent_cancel_warnings(), Vec::<String>::new());

    // Built by hand, not told: the cancel request cannot be sent, the dropped wait
    // stays queued until the server's connection check finds the socket closed (the
    // lease's client_connection_check_interval), and the manager says so once.
    let untold = PostgresLockManager::new(server.hand_built_pool());
    let check = untold
        .lease()
        .expect("the default lease")
        .server
        .client_connection_check_interval;
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server_version_num")
        .get(0);
    if version < 140_000 {
        // PostgreSQL 13 has no connection check: as documented, the dropped wait stays
        // queued until it is granted, and the lock is freed when the server then finds
        // the connection closed.
        queue_and_drop(&admin, wait(untold.clone()), false).await;
        tokio::time::sleep(check * 2).await;
        assert_eq!(
            queued(&admin).await,
            1,
            "the dropped wait stays queued on 13"
        );
        guard.release().await;
        let freed = nothing_held_within(
            &admin,
            Duration::from_secs(10),
            "the grant to a closed connection was not freed",
        )
        .await;
        eprintln!(
            "PostgreSQL {version}: the dropped wait stayed queued until the holder released, and its grant was freed {freed:?} after"
        );
        let said = unsent_cancel_warnings();
        assert_eq!(said.len(), 1, "said {} times: {said:?}", said.len());
        return;
    }
    let mut figures = Vec::new();
    for _ in 0..2 {
        queue_and_drop(&admin, wait(untold.clone()), false).await;
        let dropped = Instant::now();
        while queued(&admin).await > 0 && dropped.elapsed() < check * 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        figures.push(dropped.elapsed());
    }
    guard.release().await;
    eprintln!(
        "dropped waits of a hand-built TLS pool without .tls(..) stayed queued {figures:?} \
         (client_connection_check_interval {check:?})"
    );
    for left in &figures {
        assert!(
            *left > LEFT_WITHIN,
            "the cancel was sent after all: left after {left:?}"
        );
        assert!(
            *left <= check * 2,
            "the server's connection check did not end the wait: {left:?}"
        );
    }
    let said = unsent_cancel_warnings();
    assert_eq!(said.len(), 1, "said {} times: {said:?}", said.len());
}
