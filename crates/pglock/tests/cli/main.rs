//! `pglock` as a user runs it: the built binary in real processes, on real PostgreSQL
//! (`LOCKS_DATABASE_URL`, or a throwaway cluster started for this test process).

mod break_lock;
mod capacity;
mod errors;
mod generate;
mod group;
mod inspect;
mod leader;
mod lost;
mod once_per;
mod operator;
mod permits;
mod run;
mod shards;
mod skewed;
mod supervisor;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use locks_postgres::tokio_postgres;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use throwaway_pg::testing::{admin, database_url};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Generous bound for things that happen "at once" on a loaded machine.
const SOON: Duration = Duration::from_secs(30);

/// `pglock --url <test server>`, with no connection settings from the environment.
fn pglock() -> Command {
    pglock_under(&[])
}

/// [`pglock`] started by `wrapper` (a program and its arguments, pglock's path and
/// arguments appended), e.g. a shell that ignores signals before it execs pglock.
fn pglock_under(wrapper: &[&str]) -> Command {
    let binary = env!("CARGO_BIN_EXE_pglock");
    let mut command = match wrapper {
        [] => Command::new(binary),
        [program, args @ ..] => {
            let mut command = Command::new(program);
            command.args(args).arg(binary);
            command
        }
    };
    for name in [
        "DATABASE_URL",
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGPASSWORD",
        "PGDATABASE",
        "PGAPPNAME",
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGCONNECT_TIMEOUT",
        "PGLOCK_LOG",
        "PGPASSFILE",
    ] {
        command.env_remove(name);
    }
    command
        .arg("--url")
        .arg(database_url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn output(command: &mut Command) -> Output {
    tokio::time::timeout(SOON, command.output())
        .await
        .expect("pglock finished in time")
        .expect("pglock ran")
}

fn code(output: &Output) -> i32 {
    output
        .status
        .code()
        .unwrap_or_else(|| panic!("no exit code: {output:?}"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A key and a scratch folder no other test uses; the folder goes when the [`Scratch`] is
/// dropped, so keep it bound (`_dir`, not `_`) until the test's children are gone.
fn unique(name: &str) -> (String, Scratch) {
    let tag = throwaway_pg::testing::unique(name);
    let dir = std::env::temp_dir().join(format!("pglock-test-{tag}"));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    (format!("pglock-test:{tag}"), Scratch(dir))
}

/// A test's scratch folder, removed with everything in it on drop.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Scratch {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.0) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                // A test that passed must leave nothing behind; one already failing has said why.
                assert!(
                    std::thread::panicking(),
                    "remove {}: {error}",
                    self.0.display()
                );
            }
            _ => {}
        }
    }
}

/// `(pid, granted)` of every session holding or waiting for the advisory lock `lock_id`.
async fn lock_rows(admin: &tokio_postgres::Client, lock_id: i64) -> Vec<(i32, bool)> {
    throwaway_pg::testing::advisory_lock(admin, lock_id)
        .await
        .into_iter()
        .map(|row| (row.pid, row.granted))
        .collect()
}

/// A plain session (as a Python eventsource process would be) holding `lock_id`, and its pid.
async fn foreign_holder(lock_id: i64) -> (tokio_postgres::Client, i32) {
    let foreign = admin().await;
    foreign
        .execute("SELECT pg_advisory_lock($1)", &[&lock_id])
        .await
        .expect("foreign lock");
    let pid: i32 = foreign
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    (foreign, pid)
}

async fn release_foreign(foreign: &tokio_postgres::Client, lock_id: i64) {
    foreign
        .execute("SELECT pg_advisory_unlock($1)", &[&lock_id])
        .await
        .expect("foreign unlock");
}

/// A plain session holding the lock on `key`, its pid, and `pglock run KEY -- true` waiting
/// in the server's queue behind it.
async fn held_and_awaited(key: &str) -> (tokio_postgres::Client, i32, Child) {
    let lock_id = locks_port::lock_id(key);
    let (foreign, foreign_pid) = foreign_holder(lock_id).await;
    let waiter = pglock()
        .args(["run", key, "--", "true"])
        .spawn()
        .expect("spawn");
    wait_for_a_waiter(&admin().await, lock_id).await;
    (foreign, foreign_pid, waiter)
}

/// Waits until some session waits in the server's queue for `lock_id`.
async fn wait_for_a_waiter(observer: &tokio_postgres::Client, lock_id: i64) {
    eventually("a session waiting in the server's queue", || async {
        lock_rows(observer, lock_id)
            .await
            .iter()
            .any(|(_, granted)| !granted)
    })
    .await;
}

/// Polls `check` until it is true, failing after [`SOON`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + SOON;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_file(path: &Path) {
    eventually(&format!("{}", path.display()), || async { path.exists() }).await;
}

async fn finish(child: Child) -> Output {
    tokio::time::timeout(SOON, child.wait_with_output())
        .await
        .expect("pglock finished in time")
        .expect("pglock ran")
}

fn signal(child: &Child, signal: Signal) {
    let pid = i32::try_from(child.id().expect("running")).expect("pid");
    kill(Pid::from_raw(pid), signal).expect("signal sent");
}

/// An ordinary role (no superuser, no `pg_read_all_stats`) named after `name`, with
/// `password`, created afresh, and a `key=value` URL for it without the password.
async fn ordinary_role(name: &str, password: &str) -> (String, String) {
    use std::str::FromStr;
    let role = format!("pglock_{name}_{}", std::process::id());
    admin()
        .await
        .batch_execute(&format!(
            // Stored as SCRAM, which the tests' pg_hba lines ask for: the default since
            // PostgreSQL 14, md5 on 13.
            "SET password_encryption = 'scram-sha-256'; DROP ROLE IF EXISTS {role}; \
             CREATE ROLE {role} LOGIN PASSWORD '{password}'"
        ))
        .await
        .expect("a role without privileges");
    let config = tokio_postgres::Config::from_str(&database_url()).expect("the test URL");
    let host = match config.get_hosts().first().expect("a host") {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let dbname = config.get_dbname().unwrap_or("postgres");
    (
        role.clone(),
        format!("host={host} port={port} dbname={dbname} user={role}"),
    )
}

/// A pseudo-terminal: its master side (what a user types goes in here) and the terminal.
fn pseudo_terminal() -> (std::fs::File, std::fs::File) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name.to_str().expect("a UTF-8 name"))
        .expect("the terminal");
    (std::fs::File::from(master), terminal)
}
