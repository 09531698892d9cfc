//! `pglock run`: take the lock, run the command, release when it exits.

use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockMode, LostSignal,
    PermitGuard, ReleaseOutcome, Semaphore,
};
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::{PostgresLockGuard, PostgresPermit};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::cli::{OnLost, RunArgs};
use crate::connect::{self, Target};
use crate::duration::show;
use crate::exit::{Failure, LOST, NOPERM, SOFTWARE, acquisition_failure, chain};
use crate::group::{Group, Status};
use crate::queue::{CANCEL_SETTLE, busy_note, settle};
use crate::signals::{Signals, signal_code};
use crate::status::StatusLine;
use crate::text::Say;

/// Connections: the lock's, the status line's, and one to check that a cancelled wait
/// left nothing behind.
const POOL_SIZE: usize = 3;

/// The holder id and `application_name` of this process: unique on the server, so its
/// sessions can be found in `pg_stat_activity`.
pub(crate) fn holder_id(target: &Target) -> String {
    let prefix: String = target
        .config
        .get_application_name()
        .unwrap_or("pglock")
        .chars()
        .take(20)
        .collect();
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned());
    let host: String = host.chars().take(24).collect();
    format!("{prefix}@{host}:{}", std::process::id())
}

/// What `run` holds while the command runs: the lock, or a permit (`--permits`,
/// `--leader`).
enum Held {
    Lock(PostgresLockGuard),
    Permit(PostgresPermit),
}

impl Held {
    fn fencing_token(&self) -> Option<i64> {
        match self {
            Self::Lock(guard) => guard.info().fencing_token(),
            Self::Permit(permit) => permit.info().fencing_token(),
        }
    }

    fn lost(&self) -> LostSignal {
        match self {
            Self::Lock(guard) => guard.lost(),
            Self::Permit(permit) => permit.lost(),
        }
    }

    async fn release(self) -> ReleaseOutcome {
        match self {
            Self::Lock(guard) => guard.release().await,
            Self::Permit(permit) => permit.release().await,
        }
    }
}

/// `pglock run`; with `--leader`, one term after another until the command exits on
/// its own (a lost leadership stops it, and pglock campaigns again after `--backoff`).
pub(crate) async fn run(target: Target, args: RunArgs, say: Say) -> Result<u8, Failure> {
    // Installed once: the handlers stay, so a signal between two terms is not lost.
    let mut signals = Signals::install()?;
    if !args.leader {
        return run_once(&target, &args, say, &mut signals).await;
    }
    loop {
        let _ = signals.take_received();
        match run_once(&target, &args, say, &mut signals).await {
            Err(failure) if failure.code == LOST => {
                // A signal forwarded to the command during the term was meant for pglock
                // too: it ends pglock rather than a new campaign.
                if let Some(number) = signals.take_received() {
                    eprintln!(
                        "pglock: {}; {number} received: not campaigning again",
                        failure.message
                    );
                    return Ok(signal_code(number));
                }
                eprintln!(
                    "pglock: {}; campaigning again in {}",
                    failure.message,
                    show(args.backoff)
                );
                // A signal in the pause ends pglock as one while waiting does.
                tokio::select! {
                    number = signals.recv() => return Ok(signal_code(number)),
                    () = tokio::time::sleep(args.backoff) => {}
                }
            }
            other => return other,
        }
    }
}

/// A leader waits this long after winning before it starts the command, so that a
/// leader whose session just ended has noticed and stopped its own (ADR 0018).
const TAKEOVER_DELAY: Duration = Duration::from_millis(500);

async fn run_once(
    target: &Target,
    args: &RunArgs,
    say: Say,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let permits = if args.leader { Some(1) } else { args.permits };
    let mode = if args.shared {
        LockMode::Shared
    } else {
        LockMode::Exclusive
    };
    let program = args.program();
    let key = args.key.as_str();
    let quoted = crate::text::quoted(key);
    let holder = holder_id(target);
    let application = format!("locks:{holder}");
    let pool = connect::pool(target, POOL_SIZE, &application)?;
    let manager =
        crate::lease::Settings::of_run(args, &pool, &holder, target.connect_timeout, args.fencing)
            .manager()?;
    let lock_id = manager.lock_id(key);

    say.say(format!("connecting to {} as {holder}", target.shown));
    tokio::select! {
        number = signals.recv() => {
            say.say(format!("{number} while connecting: giving up"));
            return Ok(signal_code(number));
        }
        checked = connect::check(&pool, target) => checked?,
    }
    if args.fencing {
        ensure_fencing_table(&pool, target, say).await?;
    }
    if args.publish.is_some() {
        crate::leading::ensure_board_table(&pool, target, say).await?;
    }

    let started = Instant::now();
    let acquired = {
        // The status line follows the lock's queue; a semaphore's waiters show in `who`.
        let status = if args.no_wait || permits.is_some() {
            None
        } else {
            StatusLine::start(pool.clone(), key, lock_id, &application)
        };
        let wanted = match permits {
            Some(permits) => format!("a permit of {permits} of {quoted}"),
            None => format!("{quoted} (lock id {lock_id})"),
        };
        match (args.no_wait, args.timeout) {
            (true, _) => say.say(format!("trying {wanted} without waiting")),
            (false, Some(timeout)) => {
                say.say(format!("waiting up to {} for {wanted}", show(timeout)));
            }
            (false, None) => say.say(format!("waiting for {wanted}")),
        }
        let acquire = async {
            let options = match args.timeout {
                Some(timeout) => AcquireOptions::new().with_timeout(timeout),
                None => AcquireOptions::new(),
            }
            .with_mode(mode);
            match (permits, args.no_wait) {
                (None, true) => manager
                    .try_acquire_with(key, mode)
                    .await
                    .map(|guard| guard.map(Held::Lock)),
                (None, false) => manager
                    .acquire(key, options)
                    .await
                    .map(|g| Some(Held::Lock(g))),
                (Some(permits), true) => manager
                    .try_acquire_permit(key, permits)
                    .await
                    .map(|permit| permit.map(Held::Permit)),
                (Some(permits), false) => {
                    let permit = manager.acquire_permit(key, permits, options).await?;
                    if args.leader {
                        // Let a leader whose session just ended notice and stop first.
                        let lost = permit.lost();
                        if tokio::time::timeout(TAKEOVER_DELAY, lost).await.is_ok() {
                            return Ok(None);
                        }
                    }
                    Ok(Some(Held::Permit(permit)))
                }
            }
        };
        let outcome = tokio::select! {
            number = signals.recv() => Err(number),
            acquired = acquire => Ok(acquired),
        };
        drop(status);
        outcome
    };
    let guard = match acquired {
        Err(number) => {
            // The wait's future is dropped: the library cancels the server-side wait and
            // closes the session. Exit only once the server shows nothing of ours.
            say.say(format!("{number} while waiting: cancelling the wait"));
            if tokio::time::timeout(CANCEL_SETTLE, settle(&pool, &application, say))
                .await
                .is_err()
            {
                say.say("the server did not answer in time after cancelling; exiting anyway");
            }
            return Ok(signal_code(number));
        }
        Ok(Ok(Some(guard))) => guard,
        Ok(Ok(None)) if args.leader => {
            return Err(Failure::new(
                LOST,
                format!("the leadership of {quoted} was lost before the command started"),
            ));
        }
        Ok(Ok(None)) => {
            if args.silent_conflict() {
                return Err(Failure::silent(args.conflict_exit_code));
            }
            let holder = busy_note(&pool, lock_id, permits).await;
            return Err(Failure::new(
                args.conflict_exit_code,
                format!("{quoted} is busy{holder}: not waiting (-n)"),
            ));
        }
        Ok(Err(error)) if error.kind() == AcquisitionErrorKind::Timeout => {
            if args.silent_conflict() {
                return Err(Failure::silent(args.conflict_exit_code));
            }
            let holder = busy_note(&pool, lock_id, permits).await;
            return Err(Failure::new(
                args.conflict_exit_code,
                format!(
                    "timed out after {} waiting for {quoted}{holder}",
                    show(started.elapsed())
                ),
            ));
        }
        Ok(Err(error)) => return Err(acquisition_failure(&error, &target.config)),
    };
    // A leader's term: the leading permit around the command, and the published value.
    let term = match args.leader.then_some(args.publish.as_deref()) {
        None => None,
        Some(publish) => {
            match crate::leading::Term::start(&manager, key, publish, guard.lost(), target, say)
                .await
            {
                Ok(term) => Some(term),
                Err(failure) => {
                    guard.release().await;
                    return Err(failure);
                }
            }
        }
    };
    let fencing_token = guard.fencing_token();
    let what = match permits {
        Some(permits) => format!("a permit of {permits}"),
        None if args.shared => "shared".to_owned(),
        None => "exclusive".to_owned(),
    };
    say.say(format!(
        "acquired {quoted} (lock id {lock_id}, {what}{}) after {}",
        fencing_token.map_or_else(String::new, |token| format!(", fencing token {token}")),
        show(started.elapsed())
    ));

    let mut env = vec![
        ("PGLOCK_KEY", key.to_owned()),
        ("PGLOCK_LOCK_ID", lock_id.to_string()),
    ];
    if let Some(permits) = permits {
        env.push(("PGLOCK_PERMITS", permits.to_string()));
    }
    if let Some(token) = fencing_token {
        env.push(("PGLOCK_FENCING_TOKEN", token.to_string()));
    }
    let mut group = match Group::spawn(&program, &env).await {
        Ok(group) => group,
        Err(failure) => {
            if let Some(term) = term {
                term.end(&manager, key).await;
            }
            guard.release().await;
            return Err(failure);
        }
    };
    say.say(format!(
        "running {} (process group {})",
        crate::group::shown(&program),
        group.pgid()
    ));

    let lost = guard.lost().into_future();
    tokio::pin!(lost);
    let mut lost_reason: Option<String> = None;
    let mut kill_at: Option<Instant> = None;
    // The lock is kept until no process of the group is left, whatever the command's
    // own process does.
    let status = loop {
        tokio::select! {
            status = group.wait() => break status,
            number = signals.recv() => {
                say.say(format!("forwarding {number} to the command's process group"));
                group.signal(number);
            }
            reason = &mut lost, if lost_reason.is_none() => {
                let reason = reason.to_string();
                match args.on_lost {
                    OnLost::Term => {
                        eprintln!(
                            "pglock: lost the lock on {quoted} ({reason}): stopping the command \
                             (SIGTERM, SIGKILL after {})",
                            show(args.grace)
                        );
                        group.signal(Signal::SIGTERM);
                        kill_at = Some(Instant::now() + args.grace);
                    }
                    OnLost::Kill => {
                        eprintln!("pglock: lost the lock on {quoted} ({reason}): killing the command");
                        group.signal(Signal::SIGKILL);
                    }
                    OnLost::Ignore => {
                        eprintln!("pglock: lost the lock on {quoted} ({reason}): letting the command run (--on-lost ignore)");
                    }
                }
                lost_reason = Some(reason);
            }
            () = sleep_until(kill_at), if kill_at.is_some() => {
                say.say(format!("the command outlived the {} grace: SIGKILL", show(args.grace)));
                group.signal(Signal::SIGKILL);
                kill_at = None;
            }
        }
    };
    if let Some(term) = term {
        term.end(&manager, key).await;
    }
    if status == Status::Unknown {
        guard.release().await;
        return Err(Failure::new(
            SOFTWARE,
            "the command's supervisor died (was it killed?): the command's process group was \
             killed, and its status is unknown",
        ));
    }
    let code = status.code();
    if let Some(reason) = lost_reason {
        say.say(format!(
            "the command ended ({}) after the lock was lost",
            status
        ));
        return Err(Failure::new(
            LOST,
            format!("the lock on {quoted} was lost while the command ran: {reason}"),
        ));
    }
    say.say(format!(
        "the command ended ({}): releasing {quoted}",
        status
    ));
    if let ReleaseOutcome::Lost(reason) = guard.release().await {
        // Lost before the release, unnoticed while the command ran: it may have run
        // unprotected for a moment, so say so.
        return Err(Failure::new(
            LOST,
            format!("the lock on {quoted} was lost while the command ran: {reason}"),
        ));
    }
    Ok(code)
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Creates the fencing token table if it is missing (only then: creating needs the
/// `CREATE` privilege, using it does not).
async fn ensure_fencing_table(pool: &Pool, target: &Target, say: Say) -> Result<(), Failure> {
    if let Some(client) =
        connect::missing_table(pool, target, locks_postgres::FENCING_TABLE).await?
    {
        say.say(format!(
            "creating the fencing token table {}",
            locks_postgres::FENCING_TABLE
        ));
        locks_postgres::install_fencing(&client)
            .await
            .map_err(|error| {
                Failure::new(
                    NOPERM,
                    format!(
                        "cannot create the fencing token table {}: {}",
                        locks_postgres::FENCING_TABLE,
                        error
                            .as_db_error()
                            .map_or_else(|| chain(&error), |db| db.message().to_owned())
                    ),
                )
            })?;
    }
    Ok(())
}
