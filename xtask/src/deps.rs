//! What the tests need beyond Rust and PostgreSQL, installed by `scripts/install-test-deps.sh`.
//!
//! Today that is PgBouncer, for the tests of transaction-scoped locks behind a
//! transaction-pooling proxy, iproute2 (`ip`), for the partition test and the soak's
//! partitions, and libfaketime (`faketime`), for pglock's test of skewed host clocks. The tests never skip when one is missing (they fail saying what to install),
//! so `cargo xtask test` installs them first.

use std::path::Path;
use std::process::Command;

use crate::workspace_root;

/// The environment variable naming the `pgbouncer` binary, as throwaway-pg reads it.
const PGBOUNCER_ENV: &str = "THROWAWAY_PGBOUNCER";
/// Where Debian's package puts it, outside an ordinary user's `PATH`.
const DEBIAN_PGBOUNCER: &str = "/usr/sbin/pgbouncer";
const SCRIPT: &str = "scripts/install-test-deps.sh";

/// Runs the install script when no `pgbouncer` or no `ip` is found; quiet when both are.
pub(crate) fn ensure_test_deps() -> crate::Result {
    if pgbouncer_installed() && on_path("ip") && on_path("faketime") {
        return Ok(());
    }
    run_install_script("pgbouncer, ip or faketime missing")
}

/// Runs the install script (which installs whatever of PgBouncer, iproute2, libfaketime
/// and man-db is missing), saying `why` first.
pub(crate) fn run_install_script(why: &str) -> crate::Result {
    eprintln!("xtask: {why}; running {SCRIPT}");
    install(
        &[],
        &format!(
            "install PgBouncer, iproute2, libfaketime and man-db (`apt-get install pgbouncer \
             iproute2 faketime man-db`), or set {PGBOUNCER_ENV} to PgBouncer's path"
        ),
    )
}

/// Runs the install script with `args`; on failure, says so with `advice`.
fn install(args: &[&str], advice: &str) -> crate::Result {
    let script = workspace_root().join(SCRIPT);
    let status = Command::new("bash")
        .arg(&script)
        .args(args)
        .status()
        .map_err(|error| format!("could not run {}: {error}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{SCRIPT} {} failed ({status}); {advice}", args.join(" ")).into())
    }
}

fn pgbouncer_installed() -> bool {
    if let Some(path) = std::env::var_os(PGBOUNCER_ENV).filter(|path| !path.is_empty()) {
        return Path::new(&path).is_file();
    }
    Path::new(DEBIAN_PGBOUNCER).is_file() || on_path("pgbouncer")
}

/// Whether `program` is in a folder of `PATH` or of root's usual `sbin` folders.
pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|dir| dir.join(program).is_file())
}

/// Runs the install script with `--ha` when Patroni, etcd or curl is missing.
pub(crate) fn ensure_ha_deps() -> crate::Result {
    if ["patroni", "patronictl", "etcd", "curl"]
        .into_iter()
        .all(on_path)
    {
        return Ok(());
    }
    eprintln!("xtask: patroni, etcd or curl missing; running {SCRIPT} --ha");
    install(
        &["--ha"],
        "install Patroni, etcd and curl (`apt-get install patroni etcd-server curl`)",
    )
}
