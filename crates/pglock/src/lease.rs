//! The lock manager of `pglock run`, and a refused `--lease`/`--keepalive` pair said in the
//! CLI's own flags, with the shortest lease that would do.

use std::time::Duration;

use locks_postgres::PostgresLockManager;
use locks_postgres::deadpool_postgres::Pool;

use crate::cli::RunArgs;
use crate::duration::show;
use crate::exit::{Failure, USAGE};

/// The lease when `--lease` is not given.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// The longest lease searched for when saying what `--keepalive` needs (a year).
const LONGEST: u64 = 365 * 24 * 3600;

/// The settings of `pglock run` that the manager is built from.
#[derive(Debug)]
pub(crate) struct Settings<'a> {
    pub(crate) pool: &'a Pool,
    pub(crate) holder: &'a str,
    pub(crate) keepalive: Option<Duration>,
    /// The lease in force, and whether it was given (else it is the default).
    pub(crate) lease: Option<Duration>,
    pub(crate) lease_given: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) fencing: bool,
    /// `--stall-patience` (zero: none).
    pub(crate) stall_patience: Duration,
    /// `--expire-stopped`.
    pub(crate) expire_stopped: bool,
}

impl<'a> Settings<'a> {
    /// The settings `pglock run`'s flags give (`--keepalive`, `--lease`,
    /// `--stall-patience`) for a manager on `pool` as `holder`, fencing as `fencing` says:
    /// the default lease needs keepalives; `--keepalive 0` alone turns both off.
    pub(crate) fn of_run(
        args: &RunArgs,
        pool: &'a Pool,
        holder: &'a str,
        connect_timeout: Duration,
        fencing: bool,
    ) -> Self {
        let keepalive = (!args.keepalive.is_zero()).then_some(args.keepalive);
        let lease = match (args.lease, keepalive) {
            (Some(lease), _) => (!lease.is_zero()).then_some(lease),
            (None, Some(_)) => Some(DEFAULT_LEASE),
            (None, None) => None,
        };
        Self {
            pool,
            holder,
            keepalive,
            lease,
            lease_given: args.lease.is_some(),
            connect_timeout,
            fencing,
            stall_patience: args.stall_patience,
            expire_stopped: args.expire_stopped,
        }
    }

    fn build(&self, lease: Option<Duration>) -> Option<PostgresLockManager> {
        PostgresLockManager::builder(self.pool.clone())
            .holder_id(self.holder.to_owned())
            .keepalive(self.keepalive)
            .lease(lease)
            .connect_timeout(self.connect_timeout)
            .fencing(self.fencing)
            .stall_patience(self.stall_patience)
            .expire_stopped_holders(self.expire_stopped)
            .try_build()
            .ok()
    }

    /// The manager, or a usage failure that says which flag to change and to what.
    pub(crate) fn manager(&self) -> Result<PostgresLockManager, Failure> {
        if let Some(manager) = self.build(self.lease) {
            return Ok(manager);
        }
        if self.expire_stopped && self.lease.is_none() {
            let off = if self.keepalive.is_none() {
                "--keepalive 0"
            } else {
                "--lease 0"
            };
            return Err(Failure::new(
                USAGE,
                format!(
                    "--expire-stopped needs a lease: the server frees a stopped holder's lock \
                     after the lease's bound, and {off} turns the lease off"
                ),
            ));
        }
        let lease = self.lease.map_or_else(|| "0".to_owned(), show);
        let named = if self.lease_given {
            format!("--lease {lease}")
        } else {
            format!("the default --lease {lease}")
        };
        let Some(keepalive) = self.keepalive else {
            return Err(Failure::new(
                USAGE,
                format!(
                    "{named} needs keepalives, which --keepalive 0 turns off: give a \
                     --keepalive, or --lease 0 to leave the server's timers alone"
                ),
            ));
        };
        // The shortest whole-second lease this keepalive allows (the check is monotone).
        let (mut low, mut high) = (1_u64, LONGEST);
        if self.build(Some(Duration::from_secs(high))).is_none() {
            return Err(Failure::new(
                USAGE,
                format!("--keepalive {} is too long for any lease", show(keepalive)),
            ));
        }
        while low < high {
            let middle = low + (high - low) / 2;
            if self.build(Some(Duration::from_secs(middle))).is_some() {
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        let (given, shorten) = match self.stall_patience.is_zero() {
            true => (format!("--keepalive {}", show(keepalive)), "--keepalive"),
            false => (
                format!(
                    "--keepalive {} and --stall-patience {}",
                    show(keepalive),
                    show(self.stall_patience)
                ),
                "--keepalive or --stall-patience",
            ),
        };
        Err(Failure::new(
            USAGE,
            format!(
                "{named} is too short for {given}: it needs at least {}; lengthen --lease \
                 or shorten {shorten}",
                show(Duration::from_secs(high))
            ),
        ))
    }
}
