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
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some(supervise::MODE) {
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

fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let say = Say(cli.verbose);
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
