use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

/// Why a throwaway PostgreSQL cluster could not be found, started, stopped or adopted.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No folder with the PostgreSQL server binaries (`initdb`, `pg_ctl`, `postgres`) was found.
    /// Install PostgreSQL, or name the folder in `THROWAWAY_PG_BINDIR`.
    NotInstalled {
        /// The places that were searched, in order.
        looked_in: Vec<String>,
    },
    /// [`PatroniCluster`](crate::PatroniCluster) needs Patroni and etcd, and these were
    /// not found on `PATH` nor in `/usr/bin`.
    HaNotInstalled {
        /// The programs missing (`etcd`, `patroni`, `patronictl`).
        missing: Vec<String>,
    },
    /// The process runs as root, which PostgreSQL refuses, and there is no `postgres` user to
    /// run the server as.
    NoPostgresUser,
    /// A setting given to [`Builder::setting`](crate::Builder::setting) cannot be written to
    /// `postgresql.conf`.
    InvalidSetting {
        /// The setting's name as given.
        name: String,
        /// The setting's value as given.
        value: String,
    },
    /// [`ThrowawayPostgres::attach`](crate::ThrowawayPostgres::attach) was given a folder that
    /// this crate did not create (it has no marker file); it is left untouched.
    NotAThrowawayCluster {
        /// The folder given.
        dir: PathBuf,
    },
    /// A file-system or process-spawning operation failed.
    Io {
        /// What was being done, e.g. "create folder /tmp/…".
        action: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// A PostgreSQL tool (or `runuser`, `chown`) ran but reported failure.
    Command {
        /// The command line, for the reader.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// Its standard output and error, and for a failed start the end of the server log.
        output: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled { looked_in } => write!(
                f,
                "the PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found \
                 (looked in: {}); install PostgreSQL, e.g. `apt-get install postgresql` \
                 (Debian, Ubuntu), `dnf install postgresql-server` (Fedora) or \
                 `brew install postgresql` (macOS), or set THROWAWAY_PG_BINDIR to the folder \
                 that holds initdb",
                looked_in.join(", ")
            ),
            Self::HaNotInstalled { missing } => write!(
                f,
                "{} not found; install Debian's `patroni` and `etcd-server` packages \
                 (`scripts/install-test-deps.sh --ha` does, as root)",
                missing.join(", ")
            ),
            Self::NoPostgresUser => f.write_str(
                "running as root, which PostgreSQL refuses, and there is no `postgres` user to \
                 run the server as; install PostgreSQL from your distribution's packages (they \
                 create that user) or run as an ordinary user",
            ),
            Self::InvalidSetting { name, value } => write!(
                f,
                "invalid PostgreSQL setting `{name} = {value}`: a name is ASCII letters, digits, \
                 `_` and `.`; a value is one non-empty line"
            ),
            Self::NotAThrowawayCluster { dir } => write!(
                f,
                "`{}` is not a folder made by throwaway-pg (it has no `{}` file); left untouched",
                dir.display(),
                crate::cluster::MARKER_FILE
            ),
            Self::Io { action, source } => write!(f, "could not {action}: {source}"),
            Self::Command {
                command,
                status,
                output,
            } => {
                write!(f, "`{command}` failed ({status})")?;
                let output = output.trim_end();
                if output.is_empty() {
                    Ok(())
                } else {
                    write!(f, ":\n{output}")
                }
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl Error {
    pub(crate) fn io(action: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            action: action.into(),
            source,
        }
    }
}
