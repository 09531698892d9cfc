//! Exit codes, and the one-line error that goes with each.
//!
//! The codes follow `sysexits.h` where one fits, and `flock(1)` for a lock that was not
//! acquired. [`TABLE`] is the manual's EXIT STATUS table: the crate README's table is
//! rendered from it (a test keeps them equal; `PGLOCK_BLESS=1` rewrites the README), and
//! the man page is made from the README.

use locks_port::{AcquisitionErrorKind, LockAcquisitionError};
use locks_postgres::tokio_postgres::error::{DbError, SqlState};
use locks_postgres::tokio_postgres::{self, Config};

/// The lock was not acquired (`-n` or `-w` and someone else holds it): the default of
/// `-E, --conflict-exit-code`, as in `flock(1)`.
pub(crate) const DEFAULT_CONFLICT: u8 = 1;
/// `pglock break`: the answer to "terminate?" was not yes.
pub(crate) const DECLINED: u8 = 1;
/// `EX_USAGE`: bad command line (unknown option, bad duration, missing command).
pub(crate) const USAGE: u8 = 64;
/// `EX_UNAVAILABLE`: the server could not be reached (refused, no route, connect timeout,
/// the server shutting down or out of connections), or the session broke while waiting.
pub(crate) const UNAVAILABLE: u8 = 69;
/// `EX_SOFTWARE`: the server answered with an error nothing here expects.
pub(crate) const SOFTWARE: u8 = 70;
/// `EX_TEMPFAIL`: the lock was lost while the command ran; the command was stopped as
/// `--on-lost` says.
pub(crate) const LOST: u8 = 75;
/// `EX_NOPERM`: authentication failed or the role may not connect; `pglock break`: the
/// role may not terminate the holder's session.
pub(crate) const NOPERM: u8 = 77;
/// `EX_CANTCREAT`: `pglock man --dir`: a page could not be written.
pub(crate) const CANT_CREATE: u8 = 73;
/// `EX_CONFIG`: the connection settings are wrong (malformed URL, unknown database,
/// unreadable `sslrootcert`, a certificate that does not verify).
pub(crate) const CONFIG: u8 = 78;
/// The command was found but could not be executed (as a shell says).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as a shell says).
pub(crate) const NOT_FOUND: u8 = 127;
/// Added to a signal number: the code after that signal while waiting, or when the
/// command died of it (as a shell says).
pub(crate) const SIGNAL_BASE: u8 = 128;

/// The manual's EXIT STATUS table: `(code, meaning)`, each code pglock exits with (a test
/// checks every constant above has its row), with the error line an operator sees.
pub(crate) const TABLE: &[(&str, &str)] = &[
    (
        "0",
        "success: the command exited 0; `run --once-per` on a host whose slot another host ran (or ran before); `who`, `list`, `shards`, `jobs`, `id`, `man`, `completions` done; `capacity` printed its plan (and the server's lock table is large enough); `break` ended the holder's sessions or found nobody to end",
    ),
    (
        "the command's",
        "`pglock run`: the command ran with the lock held; its exit status, or 128 + N if it died of signal N",
    ),
    (
        "1 (`-E`)",
        "the lock was not acquired: busy with `-n`, or `-w` ran out. One code for both, as in `flock`: either way someone else holds the lock, and scripts written for `flock -E` keep working (the stderr line says which); `pglock break`: the answer to its prompt was not yes; `pglock capacity`: the server's lock table is smaller than the locks need",
    ),
    (
        "64",
        "bad usage: unknown option, bad duration, no command, an empty key (`error: invalid value '' for '<KEY>': the key is empty …`; usage errors are the command-line parser's, with a pointer to `--help`), `--permits` outside 1..=65536, a `--lease` too short for `--keepalive` (`--lease 5.0s is too short for --keepalive 5.0s: it needs at least 14s`) (`EX_USAGE`, as `flock` exits)",
    ),
    (
        "69",
        "the server is unreachable: refused, no route, connect timeout, shutting down, too many connections; or the session broke while waiting (`EX_UNAVAILABLE`)",
    ),
    (
        "70",
        "the server answered with an error nothing here expects; or the command's supervisor was killed (`the command's supervisor died (was it killed?)`): the command's group was killed (`EX_SOFTWARE`)",
    ),
    (
        "73",
        "`pglock man --dir`: a page could not be written (`EX_CANTCREAT`)",
    ),
    (
        "75",
        "the lock was lost while the command ran; the command was stopped as `--on-lost` says (`EX_TEMPFAIL`: run it again)",
    ),
    (
        "77",
        "credentials: a wrong password, the server asks for a password and none is set (`the server asks for a password and none is set`), the role may not log in or may not connect to the database; `--fencing`, `--publish`, `--shards`, `--once-per`, `who --leader`, `shards` or `jobs` without the grant on the table beside the locks that they use (`the role needs: GRANT SELECT, INSERT, UPDATE ON advisory_lock_fencing_tokens TO ROLE`), or without `CREATE` where that table is still to be created; `pglock break`: the role may not end the holder's session (`EX_NOPERM`). Fix the settings; retrying does not help",
    ),
    (
        "78",
        "bad connection settings: malformed URL, unknown database, bad `sslmode`, unreadable `sslrootcert`, a server certificate that does not verify (`EX_CONFIG`)",
    ),
    (
        "126, 127",
        "the command could not be executed, or was not found (as a shell says)",
    ),
    (
        "128 + N",
        "signal N arrived while waiting: INT 130, TERM 143, HUP 129, QUIT 131. The wait was cancelled and nothing is held; `pglock schedule` ends with it on a signal, once a running command (which gets the signal) has ended",
    ),
];

/// [`TABLE`] as the README's Markdown table.
pub(crate) fn markdown_table() -> String {
    let mut text = String::from("| code | meaning |\n| --- | --- |\n");
    for (code, meaning) in TABLE {
        text.push_str(&format!("| {code} | {meaning} |\n"));
    }
    text
}

/// A reason to stop with an exit code, and the one line that explains it on stderr.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The process exit code.
    pub(crate) code: u8,
    /// One line, without the `pglock: ` prefix.
    pub(crate) message: String,
}

impl Failure {
    /// A failure with `code` that prints nothing (`-q`, `-E 0`).
    pub(crate) fn silent(code: u8) -> Self {
        Self {
            code,
            message: String::new(),
        }
    }

    /// A failure with `code`; newlines in `message` become spaces so it stays one line.
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        let message: String = message.into();
        Self {
            code,
            message: one_line(&message),
        }
    }
}

/// `text` with each run of line breaks turned into one space.
pub(crate) fn one_line(text: &str) -> String {
    text.split(['\n', '\r'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// An error and its sources, joined with `: ` (each source once, skipping a source whose
/// text the previous one already contains).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
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
    one_line(&text)
}

/// What went wrong beneath `error`: its sources joined as [`chain`] joins them, or its own
/// text when it has none.
///
/// For the parent's message to add its own words in front of: a driver error's own text
/// starts with its kind ("invalid connection string", "error connecting to server"), which
/// the parent message already says in its own words.
pub(crate) fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    match error.source() {
        Some(source) => chain(source),
        None => one_line(&error.to_string()),
    }
}

/// The server's error beneath `error`, if the server answered with one.
fn db_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a DbError> {
    let mut source = Some(error);
    while let Some(cause) = source {
        if let Some(db) = cause
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::as_db_error)
        {
            return Some(db);
        }
        source = cause.source();
    }
    None
}

/// The tables `pglock run` writes beside its locks: the option that uses each, and the
/// grant it needs.
const GRANTS: [(&str, &str, &str); 2] = [
    (
        locks_postgres::FENCING_TABLE,
        "--fencing",
        "SELECT, INSERT, UPDATE",
    ),
    (
        locks_postgres::LEADER_BOARD_TABLE,
        "--publish",
        "SELECT, INSERT, UPDATE",
    ),
];

/// `NOPERM` with the server's words when the server refused a privilege beneath
/// `error`, naming the grant when the table is one of [`GRANTS`].
pub(crate) fn privilege_failure(
    error: &(dyn std::error::Error + 'static),
    config: &Config,
) -> Option<Failure> {
    let db = db_error(error).filter(|db| *db.code() == SqlState::INSUFFICIENT_PRIVILEGE)?;
    let message = db.message();
    let role = config.get_user().unwrap_or("ROLE");
    Some(Failure::new(
        NOPERM,
        match GRANTS.iter().find(|(table, ..)| message.contains(table)) {
            Some((table, option, grant)) => {
                format!("{option}: {message}; the role needs: GRANT {grant} ON {table} TO {role}")
            }
            None => message.to_owned(),
        },
    ))
}

/// `NOPERM` when the server refused to let the role read one of `tables` (a read-only
/// command's one privilege beyond connecting), naming the grant on the one it names.
pub(crate) fn read_privilege_failure(
    tables: &[&str],
    error: &(dyn std::error::Error + 'static),
    config: &Config,
) -> Option<Failure> {
    let db = db_error(error).filter(|db| *db.code() == SqlState::INSUFFICIENT_PRIVILEGE)?;
    let role = config.get_user().unwrap_or("ROLE");
    let named = tables.iter().find(|table| db.message().contains(**table));
    let table = named.or(tables.first())?;
    Some(Failure::new(
        NOPERM,
        format!(
            "{}; the role needs: GRANT SELECT ON {table} TO {role}",
            db.message()
        ),
    ))
}

/// The failure for creating `table` (its first use on this database): `NOPERM` naming
/// the `CREATE` privilege when the server refused it, else `SOFTWARE`.
pub(crate) fn creation_failure(
    table: &str,
    error: &(dyn std::error::Error + 'static),
    config: &Config,
) -> Failure {
    match privilege_failure(error, config) {
        Some(failure) => Failure::new(
            NOPERM,
            format!(
                "creating {table} (its first use on this database): {}; a role with CREATE \
                 on the schema creates it once",
                failure.message
            ),
        ),
        None => Failure::new(SOFTWARE, format!("creating {table}: {}", chain(error))),
    }
}

/// The failure for an acquisition error other than a timeout.
pub(crate) fn acquisition_failure(error: &LockAcquisitionError, config: &Config) -> Failure {
    if let Some(failure) = privilege_failure(error, config) {
        return failure;
    }
    let code = match error.kind() {
        AcquisitionErrorKind::PoolUnavailable
        | AcquisitionErrorKind::ConnectionLost
        | AcquisitionErrorKind::Unreachable => UNAVAILABLE,
        AcquisitionErrorKind::Configuration => CONFIG,
        _ => SOFTWARE,
    };
    Failure::new(code, chain(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's EXIT STATUS table, rendered from [`TABLE`]: with `PGLOCK_BLESS=1`
    /// it is rewritten instead of compared.
    #[test]
    fn the_manual_shows_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
        let readme = std::fs::read_to_string(path).expect("the README");
        let start = readme
            .find("### EXIT STATUS\n")
            .expect("an EXIT STATUS section");
        let table = start + readme[start..].find("| code |").expect("its table");
        let end = table + readme[table..].find("\n\n").expect("the table's end") + 1;
        let wanted = markdown_table();
        if std::env::var_os("PGLOCK_BLESS").is_some() {
            let blessed = format!("{}{wanted}{}", &readme[..table], &readme[end..]);
            std::fs::write(path, blessed).expect("rewrite the README");
            return;
        }
        assert_eq!(
            readme[table..end],
            wanted,
            "the README's EXIT STATUS table differs from exit::TABLE; \
             run with PGLOCK_BLESS=1 to rewrite it"
        );
    }

    /// Every code this file defines has a row in [`TABLE`] (found by reading the file, so
    /// a new constant without a row fails here), and every row's code is one pglock uses.
    #[test]
    fn every_code_has_a_row() {
        let source = include_str!("exit.rs");
        let codes: Vec<u8> = source
            .lines()
            .filter_map(|line| line.strip_prefix("pub(crate) const "))
            .filter_map(|line| line.split_once(": u8 = "))
            .map(|(_, value)| value.trim_end_matches(';').parse().expect("a number"))
            .collect();
        assert!(codes.len() >= 12, "{codes:?}");
        let rows: Vec<&str> = TABLE.iter().map(|(code, _)| *code).collect();
        let has_row = |code: u8| {
            rows.iter()
                .any(|row| row.split([' ', ',']).any(|word| word == code.to_string()))
        };
        for code in codes {
            assert!(has_row(code), "exit code {code} has no row in exit::TABLE");
        }
        assert!(has_row(0), "success has no row");
    }

    #[test]
    fn messages_stay_on_one_line() {
        let failure = Failure::new(CONFIG, "first\n  second\r\n\nthird");
        assert_eq!(failure.message, "first second third");
        assert_eq!(failure.code, 78);
    }

    #[test]
    fn chains_name_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(chain(&io), "refused");
        assert_eq!(causes(&io), "refused");
        let wrapped = std::io::Error::other(io);
        assert_eq!(causes(&wrapped), "refused");
    }
}
