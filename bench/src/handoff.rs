//! Scenario 4: handoff under contention. N tasks loop acquire (timeout 5 s) / hold 2 ms /
//! release on one key; every task has its own manager and its own pool of one connection,
//! as separate processes would.
//!
//! All instants come from one monotonic clock (`Instant`) shared by the tasks:
//! - **gap**: from the instant just before a holder calls release to the instant the next
//!   acquisition (by any task, the releaser included) returns;
//! - **gap to a waiter**: from a release while other tasks were waiting to the instant one
//!   of *those* tasks' acquisitions returns. Under a FIFO queue the two are the same; under
//!   polling the releaser often takes the lock straight back, and this is how long the
//!   tasks that were already waiting were passed over;
//! - **fairness**: most turns / fewest turns among the tasks in one window (the worst
//!   window is reported).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, WaitStrategy, lock_id};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::error::SqlState;
use serde_json::{Value, json};

use crate::chart::{Series, handoff_svg};
use crate::db::{Database, Raw};
use crate::harness::{self, Outcome, cells, verdict};
use crate::stats::{Latencies, as_f64, fairness, finite, fmt_ns, nanos};
use crate::{BoxError, Plan};

const HOLD: Duration = Duration::from_millis(2);
const BOUNDED: Duration = Duration::from_secs(5);
/// Targets for the server-side wait.
const GAP_P99_LIMIT: Duration = Duration::from_millis(2);
const GAP_LIMIT_CONTENDERS: usize = 4;
const FAIRNESS_LIMIT: f64 = 1.5;
const CONTENDERS: [usize; 2] = [4, 16];

/// Who contends, and how they wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    /// Raw `pg_advisory_lock` under `lock_timeout = 5s`, one dedicated connection per task.
    Raw,
    /// The library, `WaitStrategy::Queue`: one server-side wait.
    Queue,
    /// The library, `WaitStrategy::Poll`: the Python library's `pg_try_advisory_lock` every 100 ms.
    Poll,
}

impl Contender {
    const ALL: [Self; 3] = [Self::Raw, Self::Queue, Self::Poll];

    /// Its name in the JSON, its label, and its colour in the chart.
    fn says(self) -> (&'static str, &'static str, (u8, u8, u8)) {
        match self {
            Self::Raw => (
                "raw",
                "raw pg_advisory_lock (server queue)",
                (0x7f, 0x7f, 0x7f),
            ),
            Self::Queue => (
                "queue",
                "library, Queue (server-side wait)",
                (0x1f, 0x77, 0xb4),
            ),
            Self::Poll => (
                "poll",
                "library, Poll (100 ms, as the Python library)",
                (0xd6, 0x27, 0x28),
            ),
        }
    }
}

/// What happened during the windows of one (contender, task count).
#[derive(Debug, Default)]
struct State {
    /// Bit `i` is set while task `i` is inside an acquire.
    waiting: u32,
    /// The last release not yet followed by an acquisition, and who released.
    last_release: Option<(Instant, usize)>,
    /// Releases made while others waited, with the set of those waiters.
    open: Vec<(Instant, u32)>,
    gaps: Vec<u64>,
    waiter_gaps: Vec<u64>,
    waits: Vec<u64>,
    turns: Vec<u64>,
    retaken: u64,
    timeouts: u64,
    abandoned: u64,
    unserved_at_end: u64,
}

#[derive(Debug)]
struct Recorder {
    state: Mutex<State>,
}

impl Recorder {
    fn new(tasks: usize) -> Self {
        assert!(tasks <= 32, "the waiting set is a u32");
        Self {
            state: Mutex::new(State {
                turns: vec![0; tasks],
                ..State::default()
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn begin_wait(&self, task: usize) {
        self.with(|s| s.waiting |= 1 << task);
    }

    fn acquired(&self, task: usize, called: Instant, at: Instant) {
        let bit = 1u32 << task;
        self.with(|s| {
            s.waiting &= !bit;
            s.turns[task] += 1;
            s.waits.push(nanos(at - called));
            if let Some((released, releaser)) = s.last_release.take() {
                s.gaps.push(nanos(at.saturating_duration_since(released)));
                if releaser == task {
                    s.retaken += 1;
                }
            }
            let mut served = Vec::new();
            s.open.retain(|&(released, waiters)| {
                let hit = waiters & bit != 0;
                if hit {
                    served.push(nanos(at.saturating_duration_since(released)));
                }
                !hit
            });
            s.waiter_gaps.extend(served);
        });
    }

    /// Call just before the release is issued.
    fn releasing(&self, task: usize, at: Instant) {
        self.with(|s| {
            s.last_release = Some((at, task));
            let waiters = s.waiting & !(1 << task);
            if waiters != 0 {
                s.open.push((at, waiters));
            }
        });
    }

    /// `task` stopped waiting without the lock: its acquire timed out, or the window
    /// ended (`at_end`).
    fn gave_up(&self, task: usize, at_end: bool) {
        let bit = 1u32 << task;
        self.with(|s| {
            s.waiting &= !bit;
            if !at_end {
                s.timeouts += 1;
            }
            let mut emptied = 0;
            s.open.retain_mut(|(_, waiters)| {
                *waiters &= !bit;
                if *waiters == 0 {
                    emptied += 1;
                }
                *waiters != 0
            });
            if at_end {
                s.unserved_at_end += emptied;
            } else {
                s.abandoned += emptied;
            }
        });
    }

    /// Ends a window: what is still open was not served within it.
    fn finish_window(&self) -> Vec<u64> {
        self.with(|s| {
            s.unserved_at_end += u64::try_from(s.open.len()).unwrap_or(u64::MAX);
            s.open.clear();
            s.waiting = 0;
            s.last_release = None;
            let tasks = s.turns.len();
            std::mem::replace(&mut s.turns, vec![0; tasks])
        })
    }
}

/// How a task of one window takes and gives back the lock: a manager of its own, or a
/// raw connection under `lock_timeout = 5s`.
enum Taker {
    Library(PostgresLockManager, AcquireOptions),
    Raw(Raw),
}

enum Taken {
    Library(locks_postgres::PostgresLockGuard),
    Raw,
    TimedOut,
}

impl Taker {
    async fn new(db: &Database, contender: Contender) -> Result<Self, BoxError> {
        let strategy = match contender {
            Contender::Raw => {
                let raw = Raw::connect(db, "lock-bench-handoff", false).await?;
                raw.client.simple_query("SET lock_timeout = '5s'").await?;
                return Ok(Self::Raw(raw));
            }
            Contender::Queue => WaitStrategy::Queue,
            Contender::Poll => WaitStrategy::Poll,
        };
        let pool = db.pool(1, "lock-bench-handoff");
        db.warm(&pool, 1).await?;
        let options = AcquireOptions::new().with_timeout(BOUNDED);
        Ok(Self::Library(
            PostgresLockManager::new(pool),
            options.with_wait_strategy(strategy),
        ))
    }

    async fn take(&self, key: &str, id: i64) -> Result<Taken, BoxError> {
        match self {
            Self::Library(manager, options) => match manager.acquire(key, *options).await {
                Ok(guard) => Ok(Taken::Library(guard)),
                Err(error) if error.is_timeout() => Ok(Taken::TimedOut),
                Err(error) => Err(error.into()),
            },
            Self::Raw(raw) => match raw.lock(id).await {
                Ok(()) => Ok(Taken::Raw),
                Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    Ok(Taken::TimedOut)
                }
                Err(error) => Err(error.into()),
            },
        }
    }

    async fn give_back(&self, taken: Taken, id: i64) -> Result<(), BoxError> {
        match (self, taken) {
            (Self::Library(..), Taken::Library(guard)) => drop(guard.release().await),
            (Self::Raw(raw), Taken::Raw) => raw.unlock(id).await?,
            _ => {}
        }
        Ok(())
    }
}

/// One window: `tasks` takers loop on `key` until `length` has passed. Returns the turns
/// of each task.
async fn window(
    db: &Database,
    contender: Contender,
    tasks: usize,
    key: String,
    length: Duration,
    recorder: &Arc<Recorder>,
) -> Result<Vec<u64>, BoxError> {
    let mut takers = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        takers.push(Taker::new(db, contender).await?);
    }
    let id = lock_id(&key);
    let key: Arc<str> = key.into();
    let end = Instant::now() + length;
    let mut running = tokio::task::JoinSet::new();
    for (task, taker) in takers.into_iter().enumerate() {
        let recorder = Arc::clone(recorder);
        let key = Arc::clone(&key);
        running.spawn(async move {
            while Instant::now() < end {
                recorder.begin_wait(task);
                let called = Instant::now();
                let Ok(taken) = tokio::time::timeout_at(end.into(), taker.take(&key, id)).await
                else {
                    // The window is over; dropping the wait cancels it.
                    recorder.gave_up(task, true);
                    break;
                };
                let taken = taken?;
                if matches!(taken, Taken::TimedOut) {
                    recorder.gave_up(task, false);
                    continue;
                }
                recorder.acquired(task, called, Instant::now());
                tokio::time::sleep(HOLD).await;
                recorder.releasing(task, Instant::now());
                taker.give_back(taken, id).await?;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(joined) = running.join_next().await {
        joined??;
    }
    Ok(recorder.finish_window())
}

fn fmt_fairness(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.2}")
    } else {
        "∞ (a task got no turn)".to_owned()
    }
}

/// The handoff scenario, with its chart.
pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    struct Cell {
        contender: Contender,
        tasks: usize,
        recorder: Arc<Recorder>,
        windows: Vec<Vec<u64>>,
    }
    let mut cells: Vec<Cell> = CONTENDERS
        .iter()
        .flat_map(|&tasks| {
            Contender::ALL.iter().map(move |&contender| Cell {
                contender,
                tasks,
                recorder: Arc::new(Recorder::new(tasks)),
                windows: Vec::new(),
            })
        })
        .collect();

    for round in 0..plan.handoff_rounds {
        for &tasks in &CONTENDERS {
            for side in harness::order(round, Contender::ALL.len()) {
                let contender = Contender::ALL[side];
                let cell = cells
                    .iter_mut()
                    .find(|c| c.contender == contender && c.tasks == tasks)
                    .expect("every combination has a cell");
                let length = if contender == Contender::Poll {
                    plan.handoff_poll_window
                } else {
                    plan.handoff_window
                };
                let key = format!("bench:handoff:{round}:{tasks}:{}", contender.says().0);
                let turns = window(db, contender, tasks, key, length, &cell.recorder).await?;
                cell.windows.push(turns);
            }
        }
    }

    let header = [
        "Tasks",
        "Waiting",
        "Turns",
        "gap p50",
        "gap p99",
        "gap to a waiter p50",
        "gap to a waiter p99",
        "wait p99",
        "fairness",
        "re-taken",
        "timeouts",
        "Result",
    ];
    let title = "4. Handoff under contention: one key, hold 2 ms, acquire timeout 5 s";
    let mut out = Outcome::new("handoff", title, &header);
    out.note(format!(
        "{} rounds; per round and contender count, one window each of raw \
         ({:.1} s), Queue ({:.1} s) and Poll ({:.1} s), order rotating. Every \
         task has its own manager and pool of one (like separate processes). \
         **gap** = from just before a holder calls release to the return of \
         the next acquisition by anyone; **gap to a waiter** = from a release \
         while others waited to the return of an acquisition by one of those \
         waiters; **wait** = one acquire call, start to grant; **fairness** = \
         most turns / fewest turns per window (worst window); **re-taken** = \
         share of handoffs where the releaser took the lock straight back.",
        plan.handoff_rounds,
        plan.handoff_window.as_secs_f64(),
        plan.handoff_window.as_secs_f64(),
        plan.handoff_poll_window.as_secs_f64(),
    ));
    let mut json_cells = Vec::new();
    let mut series = Vec::new();
    for cell in &cells {
        let (id, label, color) = cell.contender.says();
        let state = cell.recorder.with(std::mem::take);
        let gaps = Latencies::of(&state.gaps);
        let waiter_gaps = Latencies::of(&state.waiter_gaps);
        let waits = Latencies::of(&state.waits);
        let fairness_by_window: Vec<f64> = cell.windows.iter().map(|t| fairness(t)).collect();
        let worst = fairness_by_window.iter().copied().fold(0.0_f64, f64::max);
        let turns: u64 = cell.windows.iter().flatten().sum();
        let mut result = String::new();
        if cell.contender == Contender::Queue {
            let mut missed = Vec::new();
            let fair = worst <= FAIRNESS_LIMIT;
            out.gate(
                format!(
                    "handoff fairness, Queue, {} contenders (worst window)",
                    cell.tasks
                ),
                fmt_fairness(worst),
                format!("≤ {FAIRNESS_LIMIT}"),
                fair,
            );
            if !fair {
                missed.push("fairness");
            }
            if cell.tasks == GAP_LIMIT_CONTENDERS {
                let gap_ok = gaps.count() > 0 && gaps.p99() <= nanos(GAP_P99_LIMIT);
                out.gate(
                    format!("handoff gap p99, Queue, {} contenders", cell.tasks),
                    fmt_ns(gaps.p99()),
                    format!("≤ {}", fmt_ns(nanos(GAP_P99_LIMIT))),
                    gap_ok,
                );
                if !gap_ok {
                    missed.push("gap p99");
                }
            }
            result = if missed.is_empty() {
                verdict(true).to_owned()
            } else {
                format!("MISS: {}", missed.join(", "))
            };
        }
        let retaken = if gaps.count() == 0 {
            "—".to_owned()
        } else {
            format!(
                "{:.0} %",
                as_f64(state.retaken) * 100.0 / as_f64(gaps.count())
            )
        };
        out.row(cells![
            cell.tasks,
            label,
            turns,
            fmt_ns(gaps.p50()),
            fmt_ns(gaps.p99()),
            fmt_ns(waiter_gaps.p50()),
            fmt_ns(waiter_gaps.p99()),
            fmt_ns(waits.p99()),
            fmt_fairness(worst),
            retaken,
            state.timeouts,
            result,
        ]);
        let fairness_by_window: Vec<Value> =
            fairness_by_window.iter().map(|&f| finite(f)).collect();
        json_cells.push(json!({
            "contenders": cell.tasks,
            "strategy": id,
            "label": label,
            "turns": turns,
            "turns_by_window": cell.windows,
            "fairness_by_window": fairness_by_window,
            "fairness_worst": finite(worst),
            "gap": gaps.to_json(),
            "gap_to_waiter": waiter_gaps.to_json(),
            "wait": waits.to_json(),
            "retaken_by_releaser": state.retaken,
            "timeouts": state.timeouts,
            "releases_abandoned_by_all_waiters": state.abandoned,
            "releases_unserved_at_window_end": state.unserved_at_end,
        }));
        series.push(Series {
            label: format!("{label}, {} contenders", cell.tasks),
            color,
            dashed: cell.tasks > CONTENDERS[0],
            gaps: state.gaps,
            waiter_gaps: state.waiter_gaps,
        });
    }
    let server: String = db
        .connect("lock-bench-handoff")
        .await?
        .query_one("SHOW server_version", &[])
        .await?
        .get(0);
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let chart_notes = [
        format!(
            "PostgreSQL {server}, {cores} cores, {} mode; hold 2 ms, acquire timeout 5 s.",
            plan.mode()
        ),
        "n = handoffs (left) / releases made while other tasks waited (right); solid: 4 \
         contenders, dashed: 16."
            .to_owned(),
        "Polling looks quick on the left only because the releaser takes the lock straight \
         back; the right shows how long the waiting tasks were passed over."
            .to_owned(),
    ];
    out.files
        .push(("handoff.svg", handoff_svg(&series, &chart_notes)?));
    Ok(out.with(json!({
        "hold_ms": 2,
        "acquire_timeout_s": 5,
        "rounds": plan.handoff_rounds,
        "window_s": plan.handoff_window.as_secs_f64(),
        "poll_window_s": plan.handoff_poll_window.as_secs_f64(),
        "cells": json_cells,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_gap_closes_only_when_a_waiter_gets_the_lock() {
        let recorder = Recorder::new(3);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // Task 0 holds; 1 waits; 0 releases at 10 ms and takes it back at 11 ms.
        recorder.begin_wait(0);
        recorder.acquired(0, t0, ms(1));
        recorder.begin_wait(1);
        recorder.releasing(0, ms(10));
        recorder.begin_wait(0);
        recorder.acquired(0, ms(10), ms(11));
        // 0 releases again at 20 ms; 1 gets it at 22 ms.
        recorder.releasing(0, ms(20));
        recorder.acquired(1, ms(5), ms(22));
        let state = recorder.with(std::mem::take);
        assert_eq!(state.gaps, vec![1_000_000, 2_000_000]);
        assert_eq!(state.retaken, 1);
        // Both releases had task 1 waiting: passed over for 12 ms, then 2 ms.
        assert_eq!(state.waiter_gaps, vec![12_000_000, 2_000_000]);
        assert_eq!(state.turns, vec![2, 1, 0]);
    }

    #[test]
    fn releases_whose_waiters_all_gave_up_are_counted_apart() {
        let recorder = Recorder::new(2);
        let t0 = Instant::now();
        recorder.acquired(0, t0, t0);
        recorder.begin_wait(1);
        recorder.releasing(0, t0 + Duration::from_millis(3));
        recorder.gave_up(1, false);
        let state = recorder.with(std::mem::take);
        assert_eq!((state.abandoned, state.timeouts), (1, 1));
        assert!(state.waiter_gaps.is_empty());
    }
}
