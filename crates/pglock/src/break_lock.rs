//! `pglock break KEY`: end the session that holds a stuck lock, or the permits of the
//! semaphore KEY (`--permits`, `--leader`), after showing them and asking.
//!
//! The server frees a session-level advisory lock only when its session ends, so breaking
//! a lock means `pg_terminate_backend` of the holder's session. Each session is terminated
//! only if it still holds (or, with `--waiters`, waits for) the lock when the answer comes:
//! a holder that let go meanwhile, and any pid reused since, is left alone.

use std::io::IsTerminal;
use std::time::Duration;

use locks_postgres::tokio_postgres::{self, error::SqlState};
use tokio::time::Instant;

use crate::cli::BreakArgs;
use crate::connect::{self, Target};
use crate::exit::{DECLINED, Failure, NOPERM, SOFTWARE, USAGE, chain};
use crate::inspect::{self, Entry};
use crate::text::{Say, out};

/// How long a terminated session may take to go away before `break` says it has not.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// Terminates the sessions `args` names, as the manual says.
pub(crate) async fn run(target: &Target, args: BreakArgs, say: Say) -> Result<u8, Failure> {
    if !args.yes && !std::io::stdin().is_terminal() {
        return Err(Failure::new(
            USAGE,
            "break: no terminal to ask on (stdin is not a terminal); pass --yes to break the \
             lock without asking",
        ));
    }
    let key = &args.key;
    let quoted = crate::text::quoted(key);
    let lock_id = locks_port::lock_id(key);
    let client = connect::one_client(target, say).await?;
    let inspect_failure =
        |error: locks_postgres::InspectError| Failure::new(SOFTWARE, chain(&error));
    let mut entries = inspect::of(&client, lock_id)
        .await
        .map_err(inspect_failure)?;
    let mut of = Of::Lock(lock_id);
    if entries.is_empty() {
        // Not a lock: perhaps the semaphore KEY (`--permits`) or the leadership of KEY
        // (`--leader`, a semaphore of one permit).
        let class = locks_port::PermitDerivation::CURRENT.class(key);
        entries = inspect::semaphore_of(&client, class)
            .await
            .map_err(inspect_failure)?;
        of = Of::Semaphore(class);
    }
    let (targets, spared): (Vec<Entry>, Vec<Entry>) = entries
        .into_iter()
        .filter(|entry| entry.pid.is_some())
        .partition(|entry| entry.granted || args.waiters);
    if targets.is_empty() {
        let what = if args.waiters {
            "holds or waits for"
        } else {
            "holds"
        };
        out(format_args!(
            "nobody {what} {quoted} (lock id {lock_id}): nothing to break\n"
        ))?;
        return Ok(0);
    }
    match of {
        Of::Lock(_) => out(format_args!("{quoted} (lock id {lock_id}):\n"))?,
        Of::Semaphore(_) => out(format_args!(
            "the permits of the semaphore {quoted} (pglock run --permits or --leader):\n"
        ))?,
    }
    out(inspect::table(&targets, false))?;
    if let Some(hint) = inspect::hidden_hint(&targets) {
        eprintln!("pglock: {hint}");
    }
    if !spared.is_empty() {
        out(format_args!(
            "{} waiting session(s) left alone (--waiters terminates them too)\n",
            spared.len()
        ))?;
    }
    if !args.yes && !confirmed(targets.len()).await {
        eprintln!("pglock: nothing terminated");
        return Ok(DECLINED);
    }
    // Waiters first: a waiter still queued when its holder goes would be granted the lock.
    let waiters_first = targets
        .iter()
        .filter(|entry| !entry.granted)
        .chain(targets.iter().filter(|entry| entry.granted));
    for entry in waiters_first {
        let Some(pid) = entry.pid else { continue };
        if terminate(&client, of, pid, args.waiters).await? {
            if gone(&client, pid).await? {
                out(format_args!("terminated pid {pid}\n"))?;
            } else {
                return Err(Failure::new(
                    SOFTWARE,
                    format!(
                        "pid {pid} was told to terminate but is still there after {}",
                        crate::duration::show(GONE_WITHIN)
                    ),
                ));
            }
        } else {
            out(format_args!("pid {pid} had already let go: left alone\n"))?;
        }
    }
    Ok(0)
}

/// Asks on the terminal; `true` for `y` or `yes`.
async fn confirmed(count: usize) -> bool {
    let question = if count == 1 {
        "terminate this session? [y/N] ".to_owned()
    } else {
        format!("terminate these {count} sessions? [y/N] ")
    };
    eprint!("{question}");
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await;
    matches!(
        answer.as_ref().map(|line| line.as_ref().map(|line| line.trim().to_lowercase())),
        Ok(Ok(answer)) if answer == "y" || answer == "yes"
    )
}

/// What `break` ends the sessions of.
#[derive(Debug, Clone, Copy)]
enum Of {
    /// The lock with this 64-bit id.
    Lock(i64),
    /// The semaphore whose locks have this class: its permits (slots `0..N`).
    Semaphore(i32),
}

/// `pg_terminate_backend(pid)` if `pid` still holds the lock or a permit of the semaphore
/// (or waits for it, with `waiters`); `false` when it no longer does.
async fn terminate(
    client: &tokio_postgres::Client,
    of: Of,
    pid: i32,
    waiters: bool,
) -> Result<bool, Failure> {
    // pg_locks shows a 64-bit key as (classid, objid) = (high, low) with objsubid 1, and a
    // two-`integer` key (class, slot) with objsubid 2; a permit is a slot below 2^31.
    let (subid, high, low_below): (i16, i64, Option<i64>) = match of {
        Of::Lock(lock_id) => {
            let bits = u64::from_be_bytes(lock_id.to_be_bytes());
            let high = i64::try_from(bits >> 32).unwrap_or_default();
            let low = i64::try_from(bits & 0xFFFF_FFFF).unwrap_or_default();
            (1, high, Some(low))
        }
        Of::Semaphore(class) => (2, i64::from(class), None),
    };
    let rows = client
        .query(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
             WHERE l.locktype = 'advisory' AND l.objsubid = $1 \
               AND l.classid::int8 = $2 AND l.pid = $4 \
               AND CASE WHEN $3::int8 IS NULL \
                        THEN (l.granted AND l.objid::int8 < 2147483648) OR (NOT l.granted AND $5) \
                        ELSE l.objid::int8 = $3 AND (l.granted OR $5) END \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             LIMIT 1",
            &[&subid, &high, &low_below, &pid, &waiters],
        )
        .await
        .map_err(|error| refused(&error, pid))?;
    Ok(rows
        .iter()
        .any(|row| row.get::<_, Option<bool>>(0) == Some(true)))
}

/// The failure for a refused `pg_terminate_backend`: exit 77 when the role lacks the
/// privilege, in the server's words.
fn refused(error: &tokio_postgres::Error, pid: i32) -> Failure {
    let Some(db) = error.as_db_error() else {
        return Failure::new(SOFTWARE, format!("cannot end pid {pid}: {}", chain(error)));
    };
    let detail = db
        .detail()
        .map(|detail| format!(" ({detail})"))
        .unwrap_or_default();
    let code = if db.code() == &SqlState::INSUFFICIENT_PRIVILEGE {
        NOPERM
    } else {
        SOFTWARE
    };
    Failure::new(
        code,
        format!("cannot end pid {pid}: {}{detail}", db.message()),
    )
}

/// Waits up to [`GONE_WITHIN`] for `pid`'s session to leave `pg_stat_activity`.
async fn gone(client: &tokio_postgres::Client, pid: i32) -> Result<bool, Failure> {
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        let rows = client
            .query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .await
            .map_err(|error| Failure::new(SOFTWARE, chain(&error)))?;
        if rows.is_empty() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
