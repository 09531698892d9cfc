//! A detached shell process that removes a cluster when this process ends, however it ends.
//!
//! The watchdog reads one line from a pipe whose only writer is this process. When this
//! process exits (normally, by panic, by Ctrl-C, even by `SIGKILL`) the kernel closes the
//! writing end, the read sees end-of-file, and the watchdog stops the server with
//! `pg_ctl stop -m immediate` and removes the folder. Writing `keep` first disarms it.
//! It runs in its own process group, so the Ctrl-C that ends a test run does not end it too.

use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::Error;
use crate::process::{RunAs, client_env};

/// `$1` is the folder to remove; the rest is the stop command.
const SCRIPT: &str = r#"IFS= read -r line
[ "$line" = keep ] && exit 0
root=$1
shift
"$@" >/dev/null 2>&1
rm -rf -- "$root"
"#;

#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Watchdog {
    pub(crate) fn spawn(
        run_as: RunAs,
        pg_ctl: &Path,
        root: &Path,
        data_dir: &Path,
    ) -> Result<Self, Error> {
        let mut command = Command::new("sh");
        command
            .args(["-c", SCRIPT, "throwaway-pg-watchdog"])
            .arg(root);
        if run_as == RunAs::Postgres {
            command.args(["runuser", "-u", "postgres", "--"]);
        }
        command
            .arg(pg_ctl)
            .arg("-D")
            .arg(data_dir)
            .args(["-m", "immediate", "-w", "stop"]);
        client_env(&mut command);
        command
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .map_err(|source| Error::io("start the clean-up watchdog (`sh`)", source))?;
        let pipe = child.stdin.take();
        Ok(Self { child, pipe })
    }

    /// Tells the watchdog to leave the cluster alone and waits for it to exit.
    pub(crate) fn disarm(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            // If the write fails the watchdog is already gone; nothing to disarm.
            let _ = pipe.write_all(b"keep\n");
        }
        let _ = self.child.wait();
    }
}
