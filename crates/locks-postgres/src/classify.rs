//! Turning driver and pool errors into the port's error kinds, by SQLSTATE and by the
//! driver's own predicates, never by message text.

use deadpool_postgres::PoolError;
use locks_port::AcquisitionErrorKind;
use tokio_postgres::error::SqlState;

/// The port's kind for a driver error.
pub(crate) fn driver_kind(error: &tokio_postgres::Error) -> AcquisitionErrorKind {
    if error.is_closed() {
        return AcquisitionErrorKind::ConnectionLost;
    }
    match error.code() {
        Some(code) if *code == SqlState::LOCK_NOT_AVAILABLE => AcquisitionErrorKind::Timeout,
        Some(code) if *code == SqlState::QUERY_CANCELED => AcquisitionErrorKind::Cancelled,
        Some(code)
            if *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::IDLE_SESSION_TIMEOUT
                || code.code().starts_with("08") =>
        {
            AcquisitionErrorKind::ConnectionLost
        }
        Some(_) => AcquisitionErrorKind::Backend,
        // No SQLSTATE and not closed: an I/O or protocol failure on the socket.
        None => AcquisitionErrorKind::ConnectionLost,
    }
}

/// The port's kind for a pool checkout error.
pub(crate) fn pool_kind(error: &PoolError) -> AcquisitionErrorKind {
    match error {
        PoolError::Backend(error) => match driver_kind(error) {
            // A connection that cannot be opened means no connection for the lock.
            AcquisitionErrorKind::ConnectionLost => AcquisitionErrorKind::PoolUnavailable,
            kind => kind,
        },
        PoolError::Timeout(_) | PoolError::Closed | PoolError::NoRuntimeSpecified => {
            AcquisitionErrorKind::PoolUnavailable
        }
        PoolError::PostCreateHook(_) => AcquisitionErrorKind::Backend,
    }
}

/// The SQLSTATE of a driver error, for spans and logs.
pub(crate) fn sqlstate(error: &tokio_postgres::Error) -> Option<&str> {
    error.code().map(SqlState::code)
}
