//! Why a throwaway PgBouncer could not be started.

use std::fmt;
use std::io;

use super::{HOST, PGBOUNCER_ENV, START_TIMEOUT};

/// Why a throwaway PgBouncer could not be started.
#[derive(Debug)]
#[non_exhaustive]
pub enum PgBouncerError {
    /// No `pgbouncer` binary was found. Install PgBouncer (`apt-get install pgbouncer`;
    /// `scripts/install-test-deps.sh` does it), or name the binary in `THROWAWAY_PGBOUNCER`.
    NotInstalled {
        /// The places that were searched, in order.
        looked_in: Vec<String>,
    },
    /// The server URL is not one this launcher can put behind PgBouncer.
    InvalidUrl {
        /// What is wrong with it (the URL itself is left out: it may hold a password).
        reason: String,
    },
    /// A setting given to [`PgBouncerBuilder::setting`](crate::PgBouncerBuilder::setting) cannot be written to the config.
    InvalidSetting {
        /// The setting's name as given.
        name: String,
        /// The setting's value as given.
        value: String,
    },
    /// Running as root, with no `postgres` user to run PgBouncer as (it refuses root).
    NoUnprivilegedUser,
    /// PgBouncer exited while starting.
    Exited {
        /// How it exited.
        status: String,
        /// The end of its log and standard error.
        log: String,
    },
    /// PgBouncer did not listen on its port in time.
    NotListening {
        /// The port it was told to listen on.
        port: u16,
        /// The end of its log and standard error.
        log: String,
    },
    /// A file-system or process-spawning operation failed.
    Io {
        /// What was being done.
        action: String,
        /// The operating system's error.
        source: io::Error,
    },
}

impl fmt::Display for PgBouncerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled { looked_in } => write!(
                f,
                "pgbouncer was not found (looked in: {}); install PgBouncer: \
                 `apt-get install pgbouncer` (Debian, Ubuntu; `scripts/install-test-deps.sh` \
                 does it and `cargo xtask test` runs that), `dnf install pgbouncer` (Fedora), \
                 `brew install pgbouncer` (macOS), or set {PGBOUNCER_ENV} to the binary",
                looked_in.join(", ")
            ),
            Self::InvalidUrl { reason } => write!(
                f,
                "cannot put PgBouncer in front of the server URL: {reason}"
            ),
            Self::InvalidSetting { name, value } => write!(
                f,
                "invalid PgBouncer setting `{name} = {value}`: a name is ASCII letters, digits \
                 and `_`; a value is one non-empty line"
            ),
            Self::NoUnprivilegedUser => f.write_str(
                "running as root, which PgBouncer refuses, and there is no `postgres` user to \
                 run it as",
            ),
            Self::Exited { status, log } => {
                write!(
                    f,
                    "pgbouncer exited while starting ({status}):\n{}",
                    log.trim_end()
                )
            }
            Self::NotListening { port, log } => write!(
                f,
                "pgbouncer did not listen on {HOST}:{port} within {}s:\n{}",
                START_TIMEOUT.as_secs(),
                log.trim_end()
            ),
            Self::Io { action, source } => write!(f, "could not {action}: {source}"),
        }
    }
}

impl std::error::Error for PgBouncerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub(super) fn io_error(action: impl Into<String>, source: io::Error) -> PgBouncerError {
    PgBouncerError::Io {
        action: action.into(),
        source,
    }
}
