//! `pglock run --once-per`: five processes fired together at every slot, one runs the
//! command per slot, the others exit 0 and print nothing; `pglock jobs` shows the runs.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;

use crate::{code, output, pglock, stderr, unique};

/// Waits until the server's clock is `into` past an even second (a 2 s slot's start).
pub(crate) async fn next_even_second(into: Duration) {
    let admin = throwaway_pg::testing::admin().await;
    let millis: f64 = admin
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8",
            &[],
        )
        .await
        .expect("the server's clock")
        .get(0);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a positive, small value
    let to_next = 2_000 - (millis as u64 % 2_000);
    tokio::time::sleep(Duration::from_millis(to_next) + into).await;
}

/// The server's clock, in seconds since the Unix epoch.
async fn server_seconds() -> f64 {
    throwaway_pg::testing::admin()
        .await
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
        .expect("the server's clock")
        .get(0)
}

/// A timestamp pglock printed, in seconds since the Unix epoch (read by the server).
async fn epoch_of(text: &str) -> i64 {
    throwaway_pg::testing::admin()
        .await
        .query_one(
            "SELECT extract(epoch FROM $1::text::timestamptz)::int8",
            &[&text],
        )
        .await
        .unwrap_or_else(|error| panic!("{text}: {error}"))
        .get(0)
}

/// `pglock jobs --install`, which must succeed (and may run again).
pub(crate) async fn install() {
    let install = output(pglock().args(["jobs", "--install"])).await;
    assert_eq!(code(&install), 0, "{}", stderr(&install));
}

/// Waits for one round of firings: each must exit 0 and print nothing, whether it ran the
/// slot or not.
pub(crate) async fn all_silent(round: usize, hosts: Vec<tokio::task::JoinHandle<Output>>) {
    for (host, firing) in hosts.into_iter().enumerate() {
        let firing = firing.await.expect("join");
        assert_eq!(
            code(&firing),
            0,
            "round {round} host {host}: {}",
            stderr(&firing)
        );
        assert!(
            firing.stdout.is_empty() && firing.stderr.is_empty(),
            "round {round} host {host} said something: {firing:?}"
        );
    }
}

/// SIGTERMs every scheduler; each must exit 143.
pub(crate) async fn terminate(schedulers: Vec<Child>) {
    for scheduler in &schedulers {
        let pid = i32::try_from(scheduler.id().expect("running")).expect("pid");
        kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    }
    for scheduler in schedulers {
        let done = tokio::time::timeout(Duration::from_secs(10), scheduler.wait_with_output())
            .await
            .expect("exited on SIGTERM")
            .expect("waited");
        assert_eq!(code(&done), 143, "{}", stderr(&done));
    }
}

/// The lines the commands appended to `log`; fails if a line (a slot) is there twice.
pub(crate) fn runs_once_each(log: &Path) -> Vec<String> {
    let runs = std::fs::read_to_string(log).expect("the runs");
    let slots: Vec<String> = runs.lines().map(str::to_owned).collect();
    let mut distinct = slots.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), slots.len(), "a slot ran twice: {runs}");
    slots
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_processes_run_each_slot_once_and_the_others_stay_silent() {
    install().await;
    let (key, dir) = unique("once-per");
    let log = dir.join("runs");
    let script = format!(
        "echo \"$PGLOCK_SLOT $PGLOCK_ATTEMPT\" >> {}; sleep 0.1",
        log.display()
    );
    for round in 0..4 {
        next_even_second(Duration::from_millis(100)).await;
        let mut hosts = Vec::new();
        for host in 0..5_u64 {
            // Fired 0 to 600 ms apart, as five hosts' cron jobs with skewed clocks are.
            tokio::time::sleep(Duration::from_millis(150 * u64::from(host > 0))).await;
            let mut command = pglock();
            command.args(["run", "--once-per", "2s", &key, "-c", &script]);
            hosts.push(tokio::spawn(async move { output(&mut command).await }));
        }
        all_silent(round, hosts).await;
    }
    let slots = runs_once_each(&log);
    assert_eq!(slots.len(), 4, "one run per round: {slots:?}");
    assert!(
        slots.iter().all(|line| line.ends_with(".000000Z 1")),
        "even-second slots, first attempts: {slots:?}"
    );

    let jobs = output(pglock().args(["jobs", &key, "--json"])).await;
    assert_eq!(code(&jobs), 0, "{}", stderr(&jobs));
    let rows: serde_json::Value = serde_json::from_slice(&jobs.stdout).expect("JSON");
    let rows = rows.as_array().expect("an array");
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(
        rows.iter()
            .all(|row| row["outcome"] == "succeeded" && row["attempt"] == 1),
        "{rows:?}"
    );
    assert!(rows.iter().all(|row| row["next"].is_null()), "{rows:?}");
    let table = output(pglock().args(["jobs", &key])).await;
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with("JOB") && text.lines().count() == 5,
        "{text}"
    );
    assert!(
        text.lines().skip(1).all(|line| line.contains(" ? ")),
        "{text}"
    );

    // With the schedule, each job's next slot: the next even second of the server's clock,
    // after every slot that ran.
    let before = server_seconds().await;
    let jobs = output(pglock().args(["jobs", &key, "--json", "--schedule", "every 2s"])).await;
    let after = server_seconds().await;
    assert_eq!(code(&jobs), 0, "{}", stderr(&jobs));
    let rows: serde_json::Value = serde_json::from_slice(&jobs.stdout).expect("JSON");
    for row in rows.as_array().expect("an array") {
        let next = row["next"].as_str().expect("a next slot");
        let seconds = epoch_of(next).await;
        assert_eq!(seconds % 2, 0, "an even second: {next}");
        assert!(
            before < seconds as f64 && seconds as f64 <= after + 2.0,
            "{before} < {next} <= {after} + 2"
        );
        assert!(next > row["slot"].as_str().expect("a slot"), "{row}");
    }
    let table = output(pglock().args(["jobs", &key, "--schedule", "every 2s"])).await;
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.lines()
            .next()
            .is_some_and(|head| head.contains("NEXT")),
        "{text}"
    );
    assert!(!text.contains(" ? "), "{text}");
    let bad = output(pglock().args(["jobs", &key, "--schedule", "every banana"])).await;
    assert_eq!(code(&bad), 64, "{}", stderr(&bad));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_ledger_is_created_on_first_use() {
    let schema = throwaway_pg::testing::unique("fresh_schema");
    let admin = throwaway_pg::testing::admin().await;
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("a schema");
    let url = throwaway_pg::testing::database_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}options=-csearch_path%3D{schema}");
    let (key, _dir) = unique("once-per-install");
    let first =
        output(pglock().args(["--url", &url, "run", "--once-per", "1h", &key, "--", "true"])).await;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    let rows: i64 = admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {schema}.scheduled_job_runs WHERE outcome = 'succeeded'"
            ),
            &[],
        )
        .await
        .expect("the new ledger")
        .get(0);
    assert_eq!(rows, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_exits_with_the_command_and_bad_periods_are_usage_errors() {
    install().await;
    let (key, _dir) = unique("once-per-exit");
    let run = |exit: &str| format!("echo \"$PGLOCK_SLOT\"; exit {exit}");
    let failing = output(pglock().args(["run", "--once-per", "1h", &key, "-c", &run("3")])).await;
    assert_eq!(code(&failing), 3, "{}", stderr(&failing));
    let again = output(pglock().args(["run", "--once-per", "1h", &key, "-c", &run("4")])).await;
    // The hour may turn between the two: the next slot then runs, as it should.
    let slot = |output: &std::process::Output| String::from_utf8_lossy(&output.stdout).into_owned();
    let next_slot = code(&again) == 4 && slot(&again) != slot(&failing);
    assert!(
        code(&again) == 0 || next_slot,
        "the slot ran (and failed): at most once: {} {}",
        code(&again),
        stderr(&again)
    );
    let zero = output(pglock().args(["run", "--once-per", "0s", &key, "--", "true"])).await;
    assert_eq!(code(&zero), 64, "{}", stderr(&zero));
    assert!(stderr(&zero).contains("--once-per"), "{}", stderr(&zero));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_schedulers_run_each_slot_once_until_terminated() {
    install().await;
    let (key, dir) = unique("schedule");
    let log = dir.join("runs");
    let script = format!("echo \"$PGLOCK_SLOT\" >> {}", log.display());
    let schedulers: Vec<Child> = (0..3)
        .map(|_| {
            pglock()
                .args(["schedule", "every 2s", &key, "-c", &script])
                .spawn()
                .expect("spawn")
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    terminate(schedulers).await;
    let slots = runs_once_each(&log);
    assert!(
        (3..=4).contains(&slots.len()),
        "one run per 2 s slot over 7.5 s: {slots:?}"
    );
}
