//! An append whose `COMMIT` answer is lost: a proxy on 127.0.0.1 forwards the client's
//! `COMMIT` to the server and then closes both connections. The write is reported as
//! uncertain, and a retry with the same events leaves them in the store exactly once.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use migration_cutover::uuid::Uuid;
use migration_cutover::{
    Event, EventStore, MigrationPorts, RoutingRepository, StoreError, Stores, TenantRoute,
    WriteError,
};
use migration_cutover_postgres::tokio_postgres;
use migration_cutover_postgres::{
    PostgresEventStore, PostgresMigrationRepository, PostgresRoutingRepository, PostgresWritePause,
    PostgresWriteRouter,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};

use crate::fleet::all_events;
use crate::support::{Fleet, SOURCE, TARGET, database_url, pool, table, test_config};

/// A PostgreSQL proxy that, while armed, cuts the connection right after forwarding a
/// simple-protocol `COMMIT` (the server gets it; its answer never reaches the client).
struct CommitCutter {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl CommitCutter {
    async fn start(upstream: (String, u16)) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (task_armed, task_cuts) = (armed.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect((upstream.0.as_str(), upstream.1))
                    .await
                    .expect("connect to the server");
                tokio::spawn(relay(client, server, task_armed.clone(), task_cuts.clone()));
            }
        });
        Self { port, armed, cuts }
    }

    /// Cuts the next connection that sends a `COMMIT`, once.
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// Reads one frontend message: the type byte (none for the start-up messages) and the
/// whole message as it goes on the wire.
async fn message(client: &mut OwnedReadHalf, typed: bool) -> Option<(u8, Vec<u8>)> {
    let mut wire = Vec::new();
    let kind = if typed {
        let kind = client.read_u8().await.ok()?;
        wire.push(kind);
        kind
    } else {
        0
    };
    let length = client.read_u32().await.ok()?;
    wire.extend_from_slice(&length.to_be_bytes());
    let mut body = vec![0; usize::try_from(length).ok()?.checked_sub(4)?];
    client.read_exact(&mut body).await.ok()?;
    wire.extend_from_slice(&body);
    Some((kind, wire))
}

/// SSLRequest and GSSENCRequest: answered by one byte, then the start-up message follows.
const ENCRYPTION_REQUESTS: [u32; 2] = [80_877_103, 80_877_104];

async fn relay(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    // The server's answers go back untouched.
    let answers = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    let mut typed = false;
    while let Some((kind, wire)) = message(&mut from_client, typed).await {
        let commit = typed
            && kind == b'Q'
            && String::from_utf8_lossy(&wire[5..])
                .to_ascii_uppercase()
                .contains("COMMIT");
        if commit && armed.swap(false, Ordering::SeqCst) {
            // Stop relaying answers, then let the COMMIT through: the server commits,
            // and its answer never reaches the client.
            cuts.fetch_add(1, Ordering::SeqCst);
            answers.abort();
            let _ = answers.await;
            let _ = to_server.write_all(&wire).await;
            let _ = to_server.flush().await;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            return;
        }
        if to_server.write_all(&wire).await.is_err() {
            break;
        }
        if !typed {
            let code = wire.get(4..8).map_or(0, |code| {
                u32::from_be_bytes([code[0], code[1], code[2], code[3]])
            });
            typed = !ENCRYPTION_REQUESTS.contains(&code);
        }
    }
    answers.abort();
}

/// Waits (up to a second) for the server to have committed the cut `COMMIT`: the event
/// is there once, so a retry that stored it again would be seen.
async fn committed_anyway(store: &PostgresEventStore, tenant: Uuid, id: Uuid) {
    for _ in 0..100 {
        if copies(store, tenant, id).await == 1 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the server did not commit the cut COMMIT");
}

/// How many times `id` is in the tenant's stream in `store`.
async fn copies(store: &PostgresEventStore, tenant: Uuid, id: Uuid) -> usize {
    all_events(store, tenant)
        .await
        .into_iter()
        .filter(|stored| *stored == id)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_whose_commit_answer_is_lost_is_uncertain_and_its_retry_lands_once() {
    let fleet = Fleet::create("uncertain").await;
    let server = tokio_postgres::Config::from_str(&database_url()).expect("test URL");
    let host = match server.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("this test needs a server over TCP on loopback, not {other:?}"),
    };
    assert!(
        host == "127.0.0.1" || host == "localhost",
        "loopback only: {host}"
    );
    let port = server.get_ports().first().copied().unwrap_or(5432);
    let proxy = CommitCutter::start((host, port)).await;
    let mut through_proxy = tokio_postgres::Config::new();
    through_proxy
        .host("127.0.0.1")
        .port(proxy.port)
        .user(server.get_user().unwrap_or("postgres"))
        .dbname(&fleet.a);
    if let Some(password) = server.get_password() {
        through_proxy.password(password);
    }
    let proxied = locks_postgres::plain_pool_with_config(through_proxy, 2).expect("pool");

    // The source store through the proxy; everything else direct.
    let source = PostgresEventStore::new(proxied, table("shared.events"));
    let target = PostgresEventStore::new(pool(&fleet.b, 2), table("dedicated.events"));
    let stores = Stores::new()
        .with_store(SOURCE, source.clone())
        .with_store(TARGET, target);
    let routing = PostgresRoutingRepository::new(pool(&fleet.a, 2), table("fleet.routes"));
    let pause = PostgresWritePause::new(&stores, &routing);
    let migrations = PostgresMigrationRepository::new(pool(&fleet.a, 2), table("fleet.migrations"));
    let ports = MigrationPorts::new(stores, routing.clone(), pause, migrations);
    let router = PostgresWriteRouter::new(&ports, &test_config());
    let tenant = Uuid::new_v4();
    routing
        .put(TenantRoute::normal(tenant, SOURCE))
        .await
        .expect("route");
    router
        .append(tenant, &[Event::new("Before", "")])
        .await
        .expect("a write through the proxy");

    // Through the router.
    let event = Event::new("Uncertain", "1");
    proxy.arm();
    let error = router
        .append(tenant, std::slice::from_ref(&event))
        .await
        .expect_err("the answer to the commit was cut");
    assert_eq!(proxy.cuts(), 1, "the proxy cut the write's COMMIT");
    assert!(error.is_uncertain(), "{error:?}");
    assert!(matches!(error, WriteError::CommitUncertain(_)), "{error:?}");
    assert!(error.to_string().contains("uncertain"), "{error}");
    committed_anyway(&source, tenant, event.id).await;
    let retried = router
        .append(tenant, std::slice::from_ref(&event))
        .await
        .expect("the retry");
    assert_eq!(copies(&source, tenant, event.id).await, 1);
    assert_eq!(
        retried.position, 2,
        "the retry answers with the event's position"
    );
    println!("router: {error}; retry -> {retried:?}");

    // Through the store port (the copy's path).
    let event = Event::new("Uncertain", "2");
    proxy.arm();
    let error = source
        .append(tenant, None, std::slice::from_ref(&event))
        .await
        .expect_err("the answer to the commit was cut");
    assert_eq!(proxy.cuts(), 2);
    assert!(
        matches!(error, StoreError::CommitUncertain { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("uncertain"), "{error}");
    committed_anyway(&source, tenant, event.id).await;
    let head = source
        .append(tenant, None, std::slice::from_ref(&event))
        .await
        .expect("the retry");
    assert_eq!((head, copies(&source, tenant, event.id).await), (3, 1));

    // A batch partly stored appends nothing and says so.
    let fresh = Event::new("Fresh", "");
    let partly = source
        .append(tenant, None, &[event.clone(), fresh.clone()])
        .await;
    assert!(
        matches!(partly, Err(StoreError::PartlyStored { stored: 1, of: 2 })),
        "{partly:?}"
    );
    assert_eq!(copies(&source, tenant, fresh.id).await, 0);
    fleet.drop_databases().await;
}
