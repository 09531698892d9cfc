//! `pglock` on five hosts whose clocks disagree by up to ±3 s (libfaketime, from Debian's
//! `faketime` package, which `scripts/install-test-deps.sh` installs): the server's clock
//! names the slot, so each slot runs once.

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use crate::once_per::{all_silent, install, next_even_second, runs_once_each, terminate};
use crate::{output, pglock, unique};

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
    install().await;
    let (key, dir) = unique("skewed-once-per");
    let log = dir.join("runs");
    let script = format!("echo \"$PGLOCK_SLOT\" >> {}; sleep 0.1", log.display());
    for round in 0..4 {
        next_even_second(Duration::from_millis(100)).await;
        let hosts = SKEWS
            .iter()
            .map(|skew| {
                let mut command = skewed_pglock(skew);
                command.args(["run", "--once-per", "2s", &key, "-c", &script]);
                tokio::spawn(async move { output(&mut command).await })
            })
            .collect();
        all_silent(round, hosts).await;
    }
    assert_eq!(runs_once_each(&log).len(), 4);
}

/// Five `pglock schedule 'every 1s'` on skewed clocks for 10 s: each fires at the second
/// boundaries of its own clock, so the server's slots see firings from several hosts at
/// different times; no slot runs twice, and about one runs each second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_schedulers_run_each_slot_once() {
    install().await;
    let (key, dir) = unique("skewed-schedule");
    let log = dir.join("runs");
    let script = format!("echo \"$PGLOCK_SLOT\" >> {}; sleep 0.1", log.display());
    let schedulers = SKEWS
        .iter()
        .map(|skew| {
            skewed_pglock(skew)
                .args(["schedule", "every 1s", &key, "-c", &script])
                .spawn()
                .expect("spawn")
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(10)).await;
    terminate(schedulers).await;
    let slots = runs_once_each(&log);
    println!(
        "skewed schedulers: {} runs, none twice, over 10 s",
        slots.len()
    );
    assert!(slots.len() >= 8, "about one run per second: {slots:?}");
}
