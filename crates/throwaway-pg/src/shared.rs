//! One cluster per process, for test suites.

use std::sync::{Mutex, OnceLock, PoisonError};

use crate::{Error, ThrowawayPostgres};

/// The environment variable that names an existing server; when it is set (and not empty),
/// [`database_url`] returns it and starts nothing.
pub const DATABASE_URL_ENV: &str = "LOCKS_DATABASE_URL";

static SHARED: OnceLock<ThrowawayPostgres> = OnceLock::new();
static STARTING: Mutex<()> = Mutex::new(());

/// The URL tests should connect to: `$LOCKS_DATABASE_URL` when set, otherwise the URL of
/// this process's [`shared_cluster`], started on first use.
///
/// So `cargo test` works wherever PostgreSQL is installed, and `cargo xtask test` (which
/// sets the variable) runs every test binary against one server. Where neither is possible
/// the error says what to install.
pub fn database_url() -> Result<String, Error> {
    match std::env::var(DATABASE_URL_ENV) {
        Ok(url) if !url.trim().is_empty() => Ok(url),
        _ => shared_cluster().map(ThrowawayPostgres::url),
    }
}

/// This process's shared cluster, started on the first call (later calls wait for it and get
/// the same one; a failed start is retried by the next call). It ignores
/// `$LOCKS_DATABASE_URL`.
///
/// A `static` is never dropped, so this cluster is stopped and its folder removed by its
/// watchdog, a small `sh` process that notices when this process has exited (by any means,
/// including `SIGKILL` and Ctrl-C) and runs `pg_ctl stop -m immediate` and `rm -rf`.
///
/// Every caller shares it: a test that restarts or stops the server should start its own
/// [`ThrowawayPostgres`] instead.
pub fn shared_cluster() -> Result<&'static ThrowawayPostgres, Error> {
    if let Some(pg) = SHARED.get() {
        return Ok(pg);
    }
    let _starting = STARTING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pg) = SHARED.get() {
        return Ok(pg);
    }
    let pg = ThrowawayPostgres::builder().watchdog(true).start()?;
    eprintln!(
        "throwaway-pg: started PostgreSQL at {} (folder {}); it stops when this process exits; \
         set {DATABASE_URL_ENV} to use another server",
        pg.url(),
        pg.dir().display()
    );
    Ok(SHARED.get_or_init(|| pg))
}
