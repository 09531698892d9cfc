//! The runner's host is cut off mid-job (a network namespace whose link goes down: no FIN,
//! no RST): the job is told its lock is lost, another host finds the lock free once the
//! lease has run out on the server, and settles the slot as abandoned (at-most-once)
//! instead of running it a second time.
//!
//! The server runs in the near namespace (a child process of this test binary), the runner
//! in the far one; the test plays the other host through the server's Unix socket. It
//! needs root (`ip netns`); where namespaces cannot be made it fails and says so. Its own
//! test binary: it starts its own cluster inside the namespace.

use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_schedule::{JobContext, Outcome, ScheduledJob, Verdict};
use locks_schedule_postgres::{PostgresLedger, install_ledger};
use throwaway_pg::testing::child::{entry, env, say};
use throwaway_pg::testing::near::{InNamespace, NearServer, serve};

const ROLE: &str = "SCHEDULE_PARTITION_ROLE";
const URL: &str = "SCHEDULE_PARTITION_URL";
const JOB: &str = "SCHEDULE_PARTITION_JOB";

/// The far runner's lease: the server frees its lock within this of the cut.
const LEASE: Duration = Duration::from_secs(10);
/// The slots: long enough that the test nearly always stays inside one (a boundary that
/// passes meanwhile is allowed for below).
const SCHEDULE: &str = "every 1h";

#[test]
fn child_entry() {
    entry(ROLE, |role, runtime| match role {
        "server" => serve(|_, _| ((), Vec::new())),
        "runner" => runtime.block_on(child_runner()),
        other => panic!("unknown {ROLE} {other:?}"),
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Fires once with the lease; the job says `running`, then `told` when the lock is lost,
/// and never returns.
async fn child_runner() {
    let url = env(URL);
    let pool = locks_postgres::plain_pool(&url, 2).expect("pool");
    let locks = PostgresLockManager::builder(pool.clone())
        .lease(Some(LEASE))
        .try_build()
        .expect("a lease");
    let job = ScheduledJob::new(env(JOB), SCHEDULE.parse().expect("schedule")).holder("far-runner");
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

#[test]
fn a_cut_off_runner_is_told_and_its_slot_is_abandoned_not_run_twice() {
    let server = NearServer::start("sched", 117, "child_entry", &[(ROLE, "server")]);
    let (socket_url, far_url) = (server.socket_url(), server.far_url(None));
    let runtime = runtime();
    let near_pool = locks_postgres::plain_pool(&socket_url, 4).expect("pool");
    runtime.block_on(async {
        let client = near_pool.get().await.expect("a connection");
        install_ledger(&client).await.expect("install");
    });
    let name = format!("partitioned-{}", std::process::id());
    let runner = InNamespace::spawn(
        server.pair().far(),
        "child_entry",
        &[
            (ROLE, "runner"),
            (URL, far_url.as_str()),
            (JOB, name.as_str()),
        ],
    );
    let (_, running) = runner.next(Duration::from_secs(60), "the far runner's job started");
    assert!(running.starts_with("running "), "{running}");

    server.cut();
    let cut = Instant::now();
    let near = ScheduledJob::new(&name, SCHEDULE.parse().expect("schedule")).holder("near-host");
    let locks = PostgresLockManager::new(near_pool.clone());
    let ledger = PostgresLedger::new(near_pool);
    // The far runner's slot must not run again. A slot boundary may pass while the test
    // waits (the hour turned in one CI run): the next slot then runs here, as it should,
    // and the far runner's is settled as the previous one.
    let far_slot = running["running ".len()..].to_owned();
    let (report, settled) = runtime.block_on(async {
        loop {
            let report = near
                .run_once_per_slot(&locks, &ledger, |context: JobContext| {
                    let again = context.slot.to_string() == far_slot;
                    async move {
                        assert!(!again, "the slot must not run a second time");
                        Ok::<(), String>(())
                    }
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
