//! Ledger errors in the server's own words, classified by SQLSTATE.

use deadpool_postgres::PoolError;
use locks_schedule::LedgerError;
use tokio_postgres::error::SqlState;

/// A driver error as a ledger error: the server's message and SQLSTATE (its DETAIL
/// appended), or the driver's own chain for a connection failure; a hint when the table
/// is missing.
pub(crate) fn driver(what: &str, error: tokio_postgres::Error) -> LedgerError {
    let mut text = locks_postgres::server_words(what, &error);
    if let Some(remedy) = error.code().and_then(remedy) {
        text.push_str("; ");
        text.push_str(remedy);
    }
    LedgerError::new(text, Some(Box::new(error)))
}

/// What the user does about a server error, by its SQLSTATE, when it is theirs to fix.
fn remedy(code: &SqlState) -> Option<&'static str> {
    if *code == SqlState::UNDEFINED_TABLE {
        Some("create the ledger once with locks_schedule_postgres::install_ledger")
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        Some(
            "the ledger's role needs: GRANT SELECT, INSERT, UPDATE, DELETE ON \
             scheduled_job_runs TO <role>",
        )
    } else {
        None
    }
}

/// A failed checkout from a pool of `size` connections: the driver's error when there is
/// one, the remedy when every connection was in use.
pub(crate) fn pool(what: &str, error: PoolError, size: usize) -> LedgerError {
    match error {
        PoolError::Backend(error) => driver(what, error),
        other => {
            let mut text = format!("{what}: {other}");
            if matches!(other, PoolError::Timeout(_)) {
                text.push_str(&format!(
                    "; all {size} connections of the ledger's pool are in use: give the \
                     ledger a larger pool"
                ));
            }
            LedgerError::new(text, Some(Box::new(other)))
        }
    }
}

/// No answer within the ledger's answer timeout.
pub(crate) fn timed_out(what: &str, timeout: std::time::Duration) -> LedgerError {
    LedgerError::new(
        format!(
            "{what}: the server did not answer within {timeout:?}; if it is only slow, \
             raise PostgresLedger::answer_timeout"
        ),
        None,
    )
}
