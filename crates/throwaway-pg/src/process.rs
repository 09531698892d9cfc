//! Running PostgreSQL tools, as the `postgres` user when this process is root.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::Error;

/// Environment variables that would steer the PostgreSQL tools somewhere else.
const PG_ENV: &[&str] = &[
    "PGDATA",
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGDATABASE",
    "PGOPTIONS",
    "PGSERVICE",
    "PGPASSWORD",
];

/// Whose identity server binaries run under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunAs {
    /// This process's user (not root).
    CurrentUser,
    /// The `postgres` user, through `runuser`; this process is root.
    Postgres,
}

impl RunAs {
    pub(crate) fn detect() -> Result<Self, Error> {
        if !is_root() {
            return Ok(Self::CurrentUser);
        }
        let postgres_exists = Command::new("id")
            .args(["-u", "postgres"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if postgres_exists {
            Ok(Self::Postgres)
        } else {
            Err(Error::NoPostgresUser)
        }
    }

    /// A command that runs `program` as this identity, with a clean PostgreSQL environment,
    /// no standard input, and `cwd` as working folder (the `postgres` user may not be able
    /// to enter ours).
    pub(crate) fn command(self, program: &Path, cwd: &Path) -> Command {
        let mut command = match self {
            Self::CurrentUser => Command::new(program),
            Self::Postgres => {
                let mut command = Command::new("runuser");
                command.args(["-u", "postgres", "--"]).arg(program);
                command
            }
        };
        client_env(&mut command);
        command.current_dir(cwd).stdin(Stdio::null());
        command
    }

    /// Hands `path` (and what is in it) to the user the server runs as.
    pub(crate) fn give(self, path: &Path) -> Result<(), Error> {
        match self {
            Self::CurrentUser => Ok(()),
            Self::Postgres => {
                let mut command = Command::new("chown");
                command
                    .args(["-R", "postgres:"])
                    .arg(path)
                    .stdin(Stdio::null());
                run(&mut command).map(drop)
            }
        }
    }
}

/// Removes the variables that would point the tools at another server or folder.
pub(crate) fn client_env(command: &mut Command) {
    for name in PG_ENV {
        command.env_remove(name);
    }
}

/// Runs the command to completion; fails with its output unless it exits with success.
pub(crate) fn run(command: &mut Command) -> Result<Output, Error> {
    let output = command
        .output()
        .map_err(|source| Error::io(format!("run `{}`", display(command)), source))?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(Error::Command {
            command: display(command),
            status: output.status,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// The command line, space-separated, for messages.
pub(crate) fn display(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether this process runs as root: the effective uid from `/proc/self/status`, else `id -u`.
pub(crate) fn is_root() -> bool {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(uid) = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().nth(1))
    {
        return uid == "0";
    }
    Command::new("id")
        .arg("-u")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|output| output.stdout.trim_ascii() == b"0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_of_a_command_shows_its_arguments() {
        let mut command = Command::new("pg_ctl");
        command.args(["-D", "/tmp/x", "start"]);
        assert_eq!(display(&command), "pg_ctl -D /tmp/x start");
    }
}
