//! The shared cluster is stopped by its watchdog once the process that started it exits.
//!
//! The test runs this same test binary again as a child process that starts the shared
//! cluster, reports its port and folder, and exits without dropping anything.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{accepts_connections, eventually};

const CHILD_ENV: &str = "THROWAWAY_PG_WATCHDOG_CHILD";
const TEST_NAME: &str = "watchdog::the_shared_cluster_is_removed_when_the_process_exits";

#[test]
fn the_shared_cluster_is_removed_when_the_process_exits() {
    if std::env::var_os(CHILD_ENV).is_some() {
        // Child role: start the shared cluster, say where it is, and exit.
        let pg = throwaway_pg::shared_cluster().expect("shared cluster");
        println!("port={} dir={}", pg.port(), pg.dir().display());
        return;
    }

    let child = Command::new(std::env::current_exe().unwrap())
        .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env_remove(throwaway_pg::DATABASE_URL_ENV)
        .stdin(Stdio::null())
        .output()
        .expect("run this test binary as the child");
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "the child test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    // The harness prints the test's name on the same line first.
    let line = stdout
        .lines()
        .find_map(|line| line.find("port=").map(|at| &line[at..]))
        .expect("the child reports its cluster");

    let (port, dir) = line
        .strip_prefix("port=")
        .and_then(|rest| rest.split_once(" dir="))
        .unwrap();
    let port: u16 = port.parse().unwrap();
    let dir = PathBuf::from(dir);

    assert!(
        eventually(Duration::from_secs(20), || !dir.exists()),
        "the watchdog did not remove {}",
        dir.display()
    );
    assert!(
        eventually(Duration::from_secs(20), || !accepts_connections(port)),
        "the server on port {port} outlived its process"
    );
}
