//! `pglock completions SHELL` and `pglock man`: the shell completion scripts and the
//! subcommands' man pages, generated from the same clap definitions that parse the command
//! line, and `pglock(1)` from the README's manual, so none can drift.

use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;
use crate::exit::{CANT_CREATE, Failure};

/// Writes the completion script for `shell` to stdout.
pub(crate) fn completions(shell: Shell) -> Result<u8, Failure> {
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "pglock", &mut out);
    crate::text::out(String::from_utf8_lossy(&out))?;
    Ok(0)
}

/// Writes the man page `pglock(1)` (roff) to stdout, or with `dir` every page (`pglock.1`,
/// `pglock-run.1`, `pglock-who.1`, …) into that folder.
pub(crate) fn man(dir: Option<&Path>) -> Result<u8, Failure> {
    // No `pglock help` subcommand in the pages: `man` is the help there.
    let command = Cli::command().disable_help_subcommand(true);
    // pglock(1) is the README's manual; the subcommands' pages come from clap.
    if let Some(dir) = dir {
        clap_mangen::generate_to(command, dir)
            .and_then(|()| std::fs::write(dir.join("pglock.1"), crate::manual::page()))
            .map_err(|error| {
                Failure::new(
                    CANT_CREATE,
                    format!("cannot write the man pages to {}: {error}", dir.display()),
                )
            })?;
        return Ok(0);
    }
    crate::text::out(crate::manual::page())?;
    Ok(0)
}
