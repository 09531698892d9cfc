//! Where a shard's unowned time in the soak goes (`soak --shards`): the faults that
//! reached a shard member, read by the driver as it made them ([`Hit`]), and the causes an
//! unowned piece of a shard's time is told by ([`causes`]): the next term's takeover
//! delay, or how the task before it ended (handed over, or its lock lost) and the fault
//! that can have ended it.

use std::collections::BTreeMap;
use std::time::SystemTime;

use locks_postgres::tokio_postgres::Client;

use super::shards::{RECOVERED_WITHIN, WRITE_EVERY, group};

/// A task that started this long after its term began waited the takeover delay (500 ms
/// when the previous owner recorded no bound; a task's first record takes milliseconds),
/// even after a task that recorded its stop (whose term's end may have failed).
const TAKEOVER_SEEN: f64 = 0.4;

/// One task's records: its shard, member, token, when its term began, its start and
/// last record (seconds since the epoch, by the server's clock), and whether it recorded
/// a stop (it was told to hand over).
pub(crate) struct Run {
    pub(crate) shard: String,
    pub(crate) member: String,
    pub(crate) token: i64,
    pub(crate) since: f64,
    pub(crate) started: f64,
    pub(crate) ended: f64,
    pub(crate) stopped: bool,
}

/// A fault that reached a shard member, as the driver saw it when it made it.
#[derive(Debug)]
pub(crate) struct Hit {
    pub(crate) at: SystemTime,
    /// `terminated`, `stopped` (a backend) or `killed` (the member's process).
    what: &'static str,
    /// The member's holder id.
    member: String,
    /// The shards whose locks the backend held (none for a kill: it held them all).
    shards: Vec<String>,
    /// Whether the backend held the member's membership permit.
    membership: bool,
    /// A kill's aftermath, as the driver saw it: when the killed process was reaped (its
    /// sockets closed), and when the server listed none of its sessions any more.
    pub(crate) reaped: Option<SystemTime>,
    pub(crate) sessions_gone: Option<SystemTime>,
}

impl Hit {
    /// The kill of the member process of index `index` and process id `pid` (its
    /// holder id, see [`member`]).
    pub(crate) fn killed(index: usize, pid: u32) -> Self {
        Self {
            at: SystemTime::now(),
            what: "killed",
            member: format!("soak-shard-{index}-{pid}"),
            shards: Vec::new(),
            membership: false,
            reaped: None,
            sessions_gone: None,
        }
    }

    /// What the backend `pid` holds, read before `what` is done to it: a hit when it is
    /// a shard member's, else nothing.
    pub(crate) async fn on_backend(admin: &Client, pid: i32, what: &'static str) -> Option<Self> {
        let group = group().ok()?;
        let class = locks_shard::locks_port::PermitDerivation::CURRENT.class(&group.members_name());
        let row = admin
            .query_opt(
                "SELECT a.application_name, \
                   coalesce(array_agg((l.classid::int8 << 32) | l.objid::int8) \
                     FILTER (WHERE l.objsubid = 1), '{}'), \
                   coalesce(bool_or(l.objsubid = 2 AND l.classid = $2::int4::oid \
                     AND l.objid::int8 < 2147483648), false) \
                 FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid \
                   AND l.locktype = 'advisory' AND l.granted \
                 WHERE a.pid = $1 GROUP BY a.application_name",
                &[&pid, &class],
            )
            .await
            .ok()??;
        let name: String = row.get(0);
        let member = name.strip_prefix("locks:")?.to_owned();
        if !member.starts_with("soak-shard-") {
            return None;
        }
        let held: Vec<i64> = row.get(1);
        let shards = group
            .shards()
            .filter(|shard| {
                held.contains(&locks_shard::locks_port::lock_id(&group.shard_key(shard)))
            })
            .map(str::to_owned)
            .collect();
        Some(Self {
            at: SystemTime::now(),
            what,
            member,
            shards,
            membership: row.get(2),
            reaped: None,
            sessions_gone: None,
        })
    }

    /// Whether this hit, made at `at`, can have ended `run`: it reached the run's member
    /// (its process, its membership or its shard's lock) just before the run's last
    /// record, or up to 3.5 s before it for a stopped backend (its loss is told within
    /// the keepalive and answer timeout, while the task goes on writing).
    fn ended(&self, at: f64, run: &Run) -> bool {
        let before = if self.what == "stopped" { 3.5 } else { 0.5 };
        (run.ended - before..=run.ended + 0.5).contains(&at)
            && run.member == self.member
            && (self.membership || self.what == "killed" || self.shards.contains(&run.shard))
    }

    /// The hit's class, for the report's count of faults on members.
    pub(crate) fn class(&self) -> String {
        let of = if self.what == "killed" {
            "a member process"
        } else if self.membership {
            "a membership backend"
        } else if self.shards.is_empty() {
            "an idle member backend"
        } else {
            "a shard lock backend"
        };
        format!("{} {of}", self.what)
    }
}

/// The causes an unowned piece of a shard's time is told by.
mod cause {
    pub(super) const TAKEOVER: &str =
        "takeover delay (the previous term not ended), then the task's first record";
    pub(super) const STARTING: &str = "term begun, task not yet recording";
    pub(super) const MOVE: &str = "hand-off of a rebalancing move (drain, end, release, next tick)";
    pub(super) const MOVE_RECOVERED: &str =
        "hand-off of a task begun within 10 s of an outage's end (a member back first took more)";
    pub(super) const MOVE_NEWCOMER: &str =
        "hand-off to a member whose process started after the task (a started member's share)";
    pub(super) const CHURN: &str = "membership churn (handed over after a membership loss)";
    pub(super) const STOPPED: &str =
        "lock held by a stopped backend (until continued, then a tick)";
    pub(super) const TERMINATED: &str = "lock backend terminated (loss told, next tick)";
    pub(super) const MEMBERSHIP: &str = "membership backend terminated or stopped";
    pub(super) const KILLED: &str = "member killed (its sessions end, next tick)";
    pub(super) const LOST: &str =
        "lock lost with no fault on it (an outage's loss told after it, keepalive, self-stop)";
    pub(super) const OUTAGE: &str = "an outage, past the recovery bound";
    pub(super) const FIRST: &str = "no earlier task";
}

/// The cause of a running task's last record to an outage's start: counted as owned
/// (the task ran), told apart in the breakdown.
pub(crate) const RECORDS: &str =
    "a running task's last record to an outage's start (it records every 20 ms; owned)";

/// The cause of a running task's last record to the kill of its member's process:
/// counted as owned (the task ran, holding the shard's lock, until its process died;
/// the record it was writing died with it), told apart in the breakdown.
pub(crate) const RECORDS_KILLED: &str =
    "a running task's last record to its member's kill (it records every 20 ms; owned)";

/// Whether a piece of that cause counts as owned (the strict share does not).
pub(crate) fn owned(cause: &str) -> bool {
    cause == RECORDS || cause == RECORDS_KILLED
}

/// The causes of the unowned piece `[from, to]` of a shard whose runs are `runs`: the
/// part after the next term began (its takeover delay, or its task's start), and the part
/// before it, told by how the previous task ended and the fault that reached it.
/// `first_seen` is when each member's first task started (on any shard): a hand-off to a
/// member that was not there when the handed task began is that member's share, not a
/// member back first that took more.
pub(crate) fn causes(
    (from, to): (f64, f64),
    runs: &[&Run],
    first_seen: &BTreeMap<&str, f64>,
    hits: &[(f64, &Hit)],
    outages: &[(f64, f64)],
    after_outage: bool,
) -> Vec<(&'static str, f64)> {
    if after_outage {
        return vec![(cause::OUTAGE, to - from)];
    }
    let previous = runs
        .iter()
        .filter(|run| run.ended <= from + 1e-6)
        .max_by(|a, b| a.ended.total_cmp(&b.ended));
    let next = runs.iter().find(|run| run.started >= to - 1e-6);
    // A task that was running when an outage began: its last record came before it.
    let cut_short = outages.iter().any(|&(start, _)| (start - to).abs() < 1e-6);
    if next.is_none_or(|next| next.started > to + 1e-6)
        && cut_short
        && previous.is_some_and(|previous| !previous.stopped)
        && to - from <= 2.0 * WRITE_EVERY.as_secs_f64()
    {
        return vec![(RECORDS, to - from)];
    }
    let mut split = Vec::new();
    let begun = next.map_or(to, |next| next.since.clamp(from, to));
    if let Some(next) = next
        && begun < to
    {
        // The previous task recorded no stop: its term did not end, and the next owner
        // waited the previous owner's bound (100 ms) before its first record.
        let waited = previous.is_some_and(|previous| !previous.stopped)
            || next.started - next.since >= TAKEOVER_SEEN;
        split.push((
            if waited {
                cause::TAKEOVER
            } else {
                cause::STARTING
            },
            to - begun,
        ));
    }
    if begun > from {
        let before = match previous {
            None => cause::FIRST,
            Some(previous) => {
                // The next task's member started after the previous task began.
                let newcomer = |next: Option<&&Run>| {
                    next.and_then(|next| first_seen.get(next.member.as_str()))
                        .is_some_and(|&first| first > previous.started)
                };
                // The last fault that can have ended the previous task.
                let last = hits
                    .iter()
                    .filter(|(at, hit)| hit.ended(*at, previous))
                    .max_by(|a, b| a.0.total_cmp(&b.0));
                let hit = last.map(|(_, hit)| *hit);
                // Killed after its last record: it ran until the kill.
                if let Some(&(at, hit)) = last
                    && hit.what == "killed"
                    && !previous.stopped
                    && (from..begun).contains(&at)
                {
                    split.push((RECORDS_KILLED, at - from));
                    split.push((cause::KILLED, begun - at));
                    return split;
                }
                match (previous.stopped, hit) {
                    (true, Some(hit)) if hit.membership => cause::CHURN,
                    (true, _) if newcomer(next) => cause::MOVE_NEWCOMER,
                    (true, _) if begun_after_outage(previous, outages) => cause::MOVE_RECOVERED,
                    (true, _) => cause::MOVE,
                    (false, Some(hit)) if hit.what == "killed" => cause::KILLED,
                    (false, Some(hit)) if hit.membership => cause::MEMBERSHIP,
                    (false, Some(hit)) if hit.what == "stopped" => cause::STOPPED,
                    (false, Some(_)) => cause::TERMINATED,
                    (false, None) => cause::LOST,
                }
            }
        };
        split.push((before, begun - from));
    }
    split
}

/// Whether `run` started within the recovery bound of an outage's end.
fn begun_after_outage(run: &Run, outages: &[(f64, f64)]) -> bool {
    let bound = RECOVERED_WITHIN.as_secs_f64();
    outages
        .iter()
        .any(|&(_, to)| (to..=to + bound).contains(&run.started))
}
