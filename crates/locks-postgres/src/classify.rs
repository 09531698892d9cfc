//! Turning driver and pool errors into the port's error kinds, by SQLSTATE and by the
//! driver's own predicates, never by message text; and describing them in the
//! server's own words.

use std::error::Error as _;

use deadpool_postgres::PoolError;
use locks_port::{AcquisitionErrorKind, LockAcquisitionError};
use tokio_postgres::error::SqlState;

/// The port's kind for a driver error.
pub(crate) fn driver_kind(error: &tokio_postgres::Error) -> AcquisitionErrorKind {
    if error.is_closed() {
        return AcquisitionErrorKind::ConnectionLost;
    }
    match error.code() {
        Some(code) => code_kind(code),
        // No SQLSTATE and not closed: an I/O or protocol failure on the socket.
        None => AcquisitionErrorKind::ConnectionLost,
    }
}

fn code_kind(code: &SqlState) -> AcquisitionErrorKind {
    let class = &code.code()[..2];
    if *code == SqlState::LOCK_NOT_AVAILABLE {
        AcquisitionErrorKind::Timeout
    } else if *code == SqlState::QUERY_CANCELED {
        AcquisitionErrorKind::Cancelled
    } else if *code == SqlState::T_R_DEADLOCK_DETECTED {
        AcquisitionErrorKind::Deadlock
    } else if *code == SqlState::CANNOT_CONNECT_NOW || *code == SqlState::TOO_MANY_CONNECTIONS {
        AcquisitionErrorKind::Unreachable
    } else if *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::IDLE_SESSION_TIMEOUT
        || class == "08"
    {
        AcquisitionErrorKind::ConnectionLost
    } else if class == "28" // invalid authorization (role, password)
        || *code == SqlState::INVALID_CATALOG_NAME // unknown database
        || *code == SqlState::INSUFFICIENT_PRIVILEGE
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || *code == SqlState::UNDEFINED_TABLE
    // e.g. fencing on without its table
    {
        AcquisitionErrorKind::Configuration
    } else {
        AcquisitionErrorKind::Backend
    }
}

/// The port's kind for a pool checkout error (opening or recycling a connection).
pub(crate) fn pool_kind(error: &PoolError) -> AcquisitionErrorKind {
    match error {
        PoolError::Backend(error) => connect_kind(error),
        PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) | PoolError::Closed => {
            AcquisitionErrorKind::PoolUnavailable
        }
        // Opening or recycling a connection took too long: the server is not answering.
        PoolError::Timeout(_) => AcquisitionErrorKind::Unreachable,
        PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => {
            AcquisitionErrorKind::Configuration
        }
    }
}

/// The kind of a failure to open a connection: the server said why (authentication,
/// unknown database: configuration), or it could not be reached at all.
fn connect_kind(error: &tokio_postgres::Error) -> AcquisitionErrorKind {
    match error.code() {
        Some(code) => match code_kind(code) {
            AcquisitionErrorKind::ConnectionLost => AcquisitionErrorKind::Unreachable,
            kind => kind,
        },
        None => AcquisitionErrorKind::Unreachable,
    }
}

/// The SQLSTATE of a driver error, for spans and logs.
pub(crate) fn sqlstate(error: &tokio_postgres::Error) -> Option<&str> {
    error.code().map(SqlState::code)
}

/// A driver error in the server's own words: `role "x" does not exist (28000)` for a
/// server error (its DETAIL appended when there is one), else the driver's message
/// with its cause (`error connecting to server: Connection refused (os error 111)`).
/// `tokio_postgres::Error`'s own `Display` says only `db error` for server errors.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut text = format!("{} ({})", db.message(), db.code().code());
        if let Some(detail) = db.detail() {
            text.push_str(": ");
            text.push_str(detail);
        }
        return text;
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// An acquisition error for a driver error: kind by SQLSTATE, reason in the server's
/// words, the driver error as source.
pub(crate) fn driver_error(key: &str, error: tokio_postgres::Error) -> LockAcquisitionError {
    LockAcquisitionError::described(key, driver_kind(&error), describe(&error), error)
}

/// An acquisition error for a failed checkout. A driver error inside deadpool's
/// wrapper is unwrapped, so the chain does not repeat it ("Error occurred while
/// creating a new object: db error"): the source is the driver's own error.
pub(crate) fn pool_error(key: &str, error: PoolError) -> LockAcquisitionError {
    let kind = pool_kind(&error);
    match error {
        PoolError::Backend(error) => {
            LockAcquisitionError::described(key, kind, describe(&error), error)
        }
        PoolError::Closed => LockAcquisitionError::new(key, kind, "the connection pool is closed"),
        PoolError::NoRuntimeSpecified => LockAcquisitionError::new(
            key,
            kind,
            "the connection pool has no runtime (build it with Runtime::Tokio1)",
        ),
        other => {
            let text = other.to_string();
            LockAcquisitionError::new(key, kind, format!("Database error: {text}"))
                .with_source(other)
        }
    }
}
