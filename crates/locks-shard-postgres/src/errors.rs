//! Term store errors in the server's own words, classified by SQLSTATE.

use std::time::Duration;

use deadpool_postgres::PoolError;
use locks_shard::locks_port::{AcquisitionErrorKind, LockAcquisitionError};
use tokio_postgres::error::SqlState;

/// A driver error as the store's error: the server's message and SQLSTATE (its DETAIL
/// appended), or the driver's own chain for a connection failure; the install step
/// named when the table is missing.
pub(crate) fn driver(
    group: &str,
    what: &str,
    error: tokio_postgres::Error,
) -> LockAcquisitionError {
    let mut text = locks_postgres::server_words(what, &error);
    let kind = if error.code() == Some(&SqlState::UNDEFINED_TABLE) {
        text.push_str(
            "; create the term table once with locks_shard_postgres::install_shard_terms",
        );
        AcquisitionErrorKind::Configuration
    } else if error.as_db_error().is_some() {
        AcquisitionErrorKind::Backend
    } else {
        AcquisitionErrorKind::ConnectionLost
    };
    LockAcquisitionError::described(group, kind, text, error)
}

/// A failed checkout: the driver's error when there is one.
pub(crate) fn pool(group: &str, what: &str, error: PoolError) -> LockAcquisitionError {
    match error {
        PoolError::Backend(error) => driver(group, what, error),
        other => LockAcquisitionError::described(
            group,
            AcquisitionErrorKind::PoolUnavailable,
            format!("{what}: {other}"),
            other,
        ),
    }
}

/// No answer within the store's answer timeout.
pub(crate) fn timed_out(group: &str, what: &str, timeout: Duration) -> LockAcquisitionError {
    LockAcquisitionError::new(
        group,
        AcquisitionErrorKind::Timeout,
        format!("{what}: the server did not answer within {timeout:?}"),
    )
    .with_timeout(timeout)
}
