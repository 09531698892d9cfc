//! The server's queue around a wait of `pglock run`: who keeps a busy lock, and leaving
//! nothing queued after a cancelled wait.

use std::time::Duration;

use locks_postgres::deadpool_postgres::Pool;
use tokio::time::Instant;

use crate::inspect;
use crate::text::Say;

/// How long a cancelled wait is given to leave the server's queue on its own.
const CANCEL_GRACE: Duration = Duration::from_millis(300);
/// How long pglock waits at most, after cancelling, for the queue to show nothing of it:
/// a signal is obeyed within this even when the server is frozen (its session then goes
/// when the server notices the closed connection).
pub(crate) const CANCEL_SETTLE: Duration = Duration::from_secs(1);

/// Who keeps the lock, as [`holder_note`] says; for a semaphore, that its permits are all
/// held (`pglock who` lists them).
pub(crate) async fn busy_note(pool: &Pool, lock_id: i64, permits: Option<u32>) -> String {
    match permits {
        Some(permits) => format!(" (all {permits} permits held)"),
        None => holder_note(pool, lock_id).await,
    }
}

/// ` (held by pid N, APPLICATION)` for a busy lock, or nothing if the server cannot say.
async fn holder_note(pool: &Pool, lock_id: i64) -> String {
    let Ok(client) = pool.get().await else {
        return String::new();
    };
    let Ok(entries) = inspect::of(&client, lock_id).await else {
        return String::new();
    };
    let holders: Vec<String> = entries
        .iter()
        .filter(|entry| entry.granted)
        .map(|entry| {
            if entry.application.is_empty() {
                format!("pid {}", entry.pid_text())
            } else {
                format!("pid {} {}", entry.pid_text(), entry.application)
            }
        })
        .collect();
    if holders.is_empty() {
        String::new()
    } else {
        format!(" (held by {})", holders.join(", "))
    }
}

/// Waits (a bounded time) until the server shows no lock or wait of this process's
/// sessions. The library cancels a dropped wait with a plain-text cancel request, which a
/// server that insists on TLS refuses; a session still queued after [`CANCEL_GRACE`] is
/// terminated over our own (TLS) connection.
pub(crate) async fn settle(pool: &Pool, application: &str, say: Say) {
    let started = Instant::now();
    let Ok(client) = pool.get().await else {
        say.say("cannot check the server after cancelling");
        return;
    };
    let mut terminated = false;
    loop {
        let pids = match inspect::pids_of_application(&client, application).await {
            Ok(pids) => pids,
            Err(error) => {
                say.say(format!("cannot check the server after cancelling: {error}"));
                return;
            }
        };
        if pids.is_empty() {
            return;
        }
        if started.elapsed() >= CANCEL_SETTLE {
            say.say(format!("sessions {pids:?} still queued; exiting anyway"));
            return;
        }
        if !terminated && started.elapsed() >= CANCEL_GRACE {
            say.say(format!(
                "terminating our sessions {pids:?} still in the queue"
            ));
            for pid in &pids {
                let _ = client
                    .execute("SELECT pg_terminate_backend($1)", &[pid])
                    .await;
            }
            terminated = true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
