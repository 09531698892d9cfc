//! `pglock run --once-per DURATION KEY -- CMD`: cron fires it on every host, one host runs
//! CMD per slot of DURATION (slots divide the server's clock from the Unix epoch), the
//! others exit 0 and print nothing.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use locks_postgres::PostgresLockManager;
use locks_schedule_postgres::locks_schedule::{
    JobContext, LedgerError, RunError, RunReport, Schedule, ScheduledJob, Verdict,
};
use locks_schedule_postgres::tokio_postgres;
use locks_schedule_postgres::tokio_postgres::error::SqlState;
use locks_schedule_postgres::{LEDGER_TABLE, PostgresLedger, install_ledger};
use nix::sys::signal::Signal;

use crate::cli::RunArgs;
use crate::connect::{self, Target};
use crate::exit::{CONFIG, Failure, LOST, SOFTWARE, UNAVAILABLE, USAGE};
use crate::group::{Group, Status};
use crate::run::{Say, acquisition_failure, holder_id, sleep_until};

/// Connections: the lock's and the ledger's.
const POOL_SIZE: usize = 3;

/// `pglock run --once-per`: the command's exit code on the host that ran the slot, 0 on
/// the others.
pub(crate) async fn run(
    target: Target,
    args: RunArgs,
    period: Duration,
    say: Say,
) -> Result<u8, Failure> {
    let schedule = Schedule::every(period)
        .map_err(|error| Failure::new(USAGE, format!("--once-per: {error}")))?;
    let firing = Firing::new(
        target,
        &args.key,
        schedule,
        args.program(),
        args.grace,
        args.keepalive,
        say,
    )?;
    firing.fire().await
}

/// A job, its command and its connections: what each firing of `run --once-per` and of
/// `schedule` uses.
pub(crate) struct Firing {
    target: Target,
    locks: PostgresLockManager,
    ledger: PostgresLedger,
    pool: locks_postgres::deadpool_postgres::Pool,
    job: ScheduledJob,
    program: Vec<String>,
    grace: Duration,
    say: Say,
}

impl Firing {
    /// Connections (made on first use) for the job KEY on `schedule`.
    pub(crate) fn new(
        target: Target,
        key: &str,
        schedule: Schedule,
        program: Vec<String>,
        grace: Duration,
        keepalive: Duration,
        say: Say,
    ) -> Result<Self, Failure> {
        let holder = holder_id(&target);
        let pool = connect::pool(&target, POOL_SIZE, &format!("locks:{holder}"))?;
        let locks = PostgresLockManager::builder(pool.clone())
            .holder_id(holder.clone())
            .keepalive((!keepalive.is_zero()).then_some(keepalive))
            .connect_timeout(target.connect_timeout)
            .build();
        Ok(Self {
            target,
            locks,
            ledger: PostgresLedger::new(pool.clone()),
            pool,
            job: ScheduledJob::new(key, schedule).holder(holder),
            program,
            grace,
            say,
        })
    }

    /// The job's schedule.
    pub(crate) fn schedule(&self) -> &Schedule {
        self.job.schedule()
    }

    /// One firing: the command's exit code if this host ran the slot (75 if the lock was
    /// lost meanwhile), else 0.
    pub(crate) async fn fire(&self) -> Result<u8, Failure> {
        let ended: Arc<Mutex<Option<u8>>> = Arc::default();
        let report = match self.fire_once(&ended).await {
            // No ledger yet: create it (as --fencing creates its table) and fire again;
            // nothing ran, and the failed claim wrote nothing.
            Err(RunError::Ledger(error)) if undefined_table(&error) => {
                self.say
                    .say(format!("creating the ledger table {LEDGER_TABLE}"));
                let client = self
                    .pool
                    .get()
                    .await
                    .map_err(|error| connect::pool_failure(&error, &self.target))?;
                install_ledger(&client).await.map_err(|error| {
                    Failure::new(
                        CONFIG,
                        format!(
                            "the ledger table {LEDGER_TABLE} is missing and cannot be created: {}",
                            crate::exit::chain(&error)
                        ),
                    )
                })?;
                self.fire_once(&ended).await
            }
            other => other,
        }
        .map_err(|error| failure(&error, &self.target))?;
        match report.verdict {
            Verdict::Ran { lock_lost, .. } => {
                let code = ended
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .unwrap_or(SOFTWARE);
                Ok(if lock_lost { LOST } else { code })
            }
            other => {
                self.say
                    .say(format!("slot {}: {other:?}; nothing to run", report.slot));
                Ok(0)
            }
        }
    }

    async fn fire_once(&self, ended: &Arc<Mutex<Option<u8>>>) -> Result<RunReport, RunError> {
        let (say, grace) = (self.say, self.grace);
        self.job
            .run_once_per_slot(&self.locks, &self.ledger, |context: JobContext| {
                let program = self.program.clone();
                let status = Arc::clone(ended);
                async move {
                    say.say(format!(
                        "slot {} is ours (attempt {})",
                        context.slot, context.attempt
                    ));
                    let code = run_command(&program, &context, grace).await;
                    *status.lock().unwrap_or_else(PoisonError::into_inner) = Some(code);
                    if code == 0 {
                        Ok(())
                    } else {
                        Err(format!("exit code {code}"))
                    }
                }
            })
            .await
    }
}

/// Runs the command to its end under the supervisor (as `run` does: its whole process
/// group, and every process that left it, dies with pglock), or stops it (SIGTERM,
/// SIGKILL after `grace`) when the lock is lost; its exit code.
async fn run_command(program: &[String], context: &JobContext, grace: Duration) -> u8 {
    let env = [
        ("PGLOCK_SLOT", context.slot.to_string()),
        ("PGLOCK_ATTEMPT", context.attempt.to_string()),
    ];
    let mut group = match Group::spawn(program, &env).await {
        Ok(group) => group,
        Err(failure) => {
            eprintln!("pglock: {}", failure.message);
            return failure.code;
        }
    };
    let lost = context.lost.clone().into_future();
    tokio::pin!(lost);
    let mut stopping = false;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let status = loop {
        tokio::select! {
            status = group.wait() => break status,
            reason = &mut lost, if !stopping => {
                eprintln!("pglock: the lock was lost ({reason:?}): stopping the command");
                group.signal(Signal::SIGTERM);
                stopping = true;
                kill_at = Some(tokio::time::Instant::now() + grace);
            }
            () = sleep_until(kill_at), if kill_at.is_some() => {
                group.signal(Signal::SIGKILL);
                kill_at = None;
            }
        }
    };
    match status {
        Status::Exited(0) => {}
        Status::Unknown => eprintln!(
            "pglock: the command's supervisor died (was it killed?): the command's process \
             group was killed, and its status is unknown"
        ),
        other => eprintln!("pglock: the command ended with {other}"),
    }
    status.code()
}

/// The exit code and message of a failed firing.
fn failure(error: &RunError, target: &Target) -> Failure {
    match error {
        RunError::Lock(error) => acquisition_failure(error, target),
        RunError::Ledger(error) => ledger_failure(error),
        other => Failure::new(SOFTWARE, crate::exit::chain(other)),
    }
}

/// A ledger error by its SQLSTATE: a missing table is a configuration to fix (with the
/// install step), another server error unexpected, no server error an unreachable server.
pub(crate) fn ledger_failure(error: &LedgerError) -> Failure {
    match sqlstate(error) {
        Some(state) if *state == SqlState::UNDEFINED_TABLE => Failure::new(
            CONFIG,
            format!("{}; or run `pglock jobs --install`", error.message()),
        ),
        Some(_) => Failure::new(SOFTWARE, error.message().to_owned()),
        None => Failure::new(UNAVAILABLE, error.message().to_owned()),
    }
}

/// The server's SQLSTATE behind a ledger error, if the server answered.
fn sqlstate(error: &LedgerError) -> Option<&SqlState> {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<tokio_postgres::Error>())
        .and_then(tokio_postgres::Error::code)
}

fn undefined_table(error: &LedgerError) -> bool {
    sqlstate(error) == Some(&SqlState::UNDEFINED_TABLE)
}
