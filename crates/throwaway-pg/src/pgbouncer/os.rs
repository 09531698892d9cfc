//! Processes, users and folders: finding pgbouncer, running it unprivileged, cleaning up.

use std::fs;
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::io_error;
use super::{DEBIAN_BINARY, PGBOUNCER_ENV, PgBouncerError};

/// `$THROWAWAY_PGBOUNCER`, else `pgbouncer` on the `PATH`, else Debian's `/usr/sbin/pgbouncer`.
pub(super) fn find_binary() -> Result<PathBuf, PgBouncerError> {
    let mut looked_in = Vec::new();
    if let Some(path) = std::env::var_os(PGBOUNCER_ENV).filter(|path| !path.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        looked_in.push(format!("{PGBOUNCER_ENV}={}", path.display()));
    }
    if let Some(path) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("pgbouncer"))
        .find(|path| path.is_file())
    {
        return Ok(path);
    }
    looked_in.push("PATH".to_owned());
    let debian = PathBuf::from(DEBIAN_BINARY);
    if debian.is_file() {
        return Ok(debian);
    }
    looked_in.push(DEBIAN_BINARY.to_owned());
    Err(PgBouncerError::NotInstalled { looked_in })
}

/// The user PgBouncer runs as: this process's, or `postgres` when this process is root.
#[derive(Debug, Clone, Copy)]
pub(super) enum Identity {
    CurrentUser,
    Unprivileged { uid: u32, gid: u32 },
}

impl Identity {
    pub(super) fn detect() -> Result<Self, PgBouncerError> {
        if id(&["-u"]) != Some(0) {
            return Ok(Self::CurrentUser);
        }
        match (id(&["-u", "postgres"]), id(&["-g", "postgres"])) {
            (Some(uid), Some(gid)) => Ok(Self::Unprivileged { uid, gid }),
            _ => Err(PgBouncerError::NoUnprivilegedUser),
        }
    }

    /// Makes `command` run as this identity (std drops root's supplementary groups too).
    pub(super) fn apply(self, command: &mut Command) {
        if let Self::Unprivileged { uid, gid } = self {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid);
        }
    }

    /// Hands the folder and its files to this identity.
    pub(super) fn give(self, root: &Path) -> Result<(), PgBouncerError> {
        if let Self::Unprivileged { uid, gid } = self {
            let mut paths = vec![root.to_path_buf()];
            let entries = fs::read_dir(root)
                .map_err(|source| io_error(format!("list {}", root.display()), source))?;
            paths.extend(entries.filter_map(Result::ok).map(|entry| entry.path()));
            for path in paths {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .map_err(|source| io_error(format!("chown {}", path.display()), source))?;
            }
        }
        Ok(())
    }
}

/// `id <args>` as a number.
fn id(args: &[&str]) -> Option<u32> {
    let output = Command::new("id")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8(output.stdout).ok()?.trim().parse().ok()
}

/// A new folder under the temporary folder, readable only by its owner.
pub(super) fn create_dir() -> Result<PathBuf, PgBouncerError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "throwaway-pgbouncer.{}.{}.{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut builder = fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        match builder.create(&path) {
            Ok(()) => return Ok(path),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io_error(format!("create folder {}", path.display()), error)),
        }
    }
}

/// A port that was free a moment ago.
pub(super) fn free_port() -> Result<u16, PgBouncerError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|source| io_error("find a free TCP port on 127.0.0.1", source))
}

/// A detached `sh` that kills PgBouncer and removes its folder if this process ends without
/// dropping the [`PgBouncer`]: it reads a pipe only this process writes to, so it sees
/// end-of-file when this process exits, however it exits. `done` disarms it.
#[derive(Debug)]
pub(super) struct Watchdog {
    child: Child,
    pipe: Option<ChildStdin>,
}

/// `$1` is the folder; each line read before end-of-file names a pid to kill.
const WATCHDOG_SCRIPT: &str = r#"pid=
while IFS= read -r line; do
    [ "$line" = done ] && exit 0
    pid=$line
done
[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
rm -rf -- "$1"
"#;

impl Watchdog {
    pub(super) fn spawn(root: &Path) -> Result<Self, PgBouncerError> {
        let mut command = Command::new("sh");
        command
            .args(["-c", WATCHDOG_SCRIPT, "throwaway-pgbouncer-watchdog"])
            .arg(root)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .map_err(|source| io_error("start the clean-up watchdog (`sh`)", source))?;
        let pipe = child.stdin.take();
        Ok(Self { child, pipe })
    }

    /// Tells the watchdog which process to kill.
    pub(super) fn watch(&mut self, pid: u32) {
        if let Some(pipe) = &mut self.pipe {
            // If the write fails the watchdog is gone; nothing more can be done.
            let _ = writeln!(pipe, "{pid}");
        }
    }

    /// Tells the watchdog to leave everything alone (this process cleans up) and waits for it.
    pub(super) fn disarm(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(b"done\n");
        }
        let _ = self.child.wait();
    }
}
