//! `cargo xtask bench [--quick] [--out FILE.json] [--only LIST]`: the lock benchmarks
//! (`bench/`, package `lock-bench`) against a real server.
//!
//! With `LOCKS_DATABASE_URL` set it uses that server; otherwise it starts a throwaway
//! PostgreSQL for the run and stops it afterwards. The benchmark is built with
//! `--release` and gets the URL in `LOCKS_DATABASE_URL` (not on its command line, so a
//! password never shows in `ps` or in the command printed here).
//!
//! The instruction counts run under valgrind's callgrind: when `valgrind` is missing it is
//! installed with `apt-get` (a fresh Debian or Ubuntu machine, as root) before the build.

use std::process::Command;

use crate::cargo_on_database;
use crate::pg::with_database;

const HELP: &str = "\
usage: cargo xtask bench [--quick] [--out FILE.json] [--only LIST]

Runs the lock benchmarks (library against raw tokio-postgres, pinned to one CPU,
instructions per cycle under callgrind, through a delaying proxy; queue against polling;
the in-memory manager against a tokio Mutex) on the server in LOCKS_DATABASE_URL, or on a
throwaway PostgreSQL when it is not set. Prints markdown tables with PASS/MISS against the
targets; writes target/bench/lock-bench-{quick,full}.json, a .md beside it and
target/bench/handoff.svg. Installs valgrind (apt-get) when it is missing.

  --quick       small iteration counts (about a minute of measuring)
  --out FILE    where the JSON goes (the .md and handoff.svg go beside it)
  --only LIST   comma-separated scenarios: cycle, try, shared, many, throughput, handoff,
                hold, memory, instructions, metrics, latency, cutover-append, multiplex,
                groups, permits
";

/// Runs the benchmarks with `args`.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let Some(forwarded) = parse(args)? else {
        print!("{HELP}");
        return Ok(());
    };
    if counts_instructions(&forwarded) {
        ensure_valgrind()?;
    }
    with_database(|url| {
        let build = [
            "run",
            "--release",
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
    })
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
            "--out" | "--only" => {
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
        let args = strings(&["--quick", "--only", "cycle,hold", "--out", "x.json"]);
        assert_eq!(parse(&args).unwrap(), Some(args.clone()));
        assert_eq!(parse(&strings(&["--help"])).unwrap(), None);
        assert!(parse(&strings(&["--url", "postgres://x"])).is_err());
        assert!(parse(&strings(&["--out"])).is_err());
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
