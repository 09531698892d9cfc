//! The runner's host is cut off mid-job (a network namespace whose link goes down: no FIN,
//! no RST): the job is told its lock is lost, another host finds the lock free once the
//! lease has run out on the server, and settles the slot as abandoned (at-most-once)
//! instead of running it a second time.
//!
//! The server runs in the near namespace (a child process of this test binary), the runner
//! in the far one; the test plays the other host through the server's Unix socket. It
//! needs root (`ip netns`); where namespaces cannot be made it fails and says so. Its own
//! test binary: it starts its own cluster inside the namespace.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_schedule::{JobContext, Outcome, ScheduledJob, Verdict};
use locks_schedule_postgres::{PostgresLedger, install_ledger};
use throwaway_pg::NetworkPair;

const ROLE: &str = "SCHEDULE_PARTITION_ROLE";
const URL: &str = "SCHEDULE_PARTITION_URL";
const JOB: &str = "SCHEDULE_PARTITION_JOB";
const LISTEN: &str = "SCHEDULE_PARTITION_LISTEN";
const NETWORK: &str = "SCHEDULE_PARTITION_NETWORK";
const PREFIX: &str = "PARTITION:";

/// The far runner's lease: the server frees its lock within this of the cut.
const LEASE: Duration = Duration::from_secs(10);
/// The slots: long enough that the test stays inside one.
const SCHEDULE: &str = "every 1h";

#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "server" => child_server(),
        "runner" => runtime().block_on(child_runner()),
        other => panic!("unknown {ROLE} {other:?}"),
    }
    std::process::exit(0);
}

fn say(message: &str) {
    println!("{PREFIX}{message}");
    std::io::stdout().flush().expect("child stdout");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// PostgreSQL on loopback and the near address, until the input closes.
fn child_server() {
    let listen = std::env::var(LISTEN).expect(LISTEN);
    let server = throwaway_pg::ThrowawayPostgres::builder()
        .setting("listen_addresses", format!("'127.0.0.1,{listen}'"))
        .start()
        .expect("a throwaway PostgreSQL in the namespace");
    server
        .trust(&std::env::var(NETWORK).expect(NETWORK))
        .expect("trust the far side");
    say(&format!(
        "ready {} {}",
        server.port(),
        server.dir().display()
    ));
    let mut line = String::new();
    while std::io::stdin()
        .read_line(&mut line)
        .is_ok_and(|read| read > 0)
    {
        line.clear();
    }
    drop(server);
}

/// Fires once with the lease; the job says `running`, then `told` when the lock is lost,
/// and never returns.
async fn child_runner() {
    let url = std::env::var(URL).expect(URL);
    let pool = locks_postgres::plain_pool(&url, 2).expect("pool");
    let locks = PostgresLockManager::builder(pool.clone())
        .lease(Some(LEASE))
        .try_build()
        .expect("a lease");
    let job = ScheduledJob::new(
        std::env::var(JOB).expect(JOB),
        SCHEDULE.parse().expect("schedule"),
    )
    .holder("far-runner");
    let _ = job
        .run_once_per_slot(
            &locks,
            &PostgresLedger::new(pool),
            |context: JobContext| async move {
                say(&format!("running {}", context.slot));
                let reason = context.lost.clone().await;
                say(&format!("told {reason}"));
                std::future::pending::<Result<(), String>>().await
            },
        )
        .await;
}

/// A child process in a namespace and its messages.
struct InNamespace {
    child: Child,
    messages: mpsc::Receiver<(Instant, String)>,
}

impl InNamespace {
    fn spawn(namespace: &str, env: &[(&str, &str)]) -> Self {
        let exe = std::fs::read_link("/proc/self/exe")
            .or_else(|_| std::env::current_exe())
            .expect("this test binary");
        let mut command = NetworkPair::command_in(namespace, exe);
        command
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = command.spawn().expect("spawn a child in the namespace");
        let stdout = child.stdout.take().expect("child stdout");
        let (sender, messages) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some((_, message)) = line.split_once(PREFIX)
                    && sender.send((Instant::now(), message.to_owned())).is_err()
                {
                    return;
                }
            }
        });
        Self { child, messages }
    }

    fn next(&self, within: Duration, what: &str) -> (Instant, String) {
        self.messages
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("no message from the child: {what}"))
    }
}

impl Drop for InNamespace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_cut_off_runner_is_told_and_its_slot_is_abandoned_not_run_twice() {
    let pair = NetworkPair::make("sched", 117).unwrap_or_else(|error| panic!("{error}"));
    let (near_address, network) = (pair.near_address(), pair.network());
    let server = InNamespace::spawn(
        pair.near(),
        &[
            (ROLE, "server"),
            (LISTEN, near_address.as_str()),
            (NETWORK, network.as_str()),
        ],
    );
    let (_, ready) = server.next(Duration::from_secs(120), "the server started");
    let mut words = ready.split(' ').skip(1);
    let port: u16 = words.next().expect("port").parse().expect("a port");
    let socket_dir = words.next().expect("dir").to_owned();
    let socket_url = format!("host={socket_dir} port={port} user=postgres dbname=postgres");
    let far_url = format!("postgres://postgres@{near_address}:{port}/postgres");
    let runtime = runtime();
    let near_pool = locks_postgres::plain_pool(&socket_url, 4).expect("pool");
    runtime.block_on(async {
        let client = near_pool.get().await.expect("a connection");
        install_ledger(&client).await.expect("install");
    });
    let name = format!("partitioned-{}", std::process::id());
    let runner = InNamespace::spawn(
        pair.far(),
        &[
            (ROLE, "runner"),
            (URL, far_url.as_str()),
            (JOB, name.as_str()),
        ],
    );
    let (_, running) = runner.next(Duration::from_secs(60), "the far runner's job started");
    assert!(running.starts_with("running "), "{running}");

    pair.cut().unwrap_or_else(|error| panic!("{error}"));
    let cut = Instant::now();
    let near = ScheduledJob::new(&name, SCHEDULE.parse().expect("schedule")).holder("near-host");
    let locks = PostgresLockManager::new(near_pool.clone());
    let ledger = PostgresLedger::new(near_pool);
    let (report, settled) = runtime.block_on(async {
        loop {
            let report = near
                .run_once_per_slot(&locks, &ledger, |_: JobContext| async {
                    panic!("the slot must not run a second time");
                    #[allow(unreachable_code)]
                    Ok::<(), String>(())
                })
                .await
                .expect("a firing");
            if report.verdict != Verdict::Busy {
                break (report, Instant::now());
            }
            assert!(
                cut.elapsed() < LEASE * 3,
                "the cut-off runner's lock stayed held for {:?}",
                cut.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (told, message) = runner.next(Duration::from_secs(5), "the far job was told");
    assert!(message.starts_with("told "), "{message}");
    let verdict = if report.slot.to_string() == running["running ".len()..] {
        report.verdict.clone()
    } else {
        report
            .previous
            .clone()
            .map(|(_, verdict)| verdict)
            .expect("the slot settled as the previous one")
    };
    assert_eq!(verdict, Verdict::Settled(Outcome::Abandoned), "{report:?}");
    assert!(
        told < settled,
        "the job was told ({:?} after the cut) before another host settled its slot ({:?})",
        told - cut,
        settled - cut
    );
    assert!(
        settled - cut <= LEASE + Duration::from_secs(2),
        "settled {:?} after the cut, lease {LEASE:?}",
        settled - cut
    );
    println!(
        "cut-off runner told after {:?}, slot settled as abandoned by another host after {:?}",
        told - cut,
        settled - cut
    );
    drop(runner);
    drop(server);
}
