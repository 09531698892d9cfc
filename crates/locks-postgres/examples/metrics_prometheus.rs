//! The lock manager's metrics, exported for Prometheus to scrape.
//!
//! Run it against a server (it creates nothing there; it terminates some of its own lock
//! sessions to show lost locks, which needs the `pg_signal_backend` role or a superuser):
//!
//! ```text
//! cargo run -p locks-postgres --example metrics_prometheus -- \
//!     --url postgres://... [--listen 127.0.0.1:9464] [--seconds 300]
//! ```
//!
//! (`--url` defaults to `$LOCKS_DATABASE_URL`.) It installs the OpenTelemetry metrics SDK
//! with the Prometheus exporter as the global meter provider, then builds three managers
//! (three "instances") whose workers contend for a few keys for `--seconds`: bounded
//! acquisitions (some time out), tries (some find the lock busy), shared readers, one
//! long-held lock per instance (keepalives every second), and every 20 s one held lock's
//! session terminated with `pg_terminate_backend` (a lost
//! lock). `GET /metrics` on `--listen` answers in Prometheus' text format. Then it stops
//! by itself. `docs/dashboards/` has a Prometheus configuration, a console and a Grafana
//! dashboard for these metrics, and the script that made the picture in the crate README.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_postgres::locks_port::{AcquireOptions, DistributedLock, LockGuard};
use locks_postgres::tokio_postgres::{self, NoTls};
use prometheus::{Registry, TextEncoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The keys the workers contend for: a few, as an operator's dashboard would show.
const KEYS: [&str; 4] = [
    "job:nightly-report",
    "tenant:42",
    "tenant:7",
    "cache:rebuild",
];

struct Args {
    url: String,
    listen: String,
    run_for: Duration,
}

fn parse() -> Result<Args, Error> {
    let mut url = std::env::var("LOCKS_DATABASE_URL").ok();
    let mut listen = "127.0.0.1:9464".to_owned();
    let mut seconds = 300;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--url" => url = Some(value()?),
            "--listen" => listen = value()?,
            "--seconds" => seconds = value()?.parse()?,
            other => return Err(format!("unexpected argument `{other}`").into()),
        }
    }
    Ok(Args {
        url: url.ok_or("no --url and no LOCKS_DATABASE_URL")?,
        listen,
        run_for: Duration::from_secs(seconds),
    })
}

/// A small xorshift generator: the workload needs variety, not quality.
struct Dice(u64);

impl Dice {
    fn new(seed: u64) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |elapsed| elapsed.subsec_nanos());
        Self((seed + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(nanos) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One worker of one instance: a loop of acquisitions until `until`.
async fn worker(locks: PostgresLockManager, seed: u64, until: Instant, done: Arc<AtomicU64>) {
    let mut dice = Dice::new(seed);
    while Instant::now() < until {
        let key = KEYS[usize::try_from(dice.below(4)).unwrap_or(0)];
        let hold = Duration::from_millis(20 + dice.below(250));
        let guard = match dice.below(10) {
            // A try: "somebody else has it, move on".
            0..=2 => locks.try_acquire(key).await.ok().flatten(),
            // A reader of the shared catalog.
            3 => locks
                .acquire("catalog", AcquireOptions::shared())
                .await
                .ok(),
            // A bounded wait in the server's queue.
            _ => {
                let timeout = Duration::from_millis(100 + dice.below(600));
                locks
                    .acquire(key, AcquireOptions::new().with_timeout(timeout))
                    .await
                    .ok()
            }
        };
        if let Some(guard) = guard {
            tokio::select! {
                () = tokio::time::sleep(hold) => {}
                _ = guard.lost() => {}
            }
            guard.release().await;
            done.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(20 + dice.below(80))).await;
    }
}

/// A long-held lock of one instance (its keepalives show the round trip), taken again
/// a second after it is lost.
async fn long_holder(locks: PostgresLockManager, key: String, until: Instant) {
    while Instant::now() < until {
        if let Ok(guard) = locks.acquire(&key, AcquireOptions::new()).await {
            let left = until.saturating_duration_since(Instant::now());
            tokio::select! {
                () = tokio::time::sleep(left) => {}
                reason = guard.lost() => println!("{key}: lost ({reason})"),
            }
            guard.release().await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every `every`, terminates the session of one lock held by these instances (their
/// `application_name` starts with `locks:metrics-example-`).
async fn chaos(url: String, every: Duration, until: Instant) -> Result<(), Error> {
    let (admin, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(connection);
    while Instant::now() + every < until {
        tokio::time::sleep(every).await;
        let rows = admin
            .query(
                "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a \
                 WHERE a.application_name LIKE 'locks:metrics-example-%' AND EXISTS \
                 (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' \
                 AND l.granted) LIMIT 1",
                &[],
            )
            .await?;
        println!("terminated {} lock session(s)", rows.len());
    }
    Ok(())
}

/// Answers every request with the registry in Prometheus' text format.
async fn serve(listener: TcpListener, registry: Registry) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let mut request = vec![0; 4096];
            let _ = socket.read(&mut request).await;
            let body = TextEncoder::new()
                .encode_to_string(&registry.gather())
                .unwrap_or_else(|error| format!("# encoding failed: {error}\n"));
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = parse()?;
    // The application's part: the SDK and the exporter, installed before the managers
    // are built (their instruments are made on the global provider as it is then).
    let registry = Registry::new();
    let exporter = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .build()?;
    let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_reader(exporter)
        .build();
    opentelemetry::global::set_meter_provider(provider.clone());

    let listener = TcpListener::bind(&args.listen).await?;
    println!(
        "serving metrics on http://{}/metrics for {:?}",
        listener.local_addr()?,
        args.run_for
    );
    tokio::spawn(serve(listener, registry));

    let until = Instant::now() + args.run_for;
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for instance in 0..3_u64 {
        let locks = PostgresLockManager::builder(locks_postgres::plain_pool(&args.url, 4)?)
            .holder_id(format!("metrics-example-{instance}"))
            .keepalive(Some(Duration::from_secs(1)))
            .build();
        workers.push(tokio::spawn(long_holder(
            locks.clone(),
            format!("duty:instance-{instance}"),
            until,
        )));
        // Four workers and the long holder on a pool of four: now and then a try finds
        // no free connection (`error.type = pool_unavailable`).
        for n in 0..4 {
            let seed = instance * 10 + n;
            workers.push(tokio::spawn(worker(
                locks.clone(),
                seed,
                until,
                Arc::clone(&done),
            )));
        }
    }
    let chaos = tokio::spawn(chaos(args.url.clone(), Duration::from_secs(20), until));
    for worker in workers {
        worker.await?;
    }
    chaos.await??;
    println!(
        "done: {} critical sections in {:?}",
        done.load(Ordering::Relaxed),
        args.run_for
    );
    provider.shutdown()?;
    Ok(())
}
