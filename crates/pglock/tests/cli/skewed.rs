//! `pglock` on five hosts whose clocks disagree by up to ±3 s (libfaketime, from Debian's
//! `faketime` package, which `scripts/install-test-deps.sh` installs): the server's clock
//! names the slot, so each slot runs once.

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use crate::{code, output, pglock, stderr, unique};

/// libfaketime's multi-threaded library, as Debian installs it.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// The five hosts' clock offsets (host clock = real clock + offset), in seconds.
const SKEWS: [&str; 5] = ["-2.7", "-1.3", "+0.4", "+1.6", "+2.9"];

/// `pglock` with its wall clock off by `skew` seconds (its monotonic clock, which only
/// times waits, left alone).
fn skewed_pglock(skew: &str) -> Command {
    assert!(
        Path::new(LIBFAKETIME).is_file(),
        "{LIBFAKETIME} is missing: install Debian's faketime package (scripts/install-test-deps.sh)"
    );
    let mut command = pglock();
    command
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME", skew)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("FAKETIME_NO_CACHE", "1");
    command
}

/// The faked clock is the one the process sees: a control that the offset applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_faked_clock_is_off() {
    let mut date = Command::new("date");
    date.arg("+%s")
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME", "+3600");
    let faked: i64 = String::from_utf8(output(&mut date).await.stdout)
        .expect("text")
        .trim()
        .parse()
        .expect("seconds");
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    assert!(
        (faked - i64::try_from(real).expect("seconds") - 3600).abs() <= 2,
        "{faked} vs {real}"
    );
}

/// Five `pglock run --once-per 2s` fired together at four slots, each on a skewed clock:
/// one run per slot, the other four silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_once_per_runs_each_slot_once() {
    let (key, dir) = unique("skewed-once-per");
    let log = dir.join("runs");
    let script = format!("echo \"$PGLOCK_SLOT\" >> {}; sleep 0.1", log.display());
    for round in 0..4 {
        crate::once_per::next_even_second(Duration::from_millis(100)).await;
        let hosts: Vec<_> = SKEWS
            .iter()
            .map(|skew| {
                let mut command = skewed_pglock(skew);
                command.args(["run", "--once-per", "2s", &key, "-c", &script]);
                tokio::spawn(async move { output(&mut command).await })
            })
            .collect();
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
                "{firing:?}"
            );
        }
    }
    let runs = std::fs::read_to_string(&log).expect("the runs");
    let mut slots: Vec<&str> = runs.lines().collect();
    assert_eq!(slots.len(), 4, "{runs}");
    slots.dedup();
    assert_eq!(slots.len(), 4, "{runs}");
    std::fs::remove_dir_all(dir).expect("clean up");
}

/// Five `pglock schedule 'every 1s'` on skewed clocks for 10 s: each fires at the second
/// boundaries of its own clock, so the server's slots see firings from several hosts at
/// different times; no slot runs twice, and the slots run cover the run's seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_schedulers_run_each_slot_once() {
    let install = output(pglock().args(["jobs", "--install"])).await;
    assert_eq!(code(&install), 0, "{}", stderr(&install));
    let (key, dir) = unique("skewed-schedule");
    let log = dir.join("runs");
    let script = format!("echo \"$PGLOCK_SLOT\" >> {}; sleep 0.1", log.display());
    let mut schedulers: Vec<tokio::process::Child> = SKEWS
        .iter()
        .map(|skew| {
            skewed_pglock(skew)
                .args(["schedule", "every 1s", &key, "-c", &script])
                .spawn()
                .expect("spawn")
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    for scheduler in &mut schedulers {
        let pid = i32::try_from(scheduler.id().expect("running")).expect("pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
    }
    for scheduler in schedulers {
        let done = tokio::time::timeout(Duration::from_secs(10), scheduler.wait_with_output())
            .await
            .expect("exited on SIGTERM")
            .expect("waited");
        assert_eq!(code(&done), 143, "{}", stderr(&done));
    }
    let runs = std::fs::read_to_string(&log).expect("the runs");
    let slots: Vec<&str> = runs.lines().collect();
    let mut distinct = slots.clone();
    distinct.sort_unstable();
    distinct.dedup();
    println!(
        "skewed schedulers: {} runs, {} distinct slots over 10 s",
        slots.len(),
        distinct.len()
    );
    assert_eq!(distinct.len(), slots.len(), "a slot ran twice: {runs}");
    assert!(slots.len() >= 8, "about one run per second: {runs}");
    std::fs::remove_dir_all(dir).expect("clean up");
}
