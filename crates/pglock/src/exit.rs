//! Exit codes, and the one-line error that goes with each.
//!
//! The codes follow `sysexits.h` where one fits, and `flock(1)` for a lock that was not
//! acquired; the crate README and `pglock --help` list them.

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

#[cfg(test)]
mod tests {
    use super::*;

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
