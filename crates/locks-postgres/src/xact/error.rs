//! The error of a transaction lock, in the manager's words.

use std::fmt;
use std::time::Duration;

use locks_port::{AcquisitionErrorKind, LockAcquisitionError, timeout_reason};
use tokio_postgres::error::SqlState;

use crate::errors::{describe, driver_kind};

/// A transaction lock could not be taken.
///
/// The message is the manager's: `Failed to acquire lock '{key}': {reason}`, with the
/// server's own words; the driver error stays reachable through `source()`.
#[derive(Debug)]
#[non_exhaustive]
pub enum TransactionLockError {
    /// The lock stayed busy for the whole timeout. The transaction is usable and its
    /// `lock_timeout` is as before.
    Timeout {
        /// The key.
        key: String,
        /// The timeout of the call.
        timeout: Duration,
    },
    /// The server found this wait in a deadlock (SQLSTATE 40P01) and ended it. The
    /// transaction is usable but still holds what it took before, which the other side waits
    /// for: roll it back (and retry, taking keys in one order).
    Deadlock {
        /// The key.
        key: String,
        /// The server's words (its detail names both processes).
        reason: String,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// The wait was cancelled on the server (`pg_cancel_backend`, SQLSTATE 57014). The
    /// transaction is usable.
    Cancelled {
        /// The key.
        key: String,
        /// The server's words.
        reason: String,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// The key is empty (see [`locks_port::check_key`]); nothing was sent and the
    /// transaction is as before.
    InvalidKey {
        /// The key (empty).
        key: String,
    },
    /// Any other failure: the connection, the transaction's state (an already aborted
    /// transaction), the server. The transaction may be aborted or gone.
    Backend {
        /// The key.
        key: String,
        /// The server's (or driver's) words.
        reason: String,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
}

impl TransactionLockError {
    pub(super) fn from_driver(
        key: &str,
        timeout: Option<Duration>,
        source: tokio_postgres::Error,
    ) -> Self {
        let key = key.to_owned();
        let reason = describe(&source);
        match source.code() {
            Some(code) if *code == SqlState::LOCK_NOT_AVAILABLE => match timeout {
                Some(timeout) => Self::Timeout { key, timeout },
                // Not our lock_timeout (there was none): someone else's.
                None => Self::Backend {
                    key,
                    reason,
                    source,
                },
            },
            Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED => Self::Deadlock {
                key,
                reason,
                source,
            },
            Some(code) if *code == SqlState::QUERY_CANCELED => Self::Cancelled {
                key,
                reason,
                source,
            },
            _ => Self::Backend {
                key,
                reason,
                source,
            },
        }
    }

    /// The key that could not be locked.
    #[must_use]
    pub fn key(&self) -> &str {
        match self {
            Self::Timeout { key, .. }
            | Self::InvalidKey { key }
            | Self::Deadlock { key, .. }
            | Self::Cancelled { key, .. }
            | Self::Backend { key, .. } => key,
        }
    }

    /// Whether the wait timed out.
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// Whether the server ended the wait as a deadlock (40P01).
    #[must_use]
    pub fn is_deadlock(&self) -> bool {
        matches!(self, Self::Deadlock { .. })
    }

    /// The port's kind: `Timeout`, `Cancelled`, `ConnectionLost`, or `Backend` (a deadlock
    /// too: the port has no kind for it; match [`TransactionLockError::Deadlock`]).
    #[must_use]
    pub fn kind(&self) -> AcquisitionErrorKind {
        match self {
            Self::Timeout { .. } => AcquisitionErrorKind::Timeout,
            Self::InvalidKey { .. } => AcquisitionErrorKind::InvalidKey,
            Self::Cancelled { .. } => AcquisitionErrorKind::Cancelled,
            Self::Deadlock { .. } => AcquisitionErrorKind::Backend,
            Self::Backend { source, .. } => match driver_kind(source) {
                AcquisitionErrorKind::Timeout => AcquisitionErrorKind::Backend,
                kind => kind,
            },
        }
    }

    /// The reason part of the message, in the server's words.
    fn reason(&self) -> String {
        match self {
            Self::Timeout { timeout, .. } => timeout_reason(*timeout),
            Self::InvalidKey { key } => locks_port::check_key(key)
                .err()
                .map(|error| error.reason().to_owned())
                .unwrap_or_default(),
            Self::Deadlock { reason, .. } => format!("deadlock detected: {reason}"),
            Self::Cancelled { reason, .. } => format!("cancelled: {reason}"),
            Self::Backend { reason, .. } => format!("Database error: {reason}"),
        }
    }

    pub(super) fn source_error(&self) -> Option<&tokio_postgres::Error> {
        match self {
            Self::Timeout { .. } | Self::InvalidKey { .. } => None,
            Self::Deadlock { source, .. }
            | Self::Cancelled { source, .. }
            | Self::Backend { source, .. } => Some(source),
        }
    }
}

impl fmt::Display for TransactionLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Failed to acquire lock '{}': {}",
            self.key(),
            self.reason()
        )
    }
}

impl std::error::Error for TransactionLockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source_error()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}

impl From<TransactionLockError> for LockAcquisitionError {
    /// The port's error, with the same message, kind and source.
    fn from(error: TransactionLockError) -> Self {
        let kind = error.kind();
        let reason = error.reason();
        match error {
            TransactionLockError::Timeout { key, timeout } => Self::timed_out(key, timeout),
            TransactionLockError::InvalidKey { key } => Self::new(key, kind, reason),
            TransactionLockError::Deadlock { key, source, .. }
            | TransactionLockError::Cancelled { key, source, .. }
            | TransactionLockError::Backend { key, source, .. } => {
                Self::new(key, kind, reason).with_source(source)
            }
        }
    }
}
