//! `pglock break KEY`: end the session that holds a stuck lock, after showing it and asking.
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
use crate::run::Say;

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
    let entries = inspect::of(&client, lock_id)
        .await
        .map_err(|error| Failure::new(SOFTWARE, chain(&error)))?;
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
        println!("nobody {what} {quoted} (lock id {lock_id}): nothing to break");
        return Ok(0);
    }
    println!("{quoted} (lock id {lock_id}):");
    print!("{}", inspect::table(&targets, false));
    if let Some(hint) = inspect::hidden_hint(&targets) {
        eprintln!("pglock: {hint}");
    }
    if !spared.is_empty() {
        println!(
            "{} waiting session(s) left alone (--waiters terminates them too)",
            spared.len()
        );
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
        if terminate(&client, lock_id, pid, args.waiters).await? {
            if gone(&client, pid).await? {
                println!("terminated pid {pid}");
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
            println!("pid {pid} had already let go: left alone");
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

/// `pg_terminate_backend(pid)` if `pid` still holds `lock_id` (or waits for it, with
/// `waiters`); `false` when it no longer does.
async fn terminate(
    client: &tokio_postgres::Client,
    lock_id: i64,
    pid: i32,
    waiters: bool,
) -> Result<bool, Failure> {
    let bits = u64::from_be_bytes(lock_id.to_be_bytes());
    let high = i64::try_from(bits >> 32).unwrap_or_default();
    let low = i64::try_from(bits & 0xFFFF_FFFF).unwrap_or_default();
    let rows = client
        .query(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
             WHERE l.locktype = 'advisory' AND l.objsubid = 1 \
               AND l.classid::int8 = $1 AND l.objid::int8 = $2 AND l.pid = $3 \
               AND (l.granted OR $4) \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&high, &low, &pid, &waiters],
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
