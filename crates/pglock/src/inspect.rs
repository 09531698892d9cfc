//! Who holds and who waits for advisory locks, from the library's inspection
//! (`pg_locks` joined with `pg_stat_activity`), as lines for people.

use locks_port::time::OffsetDateTime;

use crate::text::escaped;
use locks_postgres::tokio_postgres;
use locks_postgres::{
    AdvisoryLockId, InspectError, LockHolder, LockMode, all_lock_holders, lock_holders,
};

/// One session's grant of, or wait for, an advisory lock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// The lock: a 64-bit id, or `a,b` for the two-`int4` form.
    pub(crate) lock: String,
    /// The 64-bit lock id, when the lock has that form.
    pub(crate) lock_id: Option<i64>,
    /// The backend process id (none for a prepared transaction).
    pub(crate) pid: Option<i32>,
    /// Held (`true`) or awaited.
    pub(crate) granted: bool,
    /// `exclusive` or `shared`.
    pub(crate) mode: &'static str,
    /// `application_name` of the session.
    pub(crate) application: String,
    /// The client's address, or `local` for a Unix socket; `None` when the server hides it.
    pub(crate) client: Option<String>,
    /// For a waiter, since when it waits; for a holder, since its session started
    /// (PostgreSQL does not record when an advisory lock was granted).
    pub(crate) since: Option<OffsetDateTime>,
    /// Seconds since `since`; `None` when the server hides it.
    pub(crate) seconds: Option<f64>,
    /// Whether the server hides this session's details from our role (another role's
    /// session, without `pg_read_all_stats`).
    pub(crate) hidden: bool,
}

impl Entry {
    /// The holder id, for sessions of this library (`application_name` `locks:<id>`).
    pub(crate) fn holder_id(&self) -> Option<&str> {
        self.application.strip_prefix("locks:")
    }

    /// The pid as text, `-` for a prepared transaction (which has no session).
    pub(crate) fn pid_text(&self) -> String {
        self.pid
            .map_or_else(|| "-".to_owned(), |pid| pid.to_string())
    }
}

#[cfg(test)]
impl Entry {
    /// A library session `job@web1:9` (pid 7) holding lock 42 since 2026-12-02 18:00:00Z.
    pub(crate) fn held_by_a_job() -> Self {
        Self {
            lock: "42".into(),
            lock_id: Some(42),
            pid: Some(7),
            granted: true,
            mode: "exclusive",
            application: "locks:job@web1:9".into(),
            client: Some("local".into()),
            since: OffsetDateTime::from_unix_timestamp(1_796_234_400).ok(),
            seconds: Some(72.0),
            hidden: false,
        }
    }
}

/// Every advisory lock on the current database, by lock, holders first.
pub(crate) async fn all(client: &tokio_postgres::Client) -> Result<Vec<Entry>, InspectError> {
    let now = OffsetDateTime::now_utc();
    Ok(all_lock_holders(client)
        .await?
        .iter()
        .map(|holder| entry(holder, now))
        .collect())
}

/// The holders and waiters of the 64-bit advisory lock `lock_id`, holders first.
pub(crate) async fn of(
    client: &tokio_postgres::Client,
    lock_id: i64,
) -> Result<Vec<Entry>, InspectError> {
    let now = OffsetDateTime::now_utc();
    Ok(lock_holders(client, lock_id)
        .await?
        .iter()
        .map(|holder| entry(holder, now))
        .collect())
}

/// The sessions of the semaphore whose locks have `class` (`pglock run --permits`,
/// `--leader`): those holding a permit (a slot `0..N`), and those waiting for one.
/// A session appears once, as a holder if it holds a permit.
pub(crate) async fn semaphore_of(
    client: &tokio_postgres::Client,
    class: i32,
) -> Result<Vec<Entry>, InspectError> {
    let now = OffsetDateTime::now_utc();
    let holders = all_lock_holders(client).await?;
    let of_class = |holder: &&LockHolder| matches!(holder.lock, AdvisoryLockId::Int4Pair(of, _) if of == class);
    let permit = |holder: &&LockHolder| {
        holder.granted && matches!(holder.lock, AdvisoryLockId::Int4Pair(_, slot) if slot >= 0)
    };
    let mut entries: Vec<Entry> = holders
        .iter()
        .filter(of_class)
        .filter(permit)
        .map(|holder| entry(holder, now))
        .collect();
    let mut seen: Vec<Option<i32>> = entries.iter().map(|entry| entry.pid).collect();
    for holder in holders
        .iter()
        .filter(of_class)
        .filter(|holder| !holder.granted)
    {
        if !seen.contains(&holder.pid) {
            seen.push(holder.pid);
            entries.push(entry(holder, now));
        }
    }
    Ok(entries)
}

/// The pids of sessions named `application_name` that hold or wait for an advisory lock.
pub(crate) async fn pids_of_application(
    client: &tokio_postgres::Client,
    application_name: &str,
) -> Result<Vec<i32>, InspectError> {
    let mut pids: Vec<i32> = all_lock_holders(client)
        .await?
        .iter()
        .filter(|holder| holder.application_name.as_deref() == Some(application_name))
        .filter_map(|holder| holder.pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

fn entry(holder: &LockHolder, now: OffsetDateTime) -> Entry {
    let (lock, lock_id) = match holder.lock {
        AdvisoryLockId::Int8(id) => (id.to_string(), Some(id)),
        AdvisoryLockId::Int4Pair(high, low) => (format!("{high},{low}"), None),
        _ => ("?".to_owned(), None),
    };
    // A session always has a start; the server leaves it out only when it hides the
    // session's details from this role.
    let hidden = holder.pid.is_some() && holder.backend_start.is_none();
    let since = if holder.granted {
        holder.backend_start
    } else {
        holder.waiting_since.or(holder.backend_start)
    };
    Entry {
        lock,
        lock_id,
        pid: holder.pid,
        granted: holder.granted,
        mode: if holder.mode == LockMode::Shared {
            "shared"
        } else {
            "exclusive"
        },
        application: holder.application_name.clone().unwrap_or_default(),
        client: match (holder.client_addr, holder.pid) {
            (Some(address), _) => Some(address.to_string()),
            (None, Some(_)) if hidden => None,
            (None, Some(_)) => Some("local".to_owned()),
            (None, None) => Some("prepared transaction".to_owned()),
        },
        since,
        seconds: since.map(|since| (now - since).as_seconds_f64().max(0.0)),
        hidden,
    }
}

/// `2026-12-02 18:40:01Z`, for people.
fn utc(time: OffsetDateTime) -> String {
    timestamp(time, ' ')
}

/// `2026-12-02T18:40:01Z` (RFC 3339, whole seconds, UTC), for programs.
pub(crate) fn rfc3339(time: OffsetDateTime) -> String {
    timestamp(time, 'T')
}

/// `2026-12-02T18:40:01.123456Z`: a term's start to the microsecond, as the board keeps it.
pub(crate) fn rfc3339_micros(time: locks_port::time::OffsetDateTime) -> String {
    let seconds = rfc3339(time);
    let micros = time
        .to_offset(locks_port::time::UtcOffset::UTC)
        .microsecond();
    format!("{}.{micros:06}Z", seconds.trim_end_matches('Z'))
}

fn timestamp(time: OffsetDateTime, separator: char) -> String {
    let time = time.to_offset(locks_port::time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}{separator}{:02}:{:02}:{:02}Z",
        time.year(),
        u8::from(time.month()),
        time.day(),
        time.hour(),
        time.minute(),
        time.second()
    )
}

/// How a table shows a value the server did not give.
const UNKNOWN: &str = "?";

/// The hint for when the server hid some sessions' details, or `None`.
pub(crate) fn hidden_hint(entries: &[Entry]) -> Option<&'static str> {
    entries.iter().any(|entry| entry.hidden).then_some(
        "the server hides other roles' sessions from this role (shown as ?, null in JSON); \
         grant it pg_read_all_stats to see them",
    )
}

/// Aligned columns, one line per entry, with a header; `with_lock` adds the LOCK column.
pub(crate) fn table(entries: &[Entry], with_lock: bool) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut header = vec![
        "STATE",
        "PID",
        "MODE",
        "SINCE",
        "FOR",
        "APPLICATION",
        "CLIENT",
        "HOLDER",
    ];
    if with_lock {
        header.insert(0, "LOCK");
    }
    rows.push(header.into_iter().map(str::to_owned).collect());
    for entry in entries {
        let mut row = vec![
            if entry.granted { "holds" } else { "waits" }.to_owned(),
            entry.pid_text(),
            entry.mode.to_owned(),
            entry.since.map_or_else(|| UNKNOWN.to_owned(), utc),
            entry.seconds.map_or_else(
                || UNKNOWN.to_owned(),
                |seconds| crate::duration::show(std::time::Duration::from_secs_f64(seconds)),
            ),
            escaped(&entry.application),
            entry
                .client
                .as_deref()
                .map_or_else(|| UNKNOWN.to_owned(), escaped),
            escaped(entry.holder_id().unwrap_or_default()),
        ];
        if with_lock {
            row.insert(0, entry.lock.clone());
        }
        rows.push(row);
    }
    let columns = rows[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_shown_in_utc() {
        let time = OffsetDateTime::from_unix_timestamp(1_796_300_000).unwrap();
        assert_eq!(utc(time), "2026-12-03 12:13:20Z");
        assert_eq!(rfc3339(time), "2026-12-03T12:13:20Z");
    }

    #[test]
    fn the_table_aligns_columns() {
        let entry = Entry::held_by_a_job();
        assert_eq!(entry.holder_id(), Some("job@web1:9"));
        let text = table(&[entry], false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("STATE  PID  MODE "), "{text}");
        assert!(lines[1].contains("holds  7    exclusive"), "{text}");
        assert!(
            lines[1].ends_with("1m12s  locks:job@web1:9  local   job@web1:9"),
            "{text}"
        );
    }
}
