//! Who holds and who waits for advisory locks: `pg_locks` joined with
//! `pg_stat_activity`.

use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::{self, Row};

/// One session's grant of, or wait for, an advisory lock.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// The lock: a 64-bit id, or `a,b` for the two-`int4` form.
    pub(crate) lock: String,
    /// The backend process id.
    pub(crate) pid: i32,
    /// Held (`true`) or awaited.
    pub(crate) granted: bool,
    /// `exclusive` or `shared`.
    pub(crate) mode: &'static str,
    /// `application_name` of the session.
    pub(crate) application: String,
    /// The client's address, or `local` for a Unix socket.
    pub(crate) client: String,
    /// For a waiter, since when it waits; for a holder, since its session started
    /// (PostgreSQL does not record when an advisory lock was granted). UTC.
    pub(crate) since: String,
    /// Seconds since `since`.
    pub(crate) seconds: f64,
}

impl Entry {
    /// The holder id, for sessions of this library (`application_name` `locks:<id>`).
    pub(crate) fn holder_id(&self) -> &str {
        self.application.strip_prefix("locks:").unwrap_or("")
    }
}

const SELECT: &str = "\
SELECT CASE WHEN l.objsubid = 1 THEN ((l.classid::bigint << 32) | l.objid::bigint)::text \
            ELSE l.classid::text || ',' || l.objid::text END AS lock, \
       l.pid, l.granted, l.mode, \
       coalesce(a.application_name, '') AS application, \
       coalesce(host(a.client_addr), CASE WHEN a.pid IS NOT NULL THEN 'local' END, '') AS client, \
       coalesce(to_char(s.since AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS\"Z\"'), '') AS since, \
       coalesce(extract(epoch FROM now() - s.since)::float8, 0) AS seconds \
FROM pg_locks l \
LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
CROSS JOIN LATERAL (SELECT CASE WHEN l.granted THEN a.backend_start \
                          ELSE coalesce((to_jsonb(l) ->> 'waitstart')::timestamptz, a.query_start) END \
                   AS since) s \
WHERE l.locktype = 'advisory' \
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) ";

/// Every advisory lock on the current database, by lock, holders first.
pub(crate) async fn all(
    client: &tokio_postgres::Client,
) -> Result<Vec<Entry>, tokio_postgres::Error> {
    let sql = format!("{SELECT} ORDER BY lock, l.granted DESC, seconds DESC, l.pid");
    let rows = client.query(&sql, &[]).await?;
    Ok(rows.iter().map(entry).collect())
}

/// The holders and waiters of the 64-bit advisory lock `lock_id`.
pub(crate) async fn of(
    client: &tokio_postgres::Client,
    lock_id: i64,
) -> Result<Vec<Entry>, tokio_postgres::Error> {
    let (high, low) = split(lock_id);
    let sql = format!(
        "{SELECT} AND l.objsubid = 1 AND l.classid::bigint = $1 AND l.objid::bigint = $2 \
         ORDER BY l.granted DESC, seconds DESC, l.pid"
    );
    let rows = client.query(&sql, &[&high, &low]).await?;
    Ok(rows.iter().map(entry).collect())
}

/// How many advisory locks sessions named `application_name` (other than the asking one)
/// hold or wait for.
pub(crate) async fn count_of_application(
    pool: &Pool,
    application_name: &str,
) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND a.application_name = $1 \
               AND l.pid <> pg_backend_pid()",
            &[&application_name],
        )
        .await?;
    Ok(row.get(0))
}

/// `pg_locks` shows a bigint advisory key as `classid` (high 32 bits) and `objid` (low).
fn split(lock_id: i64) -> (i64, i64) {
    let bits = u64::from_be_bytes(lock_id.to_be_bytes());
    let high = i64::from(u32::try_from(bits >> 32).unwrap_or(u32::MAX));
    let low = i64::from(u32::try_from(bits & 0xFFFF_FFFF).unwrap_or(u32::MAX));
    (high, low)
}

fn entry(row: &Row) -> Entry {
    let mode: String = row.get("mode");
    Entry {
        lock: row.get("lock"),
        pid: row.get("pid"),
        granted: row.get("granted"),
        mode: if mode == "ShareLock" {
            "shared"
        } else {
            "exclusive"
        },
        application: row.get("application"),
        client: row.get("client"),
        since: row.get("since"),
        seconds: row.get("seconds"),
    }
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
            entry.pid.to_string(),
            entry.mode.to_owned(),
            entry.since.clone(),
            crate::duration::show(std::time::Duration::from_secs_f64(entry.seconds.max(0.0))),
            entry.application.clone(),
            entry.client.clone(),
            entry.holder_id().to_owned(),
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
    fn ids_split_like_pg_locks_shows_them() {
        assert_eq!(split(0x0000_0001_0000_0002), (1, 2));
        assert_eq!(split(i64::MAX), (0x7FFF_FFFF, 0xFFFF_FFFF));
        assert_eq!(split(-1), (0xFFFF_FFFF, 0xFFFF_FFFF));
    }

    #[test]
    fn the_table_aligns_columns() {
        let entry = Entry {
            lock: "42".into(),
            pid: 7,
            granted: true,
            mode: "exclusive",
            application: "locks:job@web1:9".into(),
            client: "local".into(),
            since: "2026-12-02 18:00:00Z".into(),
            seconds: 72.0,
        };
        assert_eq!(entry.holder_id(), "job@web1:9");
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
