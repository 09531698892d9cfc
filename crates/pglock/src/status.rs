//! The live one-line status on a terminal while waiting: who holds the lock, how long
//! this wait has lasted. Nothing when stderr is not a terminal.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use locks_postgres::deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::duration::show;
use crate::inspect::{self, Entry};

/// How often the line is redrawn (and the holders looked up).
const REFRESH: Duration = Duration::from_millis(500);

/// A running status line; dropping it clears the line.
#[derive(Debug)]
pub(crate) struct StatusLine {
    task: JoinHandle<()>,
}

impl StatusLine {
    /// Starts the line if stderr is a terminal. `own_application` is this process's
    /// `application_name`, so its own waiting session is not shown as a waiter.
    pub(crate) fn start(
        pool: Pool,
        key: &str,
        lock_id: i64,
        own_application: &str,
    ) -> Option<Self> {
        if !std::io::stderr().is_terminal() {
            return None;
        }
        let key = key.to_owned();
        let own = own_application.to_owned();
        let started = Instant::now();
        let width = terminal_width();
        let task = tokio::spawn(async move {
            let mut entries: Vec<Entry> = Vec::new();
            loop {
                if let Ok(client) = pool.get().await
                    && let Ok(found) = inspect::of(&client, lock_id).await
                {
                    entries = found;
                }
                let line = render(&key, started.elapsed(), &entries, &own);
                let line: String = line.chars().take(width).collect();
                draw(&line);
                tokio::time::sleep(REFRESH).await;
            }
        });
        Some(Self { task })
    }
}

impl Drop for StatusLine {
    fn drop(&mut self) {
        self.task.abort();
        draw("");
    }
}

/// The width of the terminal on stderr (so the line never wraps), else `COLUMNS`, else 80;
/// one less, for the cursor.
fn terminal_width() -> usize {
    let columns = rustix::termios::tcgetwinsize(std::io::stderr())
        .ok()
        .map(|size| usize::from(size.ws_col))
        .filter(|columns| *columns > 0)
        .or_else(|| {
            std::env::var("COLUMNS")
                .ok()
                .and_then(|columns| columns.parse().ok())
        })
        .unwrap_or(80);
    columns.max(20) - 1
}

/// Replaces the terminal's current line with `line`.
fn draw(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "\r\x1b[2K{line}");
    let _ = stderr.flush();
}

/// The status text.
fn render(key: &str, waited: Duration, entries: &[Entry], own: &str) -> String {
    let mut line = format!(
        "pglock: waiting {} for {}",
        show(waited),
        crate::text::quoted(key)
    );
    let holders: Vec<&Entry> = entries.iter().filter(|entry| entry.granted).collect();
    let others_waiting = entries
        .iter()
        .filter(|entry| !entry.granted && entry.application != own)
        .count();
    if let Some(first) = holders.first() {
        line.push_str(&format!(" — held by pid {}", first.pid_text()));
        let mut about = Vec::new();
        if !first.application.is_empty() {
            about.push(crate::text::escaped(&first.application));
        }
        if let Some(client) = &first.client {
            about.push(crate::text::escaped(client));
        }
        if let Some(seconds) = first.seconds {
            about.push(format!(
                "session {} old",
                show(Duration::from_secs_f64(seconds))
            ));
        }
        line.push_str(&format!(" ({})", about.join(", ")));
        if holders.len() > 1 {
            line.push_str(&format!(" and {} more", holders.len() - 1));
        }
    }
    if others_waiting > 0 {
        line.push_str(&format!("; {others_waiting} more waiting"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_holder_and_leaves_out_our_own_wait() {
        let holder = Entry {
            lock: "1".into(),
            lock_id: Some(1),
            pid: Some(4242),
            granted: true,
            mode: "exclusive",
            application: "locks:deploy@web1:7".into(),
            client: Some("10.0.0.5".into()),
            since: None,
            seconds: Some(75.0),
            hidden: false,
        };
        let ours = Entry {
            pid: Some(4243),
            granted: false,
            application: "locks:pglock@web2:8".into(),
            ..holder.clone()
        };
        let line = render(
            "job",
            Duration::from_secs(12),
            &[holder, ours],
            "locks:pglock@web2:8",
        );
        assert_eq!(
            line,
            "pglock: waiting 12s for 'job' — held by pid 4242 (locks:deploy@web1:7, 10.0.0.5, \
             session 1m15s old)"
        );
        assert_eq!(
            render("job", Duration::from_millis(300), &[], ""),
            "pglock: waiting 300ms for 'job'"
        );
    }
}
