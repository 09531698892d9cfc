//! `cargo xtask soak [--minutes N] [--patroni] [--shards]`: the chaos soak
//! (`crates/locks-postgres/examples/soak.rs`) on a throwaway PostgreSQL of its own (the
//! server-restart fault needs a server the soak owns, so `LOCKS_DATABASE_URL` is not
//! used). `cargo xtask test` runs a one-minute soak after the tests.

use std::time::Duration;

const HELP: &str = "\
usage: cargo xtask soak [--minutes N] [--seconds N] [--patroni] [--shards]

Worker processes take random keys with random waits and increment a counter per key
under the lock, with fencing tokens, while a chaos driver SIGKILLs workers, terminates
and SIGSTOPs their backends, restarts the server and cuts the workers' network (they run in
a network namespace of their own; needs root). Fails on any lost update, double
apply, repeated or backward fencing token, or advisory lock left held. Default: 1 minute.

--patroni: on an HA pair under Patroni instead (etcd and two PostgreSQL nodes in synchronous
mode, installed by scripts/install-test-deps.sh --ha when missing), on the multi-host URL;
the server restarts and partitions give way to Patroni failovers (a kill -9 of the primary's
postmaster, a switchover, a failover, in turn). Same checks.

--shards: 3 member processes of a 24-shard locks-shard group run beside the workers, under
the same faults; each shard task records its start, progress writes (through guard_write
with its token) and stop with the server's clock. Fails also on any overlap of two tasks of
a shard, any stale progress write accepted, a shard not running again within 10 s of an
outage (a server restart or a cut) ending, or a shard owned less than 99 % of the time
outside outages and those recoveries. See docs/soak.md.
";

/// Runs the soak for `duration`.
pub(crate) fn soak(duration: Duration) -> crate::Result {
    soak_on(duration, false, false)
}

/// Runs the soak for `duration`, on a Patroni pair when `patroni`, with shard members when
/// `shards`.
fn soak_on(duration: Duration, patroni: bool, shards: bool) -> crate::Result {
    if patroni {
        crate::deps::ensure_ha_deps()?;
    }
    let seconds = duration.as_secs().to_string();
    let mut command = crate::cargo();
    command.args([
        "run",
        "--quiet",
        "--package",
        "locks-postgres",
        "--example",
        "soak",
        "--",
    ]);
    if patroni {
        command.arg("--patroni");
    }
    if shards {
        command.arg("--shards");
    }
    let status = command.args(["--seconds", &seconds]).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the soak failed ({status})").into())
    }
}

/// `cargo xtask soak`.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let mut seconds = 60;
    let mut patroni = false;
    let mut shards = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let scale = match arg.as_str() {
            "--patroni" => {
                patroni = true;
                continue;
            }
            "--shards" => {
                shards = true;
                continue;
            }
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
    soak_on(Duration::from_secs(seconds), patroni, shards)
}
