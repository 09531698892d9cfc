//! Scenario `permits`: the semaphore's handoff under contention. 16 tasks loop acquire
//! (timeout 5 s) / hold 2 ms / release on one semaphore of N = 4, each with its own
//! manager and pool of one connection, as separate processes would; the plain lock's
//! handoff (the same 16 tasks on one lock) runs in the same run, window after window.
//!
//! - **handoff gap**: from the instant just before a holder calls release, while others
//!   wait, to the instant a waiter's acquisition returns, releases and grants matched in
//!   order (each grant consumes the oldest release not yet handed on);
//! - **fairness**: most turns / fewest turns among the tasks of one window (the worst
//!   window is reported);
//! - **most inside**: the most tasks holding at once, which must never exceed N.
//!
//! Then one window of long jobs on the semaphore alone: 8 tasks with jobs of 100-400 ms
//! (spread by task and turn) for 8 s on N = 4, where a permit freed on a slot nobody
//! watches shows. Beside the gap it reports the **idle share**: the permit time left
//! free while someone waited (`min(free permits, waiters)` over time, from the instant a
//! holder calls release to the instant a waiter's acquisition returns) over all permit
//! time (N × the window).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, PermitGuard, ReleaseOutcome, Semaphore,
};
use locks_postgres::PostgresLockManager;
use serde_json::{Value, json};

use crate::db::Database;
use crate::harness::{self, Outcome, cells};
use crate::stats::{Latencies, fairness, finite, fmt_ns, nanos};
use crate::{BoxError, Plan};

const TASKS: usize = 16;
const PERMITS: u32 = 4;
const HOLD: Duration = Duration::from_millis(2);
const BOUNDED: Duration = Duration::from_secs(5);
const GAP_P99_LIMIT: Duration = Duration::from_millis(5);
const FAIRNESS_LIMIT: f64 = 1.5;
const JOB_TASKS: usize = 8;
const JOB_WINDOW: Duration = Duration::from_secs(8);
const JOB_GAP_P99_LIMIT: Duration = Duration::from_millis(10);
const JOB_IDLE_LIMIT: f64 = 0.01;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lock,
    Permits,
}

#[derive(Default)]
struct State {
    waiting: usize,
    inside: usize,
    most_inside: usize,
    /// Releases made while someone waited, not yet handed on.
    pending: VecDeque<Instant>,
    gaps: Vec<u64>,
    turns: Vec<u64>,
    timeouts: u64,
    /// Permit time left free while someone waited, up to `last`.
    idle: Duration,
    last: Option<Instant>,
}

impl State {
    /// Adds the idle permit time since the last change, up to `now`.
    fn advance(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let free = (PERMITS as usize).saturating_sub(self.inside);
            let idle = u32::try_from(free.min(self.waiting)).unwrap_or(0);
            self.idle += now.saturating_duration_since(last) * idle;
        }
        self.last = Some(now);
    }
}

/// How long a task holds on its `turn`: [`HOLD`], or a job of 100-400 ms.
fn hold(jobs: bool, task: usize, turn: u64) -> Duration {
    if jobs {
        let spread = (task as u64)
            .wrapping_mul(7_919)
            .wrapping_add(turn.wrapping_mul(104_729));
        Duration::from_millis(100 + spread % 301)
    } else {
        HOLD
    }
}

struct Recorder(Mutex<State>);

impl Recorder {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

enum Held {
    Lock(locks_postgres::PostgresLockGuard),
    Permit(locks_postgres::PostgresPermit),
}

async fn take(manager: &PostgresLockManager, kind: Kind, key: &str) -> Option<Held> {
    let options = AcquireOptions::new().with_timeout(BOUNDED);
    match kind {
        Kind::Lock => manager.acquire(key, options).await.ok().map(Held::Lock),
        Kind::Permits => manager
            .acquire_permit(key, PERMITS, options)
            .await
            .ok()
            .map(Held::Permit),
    }
}

async fn give_back(held: Held) -> ReleaseOutcome {
    match held {
        Held::Lock(guard) => guard.release().await,
        Held::Permit(permit) => permit.release().await,
    }
}

/// One window of `TASKS` tasks (holding [`HOLD`]), or of `JOB_TASKS` tasks with long
/// `jobs`, on a fresh key; the state at its end.
async fn window(
    db: &Database,
    kind: Kind,
    length: Duration,
    jobs: bool,
) -> Result<State, BoxError> {
    let key: Arc<str> = format!("bench:permits:{}", uuid_like()).into();
    let tasks = if jobs { JOB_TASKS } else { TASKS };
    let recorder = Arc::new(Recorder(Mutex::new(State {
        turns: vec![0; tasks],
        ..State::default()
    })));
    let mut managers = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let pool = db.pool(1, "lock-bench-permits");
        db.warm(&pool, 1).await?;
        managers.push(PostgresLockManager::new(pool));
    }
    let end = Instant::now() + length;
    let mut running = tokio::task::JoinSet::new();
    for (task, manager) in managers.into_iter().enumerate() {
        let (recorder, key) = (Arc::clone(&recorder), Arc::clone(&key));
        running.spawn(async move {
            let mut turn = 0_u64;
            while Instant::now() < end {
                recorder.with(|s| {
                    s.advance(Instant::now());
                    s.waiting += 1;
                });
                let taken = tokio::time::timeout_at(end.into(), take(&manager, kind, &key)).await;
                let at = Instant::now();
                let Ok(taken) = taken else {
                    recorder.with(|s| {
                        s.advance(at);
                        s.waiting -= 1;
                    });
                    break;
                };
                let Some(held) = taken else {
                    recorder.with(|s| {
                        s.advance(at);
                        s.waiting -= 1;
                        s.timeouts += 1;
                    });
                    continue;
                };
                recorder.with(|s| {
                    s.advance(at);
                    s.waiting -= 1;
                    s.inside += 1;
                    s.most_inside = s.most_inside.max(s.inside);
                    s.turns[task] += 1;
                    if let Some(released) = s.pending.pop_front() {
                        s.gaps.push(nanos(at.saturating_duration_since(released)));
                    }
                });
                tokio::time::sleep(hold(jobs, task, turn)).await;
                turn += 1;
                recorder.with(|s| {
                    s.advance(Instant::now());
                    s.inside -= 1;
                    if s.waiting > 0 {
                        s.pending.push_back(Instant::now());
                    }
                });
                give_back(held).await;
            }
        });
    }
    while let Some(joined) = running.join_next().await {
        joined?;
    }
    let state = std::mem::take(&mut *recorder.0.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(state)
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

/// The scenario.
pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let title = format!(
        "Semaphore handoff: {TASKS} contenders, hold {} ms, windows of {:?} × {}",
        HOLD.as_millis(),
        plan.handoff_window,
        plan.handoff_rounds
    );
    let header = [
        "contenders on",
        "gap p50",
        "gap p99",
        "fairness (worst window)",
        "most inside",
        "turns",
        "timeouts",
    ];
    let mut out = Outcome::new("permits", title, &header);
    let mut json = serde_json::Map::new();
    let mut results: [(Latencies, f64, usize, u64, u64); 2] = Default::default();
    // The lock and the semaphore take turns, the order rotating round by round.
    harness::rounds(plan.handoff_rounds, results.len(), async |_, side| {
        let (gaps, worst, most, turns, timeouts) = &mut results[side];
        let kind = [Kind::Lock, Kind::Permits][side];
        let state = window(db, kind, plan.handoff_window, false).await?;
        state.gaps.iter().for_each(|&gap| gaps.record_ns(gap));
        *worst = worst.max(fairness(&state.turns));
        *most = (*most).max(state.most_inside);
        *turns += state.turns.iter().sum::<u64>();
        *timeouts += state.timeouts;
        Ok(())
    })
    .await?;
    let labels = [("lock", "lock (N = 1)"), ("permits", "semaphore, N = 4")];
    for ((id, label), (gaps, worst, most, turns, timeouts)) in labels.into_iter().zip(&results) {
        let (p50, p99) = (fmt_ns(gaps.p50()), fmt_ns(gaps.p99()));
        out.row(cells![
            label,
            p50,
            p99,
            format!("{worst:.2}"),
            most,
            turns,
            timeouts
        ]);
        json.insert(
            id.to_owned(),
            json!({
                "gap": gaps.to_json(),
                "fairness": finite(*worst),
                "most_inside": most,
                "turns": turns,
                "timeouts": timeouts,
            }),
        );
    }
    let (gaps, worst, most, ..) = &results[1];
    let contended = "16 contenders on N = 4";
    gap_check(
        &mut out,
        &format!("permits: handoff gap p99, {contended}"),
        gaps,
        GAP_P99_LIMIT,
    );
    out.gate(
        format!("permits: fairness (most / fewest turns), {contended}"),
        format!("{worst:.2}"),
        format!("≤ {FAIRNESS_LIMIT}"),
        *worst <= FAIRNESS_LIMIT,
    );
    inside_check(&mut out, "permits: most inside at once", *most);

    let jobs = window(db, Kind::Permits, JOB_WINDOW, true).await?;
    let gaps = Latencies::of(&jobs.gaps);
    let idle = jobs.idle.as_secs_f64() / (JOB_WINDOW.as_secs_f64() * f64::from(PERMITS));
    let turns = jobs.turns.iter().sum::<u64>();
    out.row(cells![
        format!("semaphore, N = 4, {JOB_TASKS} tasks, 100-400 ms jobs"),
        fmt_ns(gaps.p50()),
        fmt_ns(gaps.p99()),
        format!("{:.2}", fairness(&jobs.turns)),
        jobs.most_inside,
        turns,
        jobs.timeouts,
    ]);
    json.insert(
        "permits_jobs".to_owned(),
        json!({
            "gap": gaps.to_json(),
            "idle_share": idle,
            "most_inside": jobs.most_inside,
            "turns": turns,
            "timeouts": jobs.timeouts,
        }),
    );
    let jobs_name = "100-400 ms jobs on N = 4";
    gap_check(
        &mut out,
        &format!("permits: handoff gap p99, {jobs_name}"),
        &gaps,
        JOB_GAP_P99_LIMIT,
    );
    out.gate(
        format!("permits: idle permit time while waiters queue, {jobs_name}"),
        format!("{:.2}%", idle * 100.0),
        format!("≤ {:.0}%", JOB_IDLE_LIMIT * 100.0),
        idle <= JOB_IDLE_LIMIT,
    );
    inside_check(
        &mut out,
        "permits: most inside at once, 100-400 ms jobs",
        jobs.most_inside,
    );
    out.note(
        "Gap: from a release while others wait to a waiter's grant, releases and \
         grants matched in order. The lock row is the same 16 tasks on one lock, in \
         the same run.",
    );
    out.note(format!(
        "The jobs row: one window of {JOB_WINDOW:?}; idle permit time while \
         waiters queued: {:.2}% of the permit time.",
        idle * 100.0
    ));
    Ok(out.with(Value::Object(json)))
}

fn gap_check(out: &mut Outcome, name: &str, gaps: &Latencies, limit: Duration) {
    let limit = nanos(limit);
    out.gate(
        name,
        fmt_ns(gaps.p99()),
        format!("≤ {}", fmt_ns(limit)),
        gaps.p99() <= limit,
    );
}

fn inside_check(out: &mut Outcome, name: &str, most: usize) {
    out.gate(
        name,
        most.to_string(),
        format!("≤ {PERMITS}"),
        most <= PERMITS as usize,
    );
}
