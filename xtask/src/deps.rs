//! What the tests need beyond Rust and PostgreSQL, installed by `scripts/install-test-deps.sh`.
//!
//! Today that is PgBouncer, for the tests of transaction-scoped locks behind a
//! transaction-pooling proxy. The tests never skip when it is missing (they fail saying what
//! to install), so `cargo xtask test` installs it first.

use std::path::Path;
use std::process::Command;

use crate::workspace_root;

/// The environment variable naming the `pgbouncer` binary, as throwaway-pg reads it.
const PGBOUNCER_ENV: &str = "THROWAWAY_PGBOUNCER";
/// Where Debian's package puts it, outside an ordinary user's `PATH`.
const DEBIAN_PGBOUNCER: &str = "/usr/sbin/pgbouncer";
const SCRIPT: &str = "scripts/install-test-deps.sh";

/// Runs the install script when no `pgbouncer` is found; quiet when there is one.
pub(crate) fn ensure_test_deps() -> crate::Result {
    if pgbouncer_installed() {
        return Ok(());
    }
    let script = workspace_root().join(SCRIPT);
    eprintln!("xtask: no pgbouncer found; running {SCRIPT}");
    let status = Command::new("bash")
        .arg(&script)
        .status()
        .map_err(|error| format!("could not run {}: {error}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{SCRIPT} failed ({status}); install PgBouncer (`apt-get install pgbouncer`) \
             or set {PGBOUNCER_ENV} to its path"
        )
        .into())
    }
}

fn pgbouncer_installed() -> bool {
    if let Some(path) = std::env::var_os(PGBOUNCER_ENV).filter(|path| !path.is_empty()) {
        return Path::new(&path).is_file();
    }
    Path::new(DEBIAN_PGBOUNCER).is_file()
        || std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .any(|dir| dir.join("pgbouncer").is_file())
}
