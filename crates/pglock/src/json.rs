//! `--json` on `who` and `list`: one JSON document on stdout, for scripts.
//!
//! The field names are a contract (the crate README's manual lists them): fields may be
//! added, none is renamed or removed, and a field that has no value is `null`, never
//! missing.

use locks_postgres::LockTableUsage;
use serde::Serialize;

use crate::inspect::{Entry, rfc3339};

/// `pglock who KEY --json`.
#[derive(Debug, Serialize)]
struct Who<'a> {
    key: &'a str,
    lock_id: i64,
    sessions: Vec<Session<'a>>,
    semaphore: Option<Permits<'a>>,
}

/// The permits of the semaphore KEY, when anyone holds or waits for one.
#[derive(Debug, Serialize)]
struct Permits<'a> {
    permits: &'a [u32],
    held: Vec<Permit<'a>>,
    waiting: usize,
}

#[derive(Debug, Serialize)]
struct Permit<'a> {
    slot: u32,
    holder_id: Option<&'a str>,
    since: Option<String>,
}

/// `pglock who --leader NAME --json`.
#[derive(Debug, Serialize)]
struct LeaderDocument<'a> {
    election: &'a str,
    leader: Option<LeaderFields<'a>>,
}

#[derive(Debug, Serialize)]
struct LeaderFields<'a> {
    holder_id: Option<&'a str>,
    term: Option<u64>,
    since: Option<String>,
    value: Option<&'a str>,
}

/// The document for `who --leader`, and a newline: the leader (`null` when nobody
/// leads) with its holder id, term, start (RFC 3339 to the microsecond) and value.
pub(crate) fn leader(election: &str, leader: Option<&locks_leader::Leader>) -> String {
    document(&LeaderDocument {
        election,
        leader: leader.map(|leader| LeaderFields {
            holder_id: leader.holder_id.as_deref(),
            term: leader.term,
            since: leader.since.map(crate::inspect::rfc3339_micros),
            value: leader.value.as_deref(),
        }),
    })
}

/// `pglock list --json`.
#[derive(Debug, Serialize)]
struct List<'a> {
    sessions: Vec<Session<'a>>,
    lock_table_usage: Usage,
}

/// How full the server's lock table is, as the text `list` ends with.
#[derive(Debug, Serialize)]
struct Usage {
    advisory: u64,
    entries: u64,
    capacity: u64,
    fraction: f64,
}

impl From<LockTableUsage> for Usage {
    fn from(usage: LockTableUsage) -> Self {
        Self {
            advisory: usage.advisory,
            entries: usage.entries,
            capacity: usage.capacity,
            fraction: usage.fraction(),
        }
    }
}

/// One session's grant of, or wait for, an advisory lock.
#[derive(Debug, Serialize)]
struct Session<'a> {
    lock: &'a str,
    lock_id: Option<i64>,
    state: &'static str,
    granted: bool,
    mode: &'static str,
    pid: Option<i32>,
    since: Option<String>,
    seconds: Option<f64>,
    application_name: &'a str,
    client: Option<&'a str>,
    holder_id: Option<&'a str>,
}

impl<'a> From<&'a Entry> for Session<'a> {
    fn from(entry: &'a Entry) -> Self {
        Self {
            lock: &entry.lock,
            lock_id: entry.lock_id,
            state: if entry.granted { "holds" } else { "waits" },
            granted: entry.granted,
            mode: entry.mode,
            pid: entry.pid,
            since: entry.since.map(rfc3339),
            seconds: entry.seconds,
            application_name: &entry.application,
            client: entry.client.as_deref(),
            holder_id: entry.holder_id(),
        }
    }
}

/// The document for `who KEY`, and a newline.
pub(crate) fn who(
    key: &str,
    lock_id: i64,
    entries: &[Entry],
    permits: &locks_port::PermitHolders,
) -> String {
    let semaphore = (!permits.permits.is_empty()).then(|| Permits {
        permits: &permits.permits,
        held: permits
            .held
            .iter()
            .map(|held| Permit {
                slot: held.slot,
                holder_id: held.holder_id.as_deref(),
                since: held.since.map(rfc3339),
            })
            .collect(),
        waiting: permits.waiting,
    });
    document(&Who {
        key,
        lock_id,
        sessions: entries.iter().map(Session::from).collect(),
        semaphore,
    })
}

/// The document for `list`, and a newline.
pub(crate) fn list(entries: &[Entry], usage: LockTableUsage) -> String {
    document(&List {
        sessions: entries.iter().map(Session::from).collect(),
        lock_table_usage: usage.into(),
    })
}

fn document(value: &impl Serialize) -> String {
    // Serializing these plain structs (strings, numbers, no maps with non-string keys)
    // cannot fail.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".to_owned());
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_keep_their_names_and_missing_values_are_null() {
        let entry = Entry {
            lock: "1,2".into(),
            lock_id: None,
            pid: None,
            granted: false,
            mode: "shared",
            application: String::new(),
            client: Some("prepared transaction".into()),
            since: None,
            seconds: Some(0.0),
            hidden: false,
        };
        let usage = LockTableUsage::new(3, 40, 6400);
        let value: serde_json::Value = serde_json::from_str(&list(&[entry], usage)).unwrap();
        assert_eq!(
            value["lock_table_usage"],
            serde_json::json!({
                "advisory": 3, "entries": 40, "capacity": 6400, "fraction": 3.0 / 6400.0
            })
        );
        let session = &value["sessions"][0];
        let names: Vec<&str> = session
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected = [
            "lock",
            "lock_id",
            "state",
            "granted",
            "mode",
            "pid",
            "since",
            "seconds",
            "application_name",
            "client",
            "holder_id",
        ];
        expected.sort_unstable();
        assert_eq!(names, expected);
        assert_eq!(session["state"], "waits");
        assert!(session["pid"].is_null() && session["holder_id"].is_null());

        let held = Entry::held_by_a_job();
        let none = locks_port::PermitHolders::default();
        let value: serde_json::Value = serde_json::from_str(&who("k", 42, &[held], &none)).unwrap();
        assert!(
            value["semaphore"].is_null(),
            "present, null without permits"
        );
        assert_eq!(value["key"], "k");
        assert_eq!(value["lock_id"], 42);
        assert_eq!(value["sessions"][0]["since"], "2026-12-02T18:00:00Z");
        assert_eq!(value["sessions"][0]["holder_id"], "job@web1:9");
    }

    #[test]
    fn who_shows_a_semaphores_permits() {
        let mut permits = locks_port::PermitHolders::default();
        permits.permits = vec![2];
        permits.held = vec![locks_port::PermitHolder::new(
            1,
            Some("job@web1:9".into()),
            None,
        )];
        permits.waiting = 3;
        let value: serde_json::Value = serde_json::from_str(&who("k", 42, &[], &permits)).unwrap();
        assert_eq!(
            value["semaphore"],
            serde_json::json!({
                "permits": [2],
                "held": [{"slot": 1, "holder_id": "job@web1:9", "since": null}],
                "waiting": 3
            })
        );
    }
}
