//! `pglock schedule 'CRON' KEY -- CMD`: a long-running scheduler. It fires at every
//! occurrence of CRON by this host's clock and runs CMD if this host claims the slot (the
//! slot is named by the server's clock, as with `run --once-per`), until INT or TERM.

use std::time::Duration;

use locks_schedule_postgres::locks_schedule::Schedule;
use locks_schedule_postgres::locks_schedule::time::OffsetDateTime;

use crate::cli::ScheduleArgs;
use crate::connect::Target;
use crate::exit::{Failure, USAGE};
use crate::once_per::Firing;
use crate::run::Say;
use crate::signals::{Signals, signal_code};

/// `pglock schedule`: runs until a signal, then exits 128 + its number (a command that was
/// running is killed; its slot is settled by the next firing anywhere, as a crash).
pub(crate) async fn run(target: Target, args: ScheduleArgs, say: Say) -> Result<u8, Failure> {
    let schedule = args
        .schedule
        .parse::<Schedule>()
        .map_err(|error| Failure::new(USAGE, error.to_string()))?;
    let program = args.command.program();
    let firing = Firing::new(
        target,
        &args.key,
        schedule,
        program,
        args.grace,
        args.keepalive,
        say,
    )?;
    let mut signals = Signals::install()?;
    loop {
        let now = OffsetDateTime::now_utc();
        let next = firing
            .schedule()
            .slot_at(now)
            .map_err(|error| Failure::new(USAGE, error.to_string()))?
            .next();
        let wait = Duration::try_from(next - now).unwrap_or(Duration::ZERO);
        say.say(format!("next firing in {wait:?}"));
        tokio::select! {
            number = signals.recv() => return Ok(signal_code(number)),
            () = tokio::time::sleep(wait) => {}
        }
        tokio::select! {
            number = signals.recv() => return Ok(signal_code(number)),
            fired = firing.fire() => match fired {
                Ok(0) => {}
                Ok(code) => eprintln!("pglock: {}: the command exited with {code}", args.key),
                // The server may be back at the next slot: say it and go on.
                Err(failure) => eprintln!("pglock: {}: {}", args.key, failure.message),
            },
        }
    }
}
