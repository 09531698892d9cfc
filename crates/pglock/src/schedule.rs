//! `pglock schedule 'CRON' KEY -- CMD`: a long-running scheduler. It fires at every
//! occurrence of CRON by this host's clock and runs CMD if this host claims the slot (the
//! slot is named by the server's clock, as with `run --once-per`), until INT or TERM.

use std::time::Duration;

use locks_schedule_postgres::locks_schedule::Schedule;
use locks_schedule_postgres::locks_schedule::time::OffsetDateTime;

use crate::cli::ScheduleArgs;
use crate::connect::Target;
use crate::exit::{Failure, USAGE};
use crate::once_per::{Fired, Firing};
use crate::signals::{Signals, signal_code};
use crate::text::Say;

/// `pglock schedule`: runs until a signal, then exits 128 + its number. A command that is
/// running gets the signal (its process group, as `run` forwards it) and pglock exits once
/// it has ended; one that dies of it leaves its slot to be settled by the next firing
/// anywhere, as a crash.
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
        match firing.fire(&mut signals).await {
            // A signal given to the firing (forwarded to the command, or before it
            // started) ends the schedule once the firing is over.
            Ok(Fired {
                code,
                signal: Some(number),
            }) => {
                if code != signal_code(number) {
                    eprintln!("pglock: {}: the command exited with {code}", args.key);
                }
                return Ok(signal_code(number));
            }
            Ok(Fired { code: 0, .. }) => {}
            Ok(Fired { code, .. }) => {
                eprintln!("pglock: {}: the command exited with {code}", args.key);
            }
            // The server may be back at the next slot: say it and go on.
            Err(failure) => eprintln!("pglock: {}: {}", args.key, failure.message),
        }
    }
}
