//! `cargo xtask soak [--minutes N]`: the chaos soak
//! (`crates/locks-postgres/examples/soak.rs`) on a throwaway PostgreSQL of its own (the
//! server-restart fault needs a server the soak owns, so `LOCKS_DATABASE_URL` is not
//! used). `cargo xtask test` runs a one-minute soak after the tests.

use std::time::Duration;

const HELP: &str = "\
usage: cargo xtask soak [--minutes N] [--seconds N]

Worker processes take random keys with random waits and increment a counter per key
under the lock, with fencing tokens, while a chaos driver SIGKILLs workers, terminates
and SIGSTOPs their backends and restarts the server. Fails on any lost update, double
apply, repeated or backward fencing token, or advisory lock left held. Default: 1 minute.
";

/// Runs the soak for `duration`.
pub(crate) fn soak(duration: Duration) -> crate::Result {
    let seconds = duration.as_secs().to_string();
    let status = crate::cargo()
        .args([
            "run",
            "--quiet",
            "--package",
            "locks-postgres",
            "--example",
            "soak",
            "--",
            "--seconds",
            &seconds,
        ])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the soak failed ({status})").into())
    }
}

/// `cargo xtask soak`.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let mut seconds = 60;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let scale = match arg.as_str() {
            "--minutes" => 60,
            "--seconds" => 1,
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            other => return Err(format!("unexpected argument `{other}`\n\n{HELP}").into()),
        };
        let value: u64 = args
            .next()
            .ok_or_else(|| format!("{arg} needs a number\n\n{HELP}"))?
            .parse()
            .map_err(|error| format!("{arg}: {error}\n\n{HELP}"))?;
        seconds = value.saturating_mul(scale);
    }
    soak(Duration::from_secs(seconds))
}
