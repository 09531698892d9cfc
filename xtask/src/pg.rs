//! `cargo xtask pg start|status|stop`, and [`with_database`] for the other tasks.
//!
//! `pg start` leaves a throwaway cluster running (no watchdog) and records its folder in
//! `target/xtask/pg-dir`, so `pg status` and `pg stop` find it without being told.

use std::fs;
use std::path::{Path, PathBuf};

use throwaway_pg::ThrowawayPostgres;

pub(crate) use throwaway_pg::DATABASE_URL_ENV;

const HELP: &str = "\
usage: cargo xtask pg <start | status [dir] | stop [dir]>

  start          start a throwaway PostgreSQL and leave it running; prints its URL and folder
  status [dir]   whether the cluster started by `pg start` (or the one in <dir>) is running:
                 prints `running: <url>` (exit 0) or `not running` (exit 3, as `pg_ctl status`),
                 also after `pg stop` or when nothing was started
  stop [dir]     stop that cluster and remove its folder
";

/// Runs `pg` with its arguments.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["start"] => start(),
        ["status"] => status(recorded_dir().ok().as_deref()),
        ["status", dir] => status(Some(Path::new(dir))),
        ["stop"] => stop(&recorded_dir()?),
        ["stop", dir] => stop(Path::new(dir)),
        [] | ["help" | "-h" | "--help"] => {
            print!("{HELP}");
            Ok(())
        }
        _ => Err(format!("unexpected arguments `{}`\n\n{HELP}", args.join(" ")).into()),
    }
}

/// Runs `task` with a database URL: `$LOCKS_DATABASE_URL` when set, otherwise that of a
/// throwaway cluster started here and stopped (folder removed) when `task` returns, fails,
/// or panics, and by its watchdog if this process is killed (Ctrl-C). Says which it used.
pub(crate) fn with_database<T>(task: impl FnOnce(&str) -> crate::Result<T>) -> crate::Result<T> {
    if let Ok(url) = std::env::var(DATABASE_URL_ENV)
        && !url.trim().is_empty()
    {
        eprintln!(
            "xtask: using the PostgreSQL server in {DATABASE_URL_ENV}: {}",
            redact(&url)
        );
        return task(&url);
    }
    eprintln!("xtask: {DATABASE_URL_ENV} is not set; starting a throwaway PostgreSQL");
    let pg = ThrowawayPostgres::start()?;
    eprintln!(
        "xtask: using a throwaway PostgreSQL at {} (binaries {}, folder {}); it is stopped when this task ends",
        pg.url(),
        pg.bin_dir().display(),
        pg.dir().display()
    );
    let result = task(&pg.url());
    let stopped = pg.destroy();
    match &stopped {
        Ok(()) => eprintln!("xtask: stopped the throwaway PostgreSQL and removed its folder"),
        Err(error) => {
            eprintln!("xtask: warning: could not clean up the throwaway PostgreSQL: {error}")
        }
    }
    let value = result?;
    stopped?;
    Ok(value)
}

fn start() -> crate::Result {
    if let Ok(dir) = recorded_dir()
        && let Ok(pg) = ThrowawayPostgres::attach(&dir)
    {
        let running = pg.is_running();
        let url = pg.url();
        pg.detach();
        if running {
            println!("already running: {url}");
            println!("folder:          {}", dir.display());
            println!("stop it with:    cargo xtask pg stop");
            return Ok(());
        }
    }
    let pg = ThrowawayPostgres::builder().watchdog(false).start()?;
    let url = pg.url();
    let data_dir = pg.data_dir();
    let log_file = pg.log_file();
    let dir = pg.detach();
    record_dir(&dir)?;
    println!("started:      {url}");
    println!("folder:       {}", dir.display());
    println!("data dir:     {}", data_dir.display());
    println!("server log:   {}", log_file.display());
    println!("stop it with: cargo xtask pg stop");
    println!();
    println!("export {DATABASE_URL_ENV}={url}");
    Ok(())
}

/// The exit code of `pg status` when no cluster runs (`pg_ctl status` uses 3 too).
const NOT_RUNNING_EXIT_CODE: i32 = 3;

fn status(dir: Option<&Path>) -> crate::Result {
    match running_url(dir)? {
        Some(url) => {
            println!(
                "running: {url} (folder {})",
                dir.unwrap_or(Path::new("")).display()
            );
            Ok(())
        }
        None => {
            match dir {
                Some(dir) => println!("not running (folder {})", dir.display()),
                None => println!("not running (no server recorded by `cargo xtask pg start`)"),
            }
            std::process::exit(NOT_RUNNING_EXIT_CODE)
        }
    }
}

/// The URL of the cluster in `dir` if it runs; `None` when nothing was recorded, the
/// folder is gone (after `pg stop`) or the server is down.
fn running_url(dir: Option<&Path>) -> crate::Result<Option<String>> {
    let Some(dir) = dir.filter(|dir| dir.exists()) else {
        return Ok(None);
    };
    let pg = ThrowawayPostgres::attach(dir)?;
    let running = pg.is_running();
    let url = pg.url();
    pg.detach();
    Ok(running.then_some(url))
}

fn stop(dir: &Path) -> crate::Result {
    let pg = ThrowawayPostgres::attach(dir)?;
    let url = pg.url();
    let root = pg.dir().to_path_buf();
    pg.destroy()?;
    if recorded_dir().is_ok_and(|recorded| recorded == root) {
        let _ = fs::remove_file(state_file());
    }
    println!("stopped {url} and removed {}", root.display());
    Ok(())
}

/// Where `pg start` records the folder of the cluster it left running.
fn state_file() -> PathBuf {
    crate::workspace_root()
        .join("target")
        .join("xtask")
        .join("pg-dir")
}

fn record_dir(dir: &Path) -> crate::Result {
    let file = state_file();
    if let Some(parent) = file.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(&file, dir.as_os_str().as_encoded_bytes())
        .map_err(|error| format!("could not write {}: {error}", file.display()).into())
}

fn recorded_dir() -> crate::Result<PathBuf> {
    let file = state_file();
    match fs::read_to_string(&file) {
        Ok(dir) if !dir.trim().is_empty() => Ok(PathBuf::from(dir.trim())),
        _ => Err("no server recorded by `cargo xtask pg start`; give its folder".into()),
    }
}

/// The URL with any password replaced by `***`, for printing.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // A `key=value` connection string.
        return url
            .split(' ')
            .map(|part| match part.split_once('=') {
                Some(("password", _)) => "password=***",
                _ => part,
            })
            .collect::<Vec<_>>()
            .join(" ");
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_after_stop_is_not_running() {
        assert_eq!(running_url(None).unwrap(), None);
        let gone = std::env::temp_dir().join("xtask-pg-status-no-such-folder");
        assert!(!gone.exists());
        assert_eq!(running_url(Some(&gone)).unwrap(), None);
    }

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact("postgres://app:s3cr3t@db.example:5432/locks"),
            "postgres://app:***@db.example:5432/locks"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres"
        );
        assert_eq!(
            redact("host=/tmp user=app password=s3cr3t"),
            "host=/tmp user=app password=***"
        );
    }
}
