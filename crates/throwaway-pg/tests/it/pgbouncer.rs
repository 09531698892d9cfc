use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use throwaway_pg::{PgBouncer, PgBouncerError, PoolMode, ThrowawayPostgres, shared_cluster};

use crate::{accepts_connections, eventually};

fn server() -> &'static ThrowawayPostgres {
    shared_cluster().expect("a throwaway PostgreSQL")
}

fn bouncer(mode: PoolMode, pool_size: &str) -> PgBouncer {
    PgBouncer::builder()
        .pool_mode(mode)
        .setting("default_pool_size", pool_size)
        .start(&server().url())
        .unwrap_or_else(|error| panic!("{error}"))
}

fn psql() -> PathBuf {
    server().bin_dir().join("psql")
}

/// `psql -c sql` on `url`: its trimmed output.
fn run_psql(url: &str, sql: &str) -> String {
    let output = Command::new(psql())
        .args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run psql");
    assert!(
        output.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The backend pid a second client gets while a first client stays connected, idle,
/// after asking for its own.
fn pids_of_two_clients(bouncer: &PgBouncer) -> (String, String) {
    let mut first = Command::new(psql())
        .args(["-X", "-A", "-t", "-q", "-d", &bouncer.url()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run psql");
    let mut stdin = first.stdin.take().expect("stdin");
    writeln!(stdin, "select pg_backend_pid();").expect("write to psql");
    let mut line = String::new();
    BufReader::new(first.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read from psql");
    let second = run_psql(&bouncer.url(), "select pg_backend_pid()");
    drop(stdin);
    assert!(first.wait().expect("psql exits").success());
    (line.trim().to_owned(), second)
}

#[test]
fn transaction_mode_shares_one_server_session_between_idle_clients() {
    let bouncer = bouncer(PoolMode::Transaction, "1");
    assert_eq!(bouncer.pool_mode(), PoolMode::Transaction);
    assert_eq!(
        bouncer.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", bouncer.port())
    );
    assert_eq!(run_psql(&bouncer.url(), "select 1"), "1");
    let config = run_psql(&bouncer.admin_url(), "SHOW CONFIG");
    assert!(
        config
            .lines()
            .any(|line| line.starts_with("pool_mode|transaction|")),
        "{config}"
    );
    // One server session, and the first client still connected: only transaction pooling
    // lets the second client run, on that same session.
    let (first, second) = pids_of_two_clients(&bouncer);
    assert!(!first.is_empty());
    assert_eq!(first, second);
}

#[test]
fn session_mode_keeps_a_server_session_per_client() {
    let bouncer = bouncer(PoolMode::Session, "5");
    let (first, second) = pids_of_two_clients(&bouncer);
    assert!(!first.is_empty());
    assert_ne!(first, second);
}

#[test]
fn dropping_it_stops_pgbouncer_and_removes_its_folder() {
    let mut bouncer = bouncer(PoolMode::Transaction, "2");
    let port = bouncer.port();
    let dir = bouncer.dir().to_path_buf();
    assert!(bouncer.is_running());
    assert!(bouncer.log_file().is_file());
    drop(bouncer);
    assert!(!dir.exists(), "{} is left behind", dir.display());
    assert!(
        eventually(Duration::from_secs(5), || !accepts_connections(port)),
        "pgbouncer still listens on {port}"
    );
}

#[test]
fn a_missing_pgbouncer_says_what_to_install() {
    let error = PgBouncer::builder()
        .binary("/nonexistent/pgbouncer")
        .start(&server().url())
        .expect_err("no such binary");
    assert!(matches!(error, PgBouncerError::NotInstalled { .. }));
    assert!(
        error.to_string().contains("apt-get install pgbouncer"),
        "{error}"
    );
}

const CHILD_ENV: &str = "THROWAWAY_PGBOUNCER_WATCHDOG_CHILD";
const WATCHDOG_TEST: &str = "pgbouncer::a_pgbouncer_never_dropped_is_killed_when_the_process_exits";

#[test]
fn a_pgbouncer_never_dropped_is_killed_when_the_process_exits() {
    if std::env::var_os(CHILD_ENV).is_some() {
        // Child role: start one, say where it is, and exit without dropping it.
        let bouncer = bouncer(PoolMode::Transaction, "1");
        println!("port={} dir={}", bouncer.port(), bouncer.dir().display());
        std::mem::forget(bouncer);
        return;
    }
    let child = Command::new(std::env::current_exe().unwrap())
        .args([WATCHDOG_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .output()
        .expect("run this test binary as the child");
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "the child test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|line| line.find("port=").map(|at| &line[at..]))
        .expect("the child reports its pgbouncer");
    let (port, dir) = line
        .strip_prefix("port=")
        .and_then(|rest| rest.split_once(" dir="))
        .unwrap();
    let port: u16 = port.parse().unwrap();
    let dir = PathBuf::from(dir);
    assert!(
        eventually(Duration::from_secs(20), || !accepts_connections(port)),
        "pgbouncer on port {port} outlived its process"
    );
    assert!(
        eventually(Duration::from_secs(20), || !dir.exists()),
        "the watchdog did not remove {}",
        dir.display()
    );
}
