//! The adapter's errors: driver and pool errors turned into the port's error kinds (by
//! SQLSTATE and by the driver's own predicates, never by message text) and described in
//! the server's own words, and the errors the adapter raises itself.

use std::error::Error as _;
use std::time::Duration;

use locks_port::{AcquisitionErrorKind, LockAcquisitionError, timeout_reason};
use tokio_postgres::error::SqlState;

use crate::lease::LeaseError;
use crate::limit::Deadline;

/// Why a standby is refused.
pub(crate) const STANDBY: &str = "Database error: the server is a read-only standby (in \
     recovery); advisory locks there exclude nothing on the primary (use \
     target_session_attrs=read-write)";

/// Why a connection whose statements reach different server sessions is refused.
pub(crate) const MOVED_BETWEEN_SESSIONS: &str = "the statements of one connection ran on \
     different server sessions, so a session advisory lock would exclude nothing: session locks \
     need a direct connection or a session-pooling proxy (PgBouncer pool_mode=session); behind \
     transaction pooling, use TransactionLocks";

/// Records the call's timeout on an error, when it had one.
pub(crate) fn with_timeout(
    error: LockAcquisitionError,
    deadline: Option<Deadline>,
) -> LockAcquisitionError {
    match deadline {
        Some(deadline) => error.with_timeout(deadline.timeout),
        None => error,
    }
}

/// A [`AcquisitionErrorKind::Configuration`] refusal (the caller closes the session).
pub(crate) fn refused(
    key: &str,
    reason: &'static str,
    deadline: Option<Deadline>,
) -> LockAcquisitionError {
    let error = LockAcquisitionError::new(key, AcquisitionErrorKind::Configuration, reason);
    with_timeout(error, deadline)
}

/// A lock statement answered no row (the statements' `Answer::NoRow`, a floor up);
/// the caller closed the session, which undoes whatever the statement did.
pub(crate) fn no_row(key: &str, deadline: Option<Deadline>) -> LockAcquisitionError {
    let error = LockAcquisitionError::new(
        key,
        AcquisitionErrorKind::Backend,
        "Database error: the lock statement answered no row; closed the connection, which \
         undoes whatever it did",
    );
    with_timeout(error, deadline)
}

/// Every acquisition of a manager whose lease cannot hold fails with this.
pub(crate) fn lease_refused(
    key: &str,
    lease: &LeaseError,
    deadline: Option<Deadline>,
) -> LockAcquisitionError {
    let error = LockAcquisitionError::new(
        key,
        AcquisitionErrorKind::Configuration,
        format!("the manager's lease cannot hold: {lease}"),
    );
    with_timeout(error, deadline)
}

/// A connection could not be opened in time: the call's timeout, else `connect_timeout`.
pub(crate) fn unreachable(
    key: &str,
    deadline: Option<Deadline>,
    connect_timeout: Duration,
) -> LockAcquisitionError {
    let waited = deadline.map_or(connect_timeout, |deadline| deadline.timeout);
    let error = LockAcquisitionError::new(
        key,
        AcquisitionErrorKind::Unreachable,
        format!(
            "{} opening a connection (the server did not answer)",
            timeout_reason(waited)
        ),
    );
    with_timeout(error, deadline)
}

/// What a full pool of `pool_size` connections says, after `what` (how a connection
/// was looked for): `{what} (all {pool_size} in use; each held lock keeps one)`. Every
/// error that found no free pool connection says it in these words: an acquisition's,
/// a semaphore's or leader board's read, an inspection's.
pub(crate) fn pool_full(what: &str, pool_size: usize) -> String {
    format!("{what} (all {pool_size} in use; each held lock keeps one)")
}

/// No pool slot (`what` says how it was looked for) in a pool of `pool_size`.
pub(crate) fn pool_exhausted(
    key: &str,
    what: &str,
    pool_size: usize,
    deadline: Option<Deadline>,
) -> LockAcquisitionError {
    let reason = pool_full(what, pool_size);
    let error = LockAcquisitionError::new(key, AcquisitionErrorKind::PoolUnavailable, reason);
    with_timeout(error, deadline)
}

/// A statement's answer did not come in time: the call's timeout, else `answer_timeout`.
pub(crate) fn no_answer(
    key: &str,
    deadline: Option<Deadline>,
    answer_timeout: Duration,
) -> LockAcquisitionError {
    let waited = deadline.map_or(answer_timeout, |deadline| deadline.timeout);
    let error = LockAcquisitionError::new(
        key,
        AcquisitionErrorKind::ConnectionLost,
        format!("{} (the server did not answer)", timeout_reason(waited)),
    );
    with_timeout(error, deadline)
}

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
    } else if *code == SqlState::OUT_OF_MEMORY {
        // The lock table is full (`lock_table::is_lock_table_full`): nothing the caller
        // can fix by retrying at once, nor the configuration of this client.
        AcquisitionErrorKind::Backend
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
        || *code == SqlState::INVALID_SQL_STATEMENT_NAME
    // a statement prepared on the connection's server session is missing: the statement
    // reached another server session (a transaction-pooling proxy)
    {
        AcquisitionErrorKind::Configuration
    } else {
        AcquisitionErrorKind::Backend
    }
}

/// The kind of a failure to open a connection: the server said why (authentication,
/// unknown database: configuration), or it could not be reached at all.
pub(crate) fn connect_kind(error: &tokio_postgres::Error) -> AcquisitionErrorKind {
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
/// server error (its DETAIL and HINT appended when there are any: `out of shared memory
/// (53200) (hint: You might need to increase max_locks_per_transaction.)`), else the driver's message
/// with its cause (`error connecting to server: Connection refused (os error 111)`).
/// `tokio_postgres::Error`'s own `Display` says only `db error` for server errors.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut text = format!("{} ({})", db.message(), db.code().code());
        if let Some(detail) = db.detail() {
            text.push_str(": ");
            text.push_str(detail);
        }
        if let Some(hint) = db.hint() {
            text.push_str(" (hint: ");
            text.push_str(hint);
            text.push(')');
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

/// `error`, from a statement on a table this crate's install step creates, with how to
/// create it when the server's answer is a configuration matter (the table is missing,
/// say): `<the server's words>; <hint>`, the error kept as the source.
pub(crate) fn with_install_hint(
    key: &str,
    error: LockAcquisitionError,
    hint: &str,
) -> LockAcquisitionError {
    if error.kind() != AcquisitionErrorKind::Configuration {
        return error;
    }
    let reason = format!("{}; {hint}", error.reason());
    LockAcquisitionError::new(key, AcquisitionErrorKind::Configuration, reason).with_source(error)
}

/// An acquisition error for a driver error: kind by SQLSTATE, reason in the server's
/// words, the driver error as source.
///
/// A prepared statement the server session does not know (26000) means the statement
/// reached a server session other than the one it was prepared on: the error says so
/// ([`MOVED_BETWEEN_SESSIONS`]) before the server's words.
pub(crate) fn driver_error(key: &str, error: tokio_postgres::Error) -> LockAcquisitionError {
    let mut reason = describe(&error);
    if error.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME) {
        reason = format!("{MOVED_BETWEEN_SESSIONS} ({reason})");
    }
    LockAcquisitionError::described(key, driver_kind(&error), reason, error)
}
