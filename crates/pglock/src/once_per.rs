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
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::cli::RunArgs;
use crate::connect::{self, Target};
use crate::exit::{
    CONFIG, Failure, LOST, NOPERM, SOFTWARE, UNAVAILABLE, USAGE, acquisition_failure,
};
use crate::group::{Group, Status};
use crate::run::{holder_id, sleep_until};
use crate::signals::{Signals, signal_code};
use crate::text::Say;

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
    let mut signals = Signals::install()?;
    // Connect first, so an unreachable server or bad credentials exit as for the other
    // commands (69, 77, 78), not as a failed read of the clock or the ledger.
    tokio::select! {
        number = signals.recv() => return Ok(signal_code(number)),
        checked = connect::check(&firing.pool, &firing.target) => checked?,
    }
    // A signal forwarded to the command is the command's to answer: its exit code is
    // pglock's.
    firing.fire(&mut signals).await.map(|fired| fired.code)
}

/// How a firing ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fired {
    /// The command's exit code if this host ran the slot (75 if the lock was lost
    /// meanwhile), 0 if another host ran it; 128 + n for a signal n that came before the
    /// command started.
    pub(crate) code: u8,
    /// The last signal pglock received meanwhile: forwarded to the command if it ran,
    /// else the reason the firing was given up.
    pub(crate) signal: Option<Signal>,
}

/// The signals pglock receives during a firing, on their way to the command: the
/// command takes the receiving end when it starts, so a signal that finds it still here
/// came before the command, and ends the firing.
#[derive(Clone, Default)]
struct Relay(Arc<Mutex<Option<UnboundedReceiver<Signal>>>>);

impl Relay {
    fn new() -> (UnboundedSender<Signal>, Self) {
        let (sender, receiver) = unbounded_channel();
        (sender, Self(Arc::new(Mutex::new(Some(receiver)))))
    }

    /// The signals from here on (once: the command that starts takes them).
    fn take(&self) -> Option<UnboundedReceiver<Signal>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Whether a command has taken the signals.
    fn taken(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

/// The next signal on `relayed`, or never.
async fn next_signal(relayed: &mut Option<UnboundedReceiver<Signal>>) -> Signal {
    match relayed {
        Some(receiver) => match receiver.recv().await {
            Some(signal) => signal,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// A job, its command and its connections: what each firing of `run --once-per` and of
/// `schedule` uses.
pub(crate) struct Firing {
    target: Target,
    locks: PostgresLockManager,
    ledger: PostgresLedger,
    pool: locks_postgres::deadpool_postgres::Pool,
    job: ScheduledJob,
    program: Vec<std::ffi::OsString>,
    grace: Duration,
    say: Say,
}

impl Firing {
    /// Connections (made on first use) for the job KEY on `schedule`.
    pub(crate) fn new(
        target: Target,
        key: &str,
        schedule: Schedule,
        program: Vec<std::ffi::OsString>,
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

    /// One firing, with pglock's `signals` handled: before the command starts, a signal
    /// gives the firing up (128 + n); while it runs, each is forwarded to its process
    /// group (and to the processes that left it), as `run` does, and the command ends
    /// as it chooses (SIGKILL only when pglock itself dies).
    pub(crate) async fn fire(&self, signals: &mut Signals) -> Result<Fired, Failure> {
        let (sender, relay) = Relay::new();
        let firing = self.fire_relayed(&relay);
        tokio::pin!(firing);
        let mut signal = None;
        loop {
            tokio::select! {
                fired = &mut firing => return fired.map(|code| Fired { code, signal }),
                number = signals.recv() => {
                    if !relay.taken() {
                        return Ok(Fired { code: signal_code(number), signal: Some(number) });
                    }
                    signal = Some(number);
                    let _ = sender.send(number);
                }
            }
        }
    }

    /// One firing: the command's exit code if this host ran the slot (75 if the lock was
    /// lost meanwhile), else 0. The command takes its signals from `relay`.
    async fn fire_relayed(&self, relay: &Relay) -> Result<u8, Failure> {
        let ended: Arc<Mutex<Option<u8>>> = Arc::default();
        let report = match self.fire_once(&ended, relay).await {
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
                self.fire_once(&ended, relay).await
            }
            other => other,
        }
        .map_err(|error| failure(&error, &self.target))?;
        if !report.abandoned_earlier.is_empty() {
            self.say.say(format!(
                "marked {} earlier run(s) abandoned, still `running` with their runners gone \
                 (the first of slot {})",
                report.abandoned_earlier.len(),
                crate::inspect::rfc3339(report.abandoned_earlier[0]),
            ));
        }
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

    async fn fire_once(
        &self,
        ended: &Arc<Mutex<Option<u8>>>,
        relay: &Relay,
    ) -> Result<RunReport, RunError> {
        let (say, grace) = (self.say, self.grace);
        self.job
            .run_once_per_slot(&self.locks, &self.ledger, |context: JobContext| {
                let program = self.program.clone();
                let status = Arc::clone(ended);
                let relay = relay.clone();
                async move {
                    say.say(format!(
                        "slot {} is ours (attempt {})",
                        context.slot, context.attempt
                    ));
                    let code = run_command(&program, &context, grace, &relay).await;
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
/// group, and every process that left it, dies with pglock), forwarding the signals of
/// `relay`, or stops it (SIGTERM, SIGKILL after `grace`) when the lock is lost; its exit
/// code.
async fn run_command(
    program: &[std::ffi::OsString],
    context: &JobContext,
    grace: Duration,
    relay: &Relay,
) -> u8 {
    // Taken before the command starts: a signal from here on is the command's.
    let mut relayed = relay.take();
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
            number = next_signal(&mut relayed) => group.signal(number),
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
        RunError::Lock(error) => acquisition_failure(error, &target.config),
        RunError::Ledger(error) => ledger_failure(error),
        other => Failure::new(SOFTWARE, crate::exit::chain(other)),
    }
}

/// A ledger error by its SQLSTATE: a missing table is a configuration to fix (with the
/// install step), a missing grant a permission (77), another server error unexpected, no
/// server error an unreachable server.
pub(crate) fn ledger_failure(error: &LedgerError) -> Failure {
    match sqlstate(error) {
        Some(state) if *state == SqlState::UNDEFINED_TABLE => Failure::new(
            CONFIG,
            format!("{}; or run `pglock jobs --install`", error.message()),
        ),
        // The message names the grant the ledger's role needs.
        Some(state) if *state == SqlState::INSUFFICIENT_PRIVILEGE => {
            Failure::new(NOPERM, error.message().to_owned())
        }
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
