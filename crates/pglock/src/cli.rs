//! The command line.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::duration::parse_duration;

/// The exit codes, shown at the end of `pglock --help` and `pglock run --help`.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  (child's)  pglock run: the command's own exit status; 128+N if it died of signal N
  1          the lock was not acquired: busy with -n, or -w ran out (change with -E)
  64         bad usage: unknown option, bad duration, no command, an empty key,
             --permits outside 1..=65536, a --lease too short for --keepalive
  69         the server is unreachable (refused, no route, connect timeout, shutting
             down, too many connections), or the session broke while waiting
  70         the server answered with an unexpected error
  75         the lock was lost while the command ran; the command was stopped as
             --on-lost says (also with --on-lost ignore, after it ends)
  77         credentials: a wrong or missing password, a role that may not log in,
             --fencing without the grant on the token table; pglock break: the
             role may not terminate the holder's session
  78         bad connection settings: malformed URL, unknown database, unreadable
             sslrootcert, a server certificate that does not verify
  126, 127   the command could not be executed / was not found
  128+N      signal N (INT 130, TERM 143, HUP 129, QUIT 131) arrived while waiting:
             the wait was cancelled and nothing is held

Connection: --url, else DATABASE_URL, else the libpq environment (PGHOST, PGPORT,
PGUSER, PGPASSWORD or ~/.pgpass, PGDATABASE, PGAPPNAME, PGSSLMODE, PGSSLROOTCERT,
PGCONNECT_TIMEOUT), as psql reads them. PGLOCK_LOG (a filter, e.g. `warn` or
`locks_shard=debug`) prints the libraries' log on stderr; -v alone prints its warnings.";

/// The exit codes of `pglock capacity`.
const CAPACITY_EXIT_CODES: &str = "\
Exit codes:
  0   the plan printed; with a server, its lock table is large enough
  1   the server's lock table is smaller than N locks need
  64  bad usage; 69, 77, 78 as for the other commands (the server unreachable,
      credentials, bad connection settings)

Without --url or DATABASE_URL no database is contacted. The server is asked only SHOW
of its settings, never pg_locks.";

/// Run a command under a distributed lock on PostgreSQL advisory locks.
///
/// Keys are strings, turned into the same 64-bit advisory lock id as the Rust library
/// (`locks-postgres`) and the Python `eventsource` library, so all of them contend on
/// one lock.
#[derive(Debug, Parser)]
#[command(
    name = "pglock",
    version,
    after_help = EXIT_CODES,
    max_term_width = 100,
    args_override_self = true
)]
pub(crate) struct Cli {
    /// The connection.
    #[command(flatten)]
    pub(crate) connection: ConnectionArgs,
    /// Say what pglock is doing, on stderr, and the libraries' warnings (a lost lock, a
    /// failing join; PGLOCK_LOG, e.g. `locks_shard=debug`, chooses others).
    #[arg(short, long, global = true)]
    pub(crate) verbose: bool,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where the server is.
#[derive(Debug, Args)]
pub(crate) struct ConnectionArgs {
    /// PostgreSQL URL or `key=value` connection string [default: DATABASE_URL, else the
    /// libpq environment].
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) url: Option<String>,
    /// How long connecting may take [default: PGCONNECT_TIMEOUT, else 10s].
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) connect_timeout: Option<Duration>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Take the lock, run a command, release the lock when it exits.
    #[command(after_help = EXIT_CODES)]
    Run(RunArgs),
    /// Show who holds the lock on KEY and who waits for it.
    Who {
        /// The lock key.
        #[arg(value_parser = parse_key)]
        key: String,
        /// Print one JSON document instead of a table (fields in the manual).
        #[arg(long)]
        json: bool,
        /// KEY is an election (`pglock run --leader`): show who leads it now, with the
        /// term, its start and the value the leader published (--publish).
        #[arg(long)]
        leader: bool,
    },
    /// Show who owns which shard of the shard group GROUP (the `locks-shard` crate): the
    /// member, its holder id, the term's token and start, and the members' counts.
    Shards {
        /// The group's name.
        #[arg(value_parser = parse_key)]
        group: String,
        /// Print one JSON document instead of a table: `group`, `members` (their slots)
        /// and `shards` (each `shard` with its `owner`, `null` while it moves or no member
        /// runs it: `member`, `holder_id`, `token`, `since`).
        #[arg(long)]
        json: bool,
    },
    /// List every advisory lock on the database, held or awaited.
    List {
        /// Print one JSON document instead of a table (fields in the manual).
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// Redraw the list every DURATION (at least 100ms) until interrupted.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        watch: Option<Duration>,
    },
    /// Terminate the session that holds the lock on KEY (or the permits of the semaphore
    /// or leadership KEY), after showing it and asking.
    #[command(after_help = BREAK_EXIT_CODES)]
    Break(BreakArgs),
    /// Run CMD once per occurrence of SCHEDULE across every host, until INT or TERM: a
    /// long-running scheduler to run on every host (see ONCE PER SLOT in the manual).
    Schedule(ScheduleArgs),
    /// Show the latest runs of scheduled jobs (`run --once-per`): slot, outcome, attempt,
    /// duration, holder.
    Jobs {
        /// Only this job (its KEY).
        #[arg(value_parser = parse_key)]
        key: Option<String>,
        /// Print one JSON array instead of a table.
        #[arg(long)]
        json: bool,
        /// The job's schedule (`every 2s`, `every 1h at :05`, or a cron expression), as
        /// `run --once-per` or `schedule` was given it: the NEXT column shows the next
        /// slot's start by the server's clock (the ledger does not record schedules, so
        /// without it NEXT is `?`, `null` in JSON).
        #[arg(long, value_name = "SCHEDULE")]
        schedule: Option<String>,
        /// Create the ledger table (once per database) and exit.
        #[arg(long, conflicts_with_all = ["key", "json", "schedule"])]
        install: bool,
    },
    /// Print what a server needs to hold N advisory locks at once
    /// (max_locks_per_transaction, shared memory); with --url or DATABASE_URL, also what
    /// the server has and whether it is enough.
    #[command(after_help = CAPACITY_EXIT_CODES)]
    Capacity {
        /// How many locks are held at once (all processes together).
        #[arg(long, value_name = "N")]
        locks: u64,
        /// The server's max_connections [default: the server's, else 100].
        #[arg(long, value_name = "C", value_parser = clap::value_parser!(u64).range(1..))]
        connections: Option<u64>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the advisory lock id of KEY (no database needed).
    Id {
        /// The lock key.
        #[arg(value_parser = parse_key)]
        key: String,
    },
    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page pglock(1), in roff; with --dir, write every page there.
    #[command(hide = true)]
    Man {
        /// Write pglock.1 and a page per subcommand (pglock-run.1, …) into this folder.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

/// The exit codes of `pglock break`, at the end of `pglock break --help`.
pub(crate) const BREAK_EXIT_CODES: &str = "\
Exit codes:
  0    the sessions were terminated, or nobody held the lock or a permit of KEY
  1    the answer was not yes: nothing was terminated
  64   bad usage, or no terminal to ask on and no --yes
  69   the server is unreachable
  70   the server answered with an unexpected error, or a terminated session did not go
  77   the role may not terminate that session (only a superuser may end a superuser's
       session; others need pg_signal_backend, or to be the same role)
  78   bad connection settings";

/// `pglock break`.
#[derive(Debug, Args)]
pub(crate) struct BreakArgs {
    /// The lock key.
    #[arg(value_parser = parse_key)]
    pub(crate) key: String,
    /// Do not ask: terminate at once (for scripts; needed when stdin is not a terminal).
    #[arg(short = 'y', long)]
    pub(crate) yes: bool,
    /// Terminate the sessions waiting for the lock too (left alone without this).
    #[arg(long)]
    pub(crate) waiters: bool,
}

/// `pglock run`.
#[derive(Debug, Args)]
#[command(
    override_usage = "pglock run [OPTIONS] KEY [--] CMD [ARGS]...\n       pglock run [OPTIONS] KEY -c SHELL_COMMAND"
)]
pub(crate) struct RunArgs {
    /// The lock key.
    #[arg(value_parser = parse_key)]
    pub(crate) key: String,
    /// Wait at most this long (500ms, 2s, 1m, or seconds like 1.5) [default: forever].
    #[arg(short = 'w', long = "timeout", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) timeout: Option<Duration>,
    /// Do not wait: fail at once if the lock is busy.
    #[arg(short = 'n', long, conflicts_with = "timeout")]
    pub(crate) no_wait: bool,
    /// Take a shared lock (many shared holders at once, no exclusive one).
    #[arg(short = 's', long, conflicts_with = "exclusive")]
    pub(crate) shared: bool,
    /// Take an exclusive lock (the default).
    #[arg(short = 'x', long)]
    pub(crate) exclusive: bool,
    /// Exit code when the lock is not acquired (busy with -n, or -w ran out).
    #[arg(short = 'E', long, value_name = "N", default_value_t = crate::exit::DEFAULT_CONFLICT)]
    pub(crate) conflict_exit_code: u8,
    /// Say nothing when the lock is not acquired (also the case with -E 0, as a skipped
    /// cron run should not send mail).
    #[arg(short = 'q', long)]
    pub(crate) quiet: bool,
    /// What to do with the command when the lock is lost.
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = OnLost::Term)]
    pub(crate) on_lost: OnLost,
    /// With --on-lost term: how long after SIGTERM the command gets SIGKILL.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s")]
    pub(crate) grace: Duration,
    /// How often the held session is checked, which bounds how long a silent loss
    /// (hung server, cut network) goes unnoticed; 0 turns it off.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s")]
    pub(crate) keepalive: Duration,
    /// The lease: if this host vanishes without closing its connection (power loss, a
    /// frozen VM, a cut network), the server frees the lock within it, and the command is
    /// stopped at least 5s before that [default: 60s; 0 leaves the server's timers alone,
    /// and so does --keepalive 0].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) lease: Option<Duration>,
    /// How long a held lock whose server process stops answering (stopped, or too busy)
    /// is kept while the server shows that process alive, before it counts as lost; 0,
    /// the default, gives it up once a keepalive goes unanswered. It lengthens how long a
    /// host cut off from the server takes to be told by as much (the lease's timers
    /// follow).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0s")]
    pub(crate) stall_patience: Duration,
    /// Hold this process to the lease also when it stops while its host runs (SIGSTOP,
    /// Ctrl-Z, a debugger): the server ends a lock session that sent nothing for the
    /// lease's bound, and frees the lock; woken, pglock finds the lock lost and acts as
    /// --on-lost says. Needs a lease and PostgreSQL 14 or later.
    #[arg(long)]
    pub(crate) expire_stopped: bool,
    /// Hand the command a fencing token (PGLOCK_FENCING_TOKEN) that grows with every grant.
    #[arg(long)]
    pub(crate) fencing: bool,
    /// Take one of N permits of the semaphore KEY instead of its lock: at most N commands
    /// run at once, fleet-wide (every pglock and library user of KEY must give the same N).
    #[arg(
        long,
        value_name = "N",
        conflicts_with_all = ["shared", "exclusive"],
        value_parser = clap::value_parser!(u32).range(1..=i64::from(locks_port::MAX_PERMITS))
    )]
    pub(crate) permits: Option<u32>,
    /// Lead: wait to be the one holder of KEY (a semaphore of one permit), run the command,
    /// and when leadership is lost stop the command as --on-lost says and campaign again
    /// after --backoff; exits when the command exits on its own.
    #[arg(long, conflicts_with_all = ["no_wait", "timeout", "permits", "shared"])]
    pub(crate) leader: bool,
    /// With --leader: publish VALUE with each term (an address, a version) on the leader
    /// board, for `pglock who --leader` and the library's observers; creates the board's
    /// table if it is missing.
    #[arg(long, value_name = "VALUE", requires = "leader")]
    pub(crate) publish: Option<String>,
    /// With --leader: the pause before campaigning again after a lost leadership.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s",
          requires = "leader")]
    pub(crate) backoff: Duration,
    /// Run at most once per slot of DURATION across every host: slots divide the server's
    /// clock from the Unix epoch (2s slots start at even seconds), the slot is recorded in
    /// the ledger table (`pglock jobs --install`), and a host whose slot already ran, or is
    /// running, exits 0 and prints nothing.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          conflicts_with_all = ["permits", "leader", "shared", "timeout", "fencing"])]
    pub(crate) once_per: Option<Duration>,
    /// Divide the shards SHARDS (a count N, meaning 0 to N-1, or names separated by
    /// commas) of the shard group KEY among every pglock and library member of KEY, and
    /// run the command once per shard this process owns, `{shard}` in its arguments
    /// replaced by the shard's name (PGLOCK_SHARD and PGLOCK_SHARD_TOKEN in its
    /// environment). A shard that moves away gets SIGTERM, then SIGKILL after --grace; a
    /// lost one SIGKILL at once. INT or TERM hands every shard over and exits. Creates the
    /// term table if it is missing.
    #[arg(long, value_name = "SHARDS",
          conflicts_with_all = ["permits", "leader", "shared", "timeout", "no_wait", "once_per", "fencing"])]
    pub(crate) shards: Option<String>,
    /// The command.
    #[command(flatten)]
    pub(crate) command: CommandArgs,
}

/// `pglock schedule`.
#[derive(Debug, Args)]
#[command(
    override_usage = "pglock schedule [OPTIONS] SCHEDULE KEY [--] CMD [ARGS]...\n       pglock schedule [OPTIONS] SCHEDULE KEY -c SHELL_COMMAND"
)]
pub(crate) struct ScheduleArgs {
    /// A cron expression (`30 2 * * *`, six fields with seconds first) or a period
    /// (`every 1h at :05`, `2s`), in UTC.
    pub(crate) schedule: String,
    /// The job's key (its lock and ledger name).
    #[arg(value_parser = parse_key)]
    pub(crate) key: String,
    /// How long after SIGTERM a command whose lock was lost gets SIGKILL.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s")]
    pub(crate) grace: Duration,
    /// How often the held session is checked while the command runs; 0 turns it off.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s")]
    pub(crate) keepalive: Duration,
    /// The command.
    #[command(flatten)]
    pub(crate) command: CommandArgs,
}

/// The command of `run` and `schedule`: CMD ARGS, or `-c SHELL_COMMAND`.
#[derive(Debug, Args)]
pub(crate) struct CommandArgs {
    /// Run this through `sh -c` instead of CMD.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL_COMMAND",
        conflicts_with = "argv"
    )]
    pub(crate) shell_command: Option<OsString>,
    /// The command and its arguments.
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "shell_command"
    )]
    pub(crate) argv: Vec<OsString>,
}

impl CommandArgs {
    /// The program and its arguments: `sh -c SHELL_COMMAND`, or CMD ARGS; bytes, as the
    /// command line gave them (not necessarily UTF-8).
    pub(crate) fn program(&self) -> Vec<OsString> {
        match &self.shell_command {
            Some(command) => vec!["sh".into(), "-c".into(), command.clone()],
            None => self.argv.clone(),
        }
    }
}

/// `--on-lost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnLost {
    /// SIGTERM, then SIGKILL after --grace.
    Term,
    /// SIGKILL at once.
    Kill,
    /// Let it run (pglock still exits 75 when it ends).
    Ignore,
}

/// A lock key: any text but the empty one, which an unset `$KEY` would give every job.
fn parse_key(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err(
            "the key is empty (an unset variable?): every job would share one lock".to_owned(),
        );
    }
    Ok(text.to_owned())
}

impl RunArgs {
    /// Whether a lock not acquired goes unsaid: `-q`, or `-E 0` (a skip, not a failure).
    pub(crate) fn silent_conflict(&self) -> bool {
        self.quiet || self.conflict_exit_code == 0
    }

    /// The program and its arguments: `sh -c SHELL_COMMAND`, or CMD ARGS.
    pub(crate) fn program(&self) -> Vec<OsString> {
        self.command.program()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("pglock").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_a_command_after_the_key_with_or_without_dashes() {
        for args in [
            &["run", "k", "--", "echo", "-n", "x"][..],
            &["run", "k", "echo", "-n", "x"][..],
            &["run", "-n", "k", "--", "echo", "-n", "x"][..],
        ] {
            let Command::Run(run) = parse(args).unwrap().command else {
                panic!("not run")
            };
            assert_eq!(run.program(), ["echo", "-n", "x"], "{args:?}");
        }
        let Command::Run(run) = parse(&["run", "k", "-c", "exit 3"]).unwrap().command else {
            panic!("not run")
        };
        assert_eq!(run.program(), ["sh", "-c", "exit 3"]);
        assert_eq!(run.conflict_exit_code, 1);
        assert_eq!(run.on_lost, OnLost::Term);
        assert_eq!(run.grace, Duration::from_secs(5));
    }

    #[test]
    fn schedule_takes_its_command_as_run_does() {
        for (args, program) in [
            (
                &["schedule", "every 2s", "k", "--", "echo", "-n"][..],
                &["echo", "-n"][..],
            ),
            (
                &["schedule", "every 2s", "k", "echo", "-n"][..],
                &["echo", "-n"][..],
            ),
            (
                &["schedule", "every 2s", "k", "-c", "exit 3"][..],
                &["sh", "-c", "exit 3"][..],
            ),
        ] {
            let Command::Schedule(schedule) = parse(args).unwrap().command else {
                panic!("not schedule")
            };
            assert_eq!(schedule.command.program(), program, "{args:?}");
        }
        for args in [
            &["schedule", "every 2s", "k"][..],
            &["schedule", "every 2s", "k", "-c", "true", "--", "true"][..],
            &["schedule", "every 2s", "", "--", "true"][..],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn bad_command_lines_are_refused() {
        for args in [
            &["run", "k"][..],
            &["run", "k", "-n", "-w", "1s", "--", "true"][..],
            &["run", "k", "-w", "soon", "--", "true"][..],
            &["run", "k", "-s", "-x", "--", "true"][..],
            &["run", "k", "-E", "256", "--", "true"][..],
            &["run", "k", "-c", "true", "--", "true"][..],
            &["run", "k", "--on-lost", "shrug", "--", "true"][..],
            &["who"][..],
            &["break"][..],
            &["list", "--json", "--watch", "1s"][..],
            &["list", "--watch", "soon"][..],
            &["break", "k", "--yes", "extra"][..],
            &["run", "", "--", "true"][..],
            &["who", ""][..],
            &["break", ""][..],
            &["id", ""][..],
            &["run", "--permits", "0", "k", "--", "true"][..],
            &["run", "--permits", "65537", "k", "--", "true"][..],
        ] {
            assert!(parse(args).is_err(), "{args:?} was accepted");
        }
    }
}
