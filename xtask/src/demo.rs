//! `cargo xtask demo`: the project's main job, the guided tour of the PostgreSQL lock
//! manager (`crates/locks-postgres/examples/demo.rs`) against a real server.
//!
//! With `LOCKS_DATABASE_URL` set it uses that server; otherwise it starts a throwaway
//! PostgreSQL for the run and stops it afterwards.

use crate::cargo_on_database;
use crate::pg::with_database;

const HELP: &str = "\
usage: cargo xtask demo

Runs the lock demo: two instances contending on one key, a bounded wait timing out,
a process holding a lock killed with SIGKILL, a dropped wait leaving nothing behind,
a semaphore of two permits among three instances and a leader replaced by its standby.
Uses the server in LOCKS_DATABASE_URL, or a throwaway PostgreSQL when it is not set.
";

/// Runs the demo.
pub(crate) fn run(args: &[String]) -> crate::Result {
    match args.first().map(String::as_str) {
        None => {}
        Some("-h" | "--help") => {
            print!("{HELP}");
            return Ok(());
        }
        Some(other) => return Err(format!("unexpected argument `{other}`\n\n{HELP}").into()),
    }
    with_database(|url| {
        let args = [
            "run",
            "--quiet",
            "--package",
            "locks-postgres",
            "--example",
            "demo",
        ];
        if cargo_on_database(url, args)? {
            Ok(())
        } else {
            Err("the demo failed".into())
        }
    })
}
