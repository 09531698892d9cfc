//! Text from outside (keys, application names, server messages) made safe to print: a
//! control character (a newline, an ANSI escape) is shown escaped, never sent raw to the
//! terminal; and the one writer of stdout ([`out`]), which a closed pipe does not end.

use std::io::{ErrorKind, Write};

use crate::exit::{Failure, SOFTWARE};

/// Writes `text` to stdout. A reader that went away (`pglock list | head -1`) ends the
/// output, not pglock: what is left unwritten is dropped and the command goes on to its
/// own exit code, as `list --watch` into a closed pipe does. Any other write error is a
/// failure (70).
pub(crate) fn out(text: impl std::fmt::Display) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match write!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Err(error) if error.kind() != ErrorKind::BrokenPipe => Err(Failure::new(
            SOFTWARE,
            format!("cannot write to stdout: {error}"),
        )),
        _ => Ok(()),
    }
}

/// Says what pglock does, with `-v`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Say(pub(crate) bool);

impl Say {
    /// Prints `message` on stderr with `-v`.
    pub(crate) fn say(self, message: impl AsRef<str>) {
        if self.0 {
            eprintln!("pglock: {}", escaped(message.as_ref()));
        }
    }
}

/// `text` with each control character escaped as Rust escapes it (`\n`, `\u{1b}`).
pub(crate) fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// `'text'`, escaped, for a key in a message.
pub(crate) fn quoted(text: &str) -> String {
    format!("'{}'", escaped(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escaped("a\nb\u{1b}[31mc\u{9b}d\u{7f}"),
            "a\\nb\\u{1b}[31mc\\u{9b}d\\u{7f}"
        );
        assert_eq!(quoted("déjà vu"), "'déjà vu'");
    }
}
