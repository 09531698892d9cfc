//! `cargo xtask bench [--quick] [--out FILE.json] [--only LIST]`: the lock benchmarks
//! (`bench/`, package `lock-bench`) against a real server.
//!
//! With `LOCKS_DATABASE_URL` set it uses that server; otherwise it starts a throwaway
//! PostgreSQL for the run and stops it afterwards. The benchmark is built with the
//! workspace's `measure` profile (release, fat LTO, one codegen unit: the raw baselines
//! compiled into it are inlined alike from build to build) and gets the URL in
//! `LOCKS_DATABASE_URL` (not on its command line, so a password never shows in `ps` or in
//! the command printed here).
//!
//! The `scale` scenario (`--only scale`, never by default) needs a server sized for its
//! held-lock count (`--scale-max N`, 10^5 by default): the throwaway server gets
//! `max_locks_per_transaction`, `max_connections` and `shared_buffers` from
//! [`scale_settings`]. A server in `LOCKS_DATABASE_URL` is used as it is (the scenario says
//! when it is too small).
//!
//! The instruction counts run under valgrind's callgrind: when `valgrind` is missing it is
//! installed with `apt-get` (a fresh Debian or Ubuntu machine, as root) before the build.

use std::process::Command;

use throwaway_pg::ThrowawayPostgres;

use crate::cargo_on_database;
use crate::pg::{DATABASE_URL_ENV, with_database};

const HELP: &str = "\
usage: cargo xtask bench [--quick] [--out FILE.json] [--only LIST] [--scale-max N]

Runs the lock benchmarks (library against raw tokio-postgres, pinned to one CPU,
instructions per cycle under callgrind, through a delaying proxy; queue against polling;
the in-memory manager against a tokio Mutex) on the server in LOCKS_DATABASE_URL, or on a
throwaway PostgreSQL when it is not set. Prints markdown tables with PASS/MISS against the
targets; writes target/bench/lock-bench-{quick,full}.json, a .md beside it and
target/bench/handoff.svg (and scale.svg). Installs valgrind (apt-get) when it is missing.

  --quick       small iteration counts (about a minute of measuring)
  --out FILE    where the JSON goes (the .md and the charts go beside it)
  --only LIST   comma-separated scenarios: cycle, try, shared, throughput, handoff, hold,
                memory, instructions, metrics, latency, cutover-append; and scale
                (only when named)
  --scale-max N the scale scenario's largest held-lock count (default 1e5, 1e4 with
                --quick; 1e6 takes minutes and a server of ~1 GB shared memory, which
                the throwaway server is sized for)
";

/// Connections the scale scenario may open at once (1,000 waiters, each its own).
const SCALE_CONNECTIONS: u64 = 1100;

/// Runs the benchmarks with `args`.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let Some(forwarded) = parse(args)? else {
        print!("{HELP}");
        return Ok(());
    };
    if counts_instructions(&forwarded) {
        ensure_valgrind()?;
    }
    let run_bench = |url: &str| {
        let build = [
            "run",
            "--profile",
            "measure",
            "--quiet",
            "--package",
            "lock-bench",
            "--",
        ];
        let args = build
            .iter()
            .map(|arg| arg.to_string())
            .chain(forwarded.iter().cloned());
        if cargo_on_database(url, args)? {
            Ok(())
        } else {
            Err("the benchmarks failed".into())
        }
    };
    match scale_max(&forwarded) {
        Some(count) if std::env::var(DATABASE_URL_ENV).is_ok_and(|url| !url.trim().is_empty()) => {
            eprintln!(
                "xtask: the scale scenario ({count} locks) runs on the server in \
                 {DATABASE_URL_ENV} as it is sized"
            );
            with_database(run_bench)
        }
        Some(count) => with_sized_database(&scale_settings(count), run_bench),
        None => with_database(run_bench),
    }
}

/// The scale scenario's largest count when `--only` names it: `--scale-max`, or 10^5
/// (10^4 with `--quick`).
fn scale_max(forwarded: &[String]) -> Option<u64> {
    let value = |flag: &str| {
        let index = forwarded.iter().position(|arg| arg == flag)?;
        forwarded.get(index + 1)
    };
    let named = value("--only").is_some_and(|list| list.split(',').any(|s| s.trim() == "scale"));
    if !named {
        return None;
    }
    let default = if forwarded.iter().any(|arg| arg == "--quick") {
        10_000
    } else {
        100_000
    };
    Some(
        value("--scale-max")
            .and_then(|text| text.replace('_', "").parse::<f64>().ok())
            .filter(|count| (1.0..=1e7).contains(count))
            .map_or(default, |count| {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let count = count as u64;
                count
            }),
    )
}

/// A server for `count` held locks and the scenario's other sessions: the lock table
/// (`max_locks_per_transaction × max_connections`) at least 1.5 × `count`, a power of
/// two per connection and never under the default 64; [`SCALE_CONNECTIONS`] connections.
fn scale_settings(count: u64) -> Vec<(&'static str, String)> {
    let per_connection = (count * 3 / 2)
        .div_ceil(SCALE_CONNECTIONS)
        .next_power_of_two()
        .max(64);
    vec![
        ("max_locks_per_transaction", per_connection.to_string()),
        ("max_connections", SCALE_CONNECTIONS.to_string()),
        ("shared_buffers", "128MB".to_owned()),
    ]
}

/// [`with_database`] on a throwaway server with `settings`, stopped (folder removed)
/// when `task` returns.
fn with_sized_database(
    settings: &[(&'static str, String)],
    task: impl FnOnce(&str) -> crate::Result,
) -> crate::Result {
    let mut builder = ThrowawayPostgres::builder();
    for (name, value) in settings {
        builder = builder.setting(*name, value.clone());
    }
    let pg = builder.start()?;
    let said: Vec<String> = settings.iter().map(|(n, v)| format!("{n} = {v}")).collect();
    eprintln!(
        "xtask: a throwaway PostgreSQL sized for the scale scenario ({}) at {}, folder {}; \
         it is stopped when this task ends",
        said.join(", "),
        pg.url(),
        pg.dir().display()
    );
    let result = task(&pg.url());
    let stopped = pg.destroy();
    if let Err(error) = &stopped {
        eprintln!("xtask: warning: could not clean up the throwaway PostgreSQL: {error}");
    }
    result?;
    Ok(stopped?)
}

/// Whether the run includes a callgrind scenario (`instructions`, `metrics`; every run
/// does unless `--only` leaves them out).
fn counts_instructions(forwarded: &[String]) -> bool {
    match forwarded.iter().position(|arg| arg == "--only") {
        Some(index) => forwarded.get(index + 1).is_some_and(|list| {
            list.split(',')
                .any(|s| matches!(s.trim(), "instructions" | "metrics"))
        }),
        None => true,
    }
}

fn valgrind_works() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Installs valgrind with apt-get when it is not there (refreshing the package lists if
/// the first attempt fails).
fn ensure_valgrind() -> crate::Result {
    if valgrind_works() {
        return Ok(());
    }
    eprintln!(
        "xtask: valgrind (for the instruction counts) is missing; installing it with apt-get"
    );
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|status| status.success())
    };
    if !apt(&["install", "-y", "-q", "valgrind"]) {
        apt(&["update", "-q"]);
        apt(&["install", "-y", "-q", "valgrind"]);
    }
    if valgrind_works() {
        Ok(())
    } else {
        Err(
            "could not install valgrind: run `apt-get install valgrind` as root, or leave the \
             instruction counts out with `--only` (they need valgrind)"
                .into(),
        )
    }
}

/// The arguments for `lock-bench`, checked here so a typo fails before any build; `None`
/// for help.
fn parse(args: &[String]) -> Result<Option<Vec<String>>, String> {
    let mut forwarded = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => forwarded.push(arg.clone()),
            "--out" | "--only" | "--scale-max" => {
                let value = args
                    .next()
                    .ok_or_else(|| format!("{arg} needs a value\n\n{HELP}"))?;
                forwarded.extend([arg.clone(), value.clone()]);
            }
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unexpected argument `{other}`\n\n{HELP}")),
        }
    }
    Ok(Some(forwarded))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn known_arguments_are_forwarded_and_others_refused() {
        let args = strings(&[
            "--quick",
            "--only",
            "cycle,hold",
            "--out",
            "x.json",
            "--scale-max",
            "1e6",
        ]);
        assert_eq!(parse(&args).unwrap(), Some(args.clone()));
        assert_eq!(parse(&strings(&["--help"])).unwrap(), None);
        assert!(parse(&strings(&["--url", "postgres://x"])).is_err());
        assert!(parse(&strings(&["--out"])).is_err());
    }

    #[test]
    fn the_scale_server_is_sized_for_the_count() {
        assert_eq!(scale_max(&strings(&["--only", "cycle"])), None);
        assert_eq!(scale_max(&strings(&["--quick"])), None);
        assert_eq!(scale_max(&strings(&["--only", "scale"])), Some(100_000));
        assert_eq!(
            scale_max(&strings(&["--quick", "--only", "scale"])),
            Some(10_000)
        );
        let million = strings(&["--only", "scale", "--scale-max", "1e6"]);
        assert_eq!(scale_max(&million), Some(1_000_000));
        let settings = scale_settings(1_000_000);
        // 2048 × 1100 = 2,252,800 entries: room for 1.5 million.
        assert_eq!(
            settings[0],
            ("max_locks_per_transaction", "2048".to_owned())
        );
        assert_eq!(settings[1], ("max_connections", "1100".to_owned()));
        assert_eq!(scale_settings(100_000)[0].1, "256");
        assert_eq!(scale_settings(1000)[0].1, "64");
    }

    #[test]
    fn valgrind_is_needed_unless_only_leaves_the_instruction_counts_out() {
        assert!(counts_instructions(&strings(&["--quick"])));
        assert!(counts_instructions(&strings(&[
            "--only",
            "cycle,instructions"
        ])));
        assert!(!counts_instructions(&strings(&["--only", "cycle,hold"])));
    }
}
