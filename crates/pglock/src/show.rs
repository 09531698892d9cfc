//! `pglock who KEY` and `pglock list`: who holds and who waits, as a table for people or
//! one JSON document for scripts; `list --watch` redraws the list until interrupted.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use locks_postgres::{InspectError, LockTableUsage, lock_table_usage};

use crate::connect::{self, Target};
use crate::exit::{Failure, SOFTWARE, USAGE, chain};
use crate::inspect::{self, Entry};
use crate::json;
use crate::text::{Say, out};

/// The shortest `--watch` interval: a live view, not a load test of `pg_locks`.
const SHORTEST_WATCH: Duration = Duration::from_millis(100);

fn query_failure(error: InspectError) -> Failure {
    Failure::new(SOFTWARE, chain(&error))
}

/// `pglock who KEY [--json]`.
pub(crate) async fn who(target: &Target, say: Say, key: &str, json: bool) -> Result<u8, Failure> {
    let client = connect::one_client(target, say).await?;
    let lock_id = locks_port::lock_id(key);
    let entries = inspect::of(&client, lock_id).await.map_err(query_failure)?;
    let permits = locks_postgres::semaphore_holders(&client, key)
        .await
        .map_err(query_failure)?;
    if json {
        out(json::who(key, lock_id, &entries, &permits))?;
        hint(&entries);
        return Ok(0);
    }
    let quoted = crate::text::quoted(key);
    let semaphore = !permits.permits.is_empty();
    if entries.is_empty() && !semaphore {
        out(format_args!(
            "nobody holds or waits for {quoted} (lock id {lock_id})\n"
        ))?;
    } else if !entries.is_empty() {
        out(format_args!("{quoted} (lock id {lock_id}):\n"))?;
        out(inspect::table(&entries, false))?;
    }
    hint(&entries);
    if semaphore {
        out(permits_text(key, &permits))?;
    }
    Ok(0)
}

/// The permits of the semaphore `key`: N, each held slot with its holder and since when,
/// and how many wait.
fn permits_text(key: &str, holders: &locks_port::PermitHolders) -> String {
    let numbers: Vec<String> = holders.permits.iter().map(u32::to_string).collect();
    let mut text = format!(
        "semaphore {} ({} permits{}): {} held, {} waiting\n",
        crate::text::quoted(key),
        numbers.join(" and "),
        if numbers.len() > 1 {
            ", DISAGREEING"
        } else {
            ""
        },
        holders.held.len(),
        holders.waiting
    );
    for held in &holders.held {
        text.push_str(&format!(
            "  permit {:<4} {:<24} since {}\n",
            held.slot,
            crate::text::escaped(held.holder_id.as_deref().unwrap_or("-")),
            held.since.map_or_else(|| "?".to_owned(), inspect::rfc3339)
        ));
    }
    text
}

/// `pglock list [--json | --watch DURATION]`.
pub(crate) async fn list(
    target: &Target,
    say: Say,
    json: bool,
    watch: Option<Duration>,
) -> Result<u8, Failure> {
    if let Some(every) = watch
        && every < SHORTEST_WATCH
    {
        return Err(Failure::new(
            USAGE,
            format!(
                "--watch: {} is too often; the shortest interval is {}",
                crate::duration::show(every),
                crate::duration::show(SHORTEST_WATCH)
            ),
        ));
    }
    let client = connect::one_client(target, say).await?;
    let Some(every) = watch else {
        let entries = inspect::all(&client).await.map_err(query_failure)?;
        let usage = lock_table_usage(&client).await.map_err(query_failure)?;
        out(list_text(&entries, json, usage))?;
        hint(&entries);
        return Ok(0);
    };
    // On a terminal each round replaces the screen, as watch(1) does; into a pipe or a file
    // each round is appended after a header line, so a log of it reads in order.
    let terminal = std::io::stdout().is_terminal();
    loop {
        let entries = inspect::all(&client).await.map_err(query_failure)?;
        let usage = lock_table_usage(&client).await.map_err(query_failure)?;
        let header = format!(
            "every {}: pglock list    {}",
            crate::duration::show(every),
            inspect::rfc3339(locks_port::time::OffsetDateTime::now_utc())
        );
        let mut out = std::io::stdout().lock();
        let clear = if terminal { "\x1b[H\x1b[2J" } else { "" };
        let written = write!(
            out,
            "{clear}{header}\n\n{}",
            list_text(&entries, false, usage)
        )
        .and_then(|()| if terminal { Ok(()) } else { writeln!(out) })
        .and_then(|()| out.flush());
        if written.is_err() {
            // The reader went away (`pglock list --watch 1s | head`): done.
            return Ok(0);
        }
        drop(out);
        tokio::time::sleep(every).await;
    }
}

/// The `pg_read_all_stats` hint on stderr, when the server hid some sessions' details.
fn hint(entries: &[Entry]) {
    if let Some(hint) = inspect::hidden_hint(entries) {
        eprintln!("pglock: {hint}");
    }
}

/// The list as a table or `no advisory locks` line that ends with how full the server's
/// lock table is, or as a JSON document that carries it (`lock_table_usage`).
fn list_text(entries: &[Entry], json: bool, usage: LockTableUsage) -> String {
    if json {
        return json::list(entries, usage);
    }
    let mut text = if entries.is_empty() {
        "no advisory locks on this database\n".to_owned()
    } else {
        inspect::table(entries, true)
    };
    text.push_str(&lock_table_line(usage));
    text
}

/// `lock table: 624 advisory entries (all databases) of 200 documented (312%; …)`.
fn lock_table_line(usage: LockTableUsage) -> String {
    format!(
        "lock table: {} advisory entries (all databases) of {} documented ({:.0}%; \
         max_locks_per_transaction x (max_connections + max_prepared_transactions))\n",
        usage.advisory,
        usage.capacity,
        usage.fraction() * 100.0
    )
}
