//! `pglock`: run a command under a distributed lock on PostgreSQL advisory locks.
//!
//! See the crate README for the manual.

#![forbid(unsafe_code)]

mod break_lock;
mod capacity;
mod cli;
mod connect;
mod descendants;
mod duration;
mod exit;
mod generate;
mod group;
mod inspect;
mod jobs;
mod json;
mod leading;
mod lease;
mod manual;
mod once_per;
mod queue;
mod run;
mod schedule;
mod shard_run;
mod shards;
mod show;
mod signals;
mod status;
mod supervise;
mod text;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::cli::{Cli, Command};
use crate::connect::ProcessEnv;
use crate::exit::{Failure, SOFTWARE, USAGE};
use crate::text::{Say, out};

fn main() -> ExitCode {
    // Arguments are bytes, as the kernel passes them (a file name in Latin-1): only the
    // parser decides which must be text.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if raw.get(1).is_some_and(|first| first == supervise::MODE) {
        return supervise::main(&raw[2..]);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return match error.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                _ => ExitCode::from(USAGE),
            };
        }
    };
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("pglock: {}", text::escaped(&failure.message));
            }
            ExitCode::from(failure.code)
        }
    }
}

/// The libraries' own log on stderr: what `PGLOCK_LOG` asks for (a `tracing` filter:
/// `warn`, `locks_shard=debug`), else with `-v` their warnings and errors (a lost lock and
/// its reason in the server's words, a member's failing join), else nothing. Text from the
/// server is printed with its control characters escaped, as pglock's own.
fn library_log(verbose: bool) {
    use tracing_subscriber::EnvFilter;
    let asked = std::env::var("PGLOCK_LOG")
        .ok()
        .filter(|directives| !directives.trim().is_empty())
        .and_then(|directives| match EnvFilter::try_new(&directives) {
            Ok(filter) => Some(filter),
            Err(error) => {
                eprintln!(
                    "pglock: PGLOCK_LOG ignored: {}",
                    text::escaped(&error.to_string())
                );
                None
            }
        });
    let filter = match asked {
        Some(filter) => filter,
        // deadpool's own line for a broken connection ("Connection error: db error") says
        // less than the library's warning of what it cost.
        None if verbose => EnvFilter::new("warn,deadpool=error"),
        None => return,
    };
    // Only the first call installs; pglock makes one.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| Prefixed)
        .with_ansi(false)
        .without_time()
        .try_init();
}

/// Stderr, each log line starting `pglock: ` as pglock's own lines do (the formatter
/// writes a whole line at once; the level's padding is dropped).
struct Prefixed;

impl std::io::Write for Prefixed {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut stderr = std::io::stderr().lock();
        stderr.write_all(b"pglock: ")?;
        stderr.write_all(line.trim_ascii_start())?;
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let say = Say(cli.verbose);
    library_log(cli.verbose);
    // The commands that need no database.
    match &cli.command {
        Command::Id { key } => {
            out(format_args!("{}\n", locks_port::lock_id(key)))?;
            return Ok(0);
        }
        Command::Completions { shell } => return generate::completions(*shell),
        Command::Man { dir } => return generate::man(dir.as_deref()),
        Command::Capacity {
            locks,
            connections,
            json,
        } if cli.connection.url.is_none()
            && std::env::var("DATABASE_URL").map_or(true, |url| url.is_empty()) =>
        {
            return capacity::offline(*locks, *connections, *json);
        }
        _ => {}
    }
    let target = connect::resolve(
        cli.connection.url.as_deref(),
        cli.connection.connect_timeout,
        &ProcessEnv,
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Failure::new(SOFTWARE, format!("cannot start the runtime: {error}")))?;
    runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => match (args.once_per, args.shards.clone()) {
                (Some(period), _) => once_per::run(target, args, period, say).await,
                (None, Some(shards)) => shard_run::run(&target, &args, &shards, say).await,
                (None, None) => run::run(target, args, say).await,
            },
            Command::Schedule(args) => schedule::run(target, args, say).await,
            Command::Jobs {
                key,
                json,
                schedule,
                install,
            } => {
                let show = jobs::Show {
                    key: key.as_deref(),
                    json,
                    schedule: schedule.as_deref(),
                };
                jobs::run(&target, say, show, install).await
            }
            Command::Who { key, json, leader } if leader => leading::who(&target, &key, json).await,
            Command::Who { key, json, .. } => show::who(&target, say, &key, json).await,
            Command::List { json, watch } => show::list(&target, say, json, watch).await,
            Command::Shards { group, json } => shards::show(&target, &group, json).await,
            Command::Break(args) => break_lock::run(&target, args, say).await,
            Command::Capacity {
                locks,
                connections,
                json,
            } => capacity::online(&target, say, locks, connections, json).await,
            Command::Id { .. } | Command::Completions { .. } | Command::Man { .. } => Ok(0),
        }
    })
}
