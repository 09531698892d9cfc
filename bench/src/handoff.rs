//! Scenario `handoff`: contention on one key. Tasks loop acquire (timeout 5 s) / hold 2 ms
//! / release, each with its own manager and pool of one connection (raw: a connection of
//! its own), as separate processes would: 4 and 16 tasks on a lock, waiting as raw
//! `pg_advisory_lock`, the library's `Queue` and its `Poll`; 16 tasks on a semaphore of
//! N = 4; then one window of long jobs on the semaphore (8 tasks, 100–400 ms, N = 4), where
//! a permit freed on a slot nobody watches would show. Every window's order rotates.
//!
//! One [`Recorder`] times them all, on one monotonic clock shared by the tasks:
//! - **gap**: from just before a holder calls release to the return of the next
//!   acquisition by anyone (the releaser included), releases and acquisitions matched in
//!   order (a semaphore has several releases outstanding);
//! - **gap to a waiter**: from a release while other tasks waited to the return of an
//!   acquisition by one of *those* tasks. Under a FIFO queue the two are the same; under
//!   polling the releaser often takes the lock straight back, and this is how long the
//!   tasks already waiting were passed over;
//! - **fairness**: most turns / fewest turns among the tasks of one window (the worst);
//! - **most inside**: the most tasks holding at once (never above N);
//! - **idle share**: capacity left free while someone waited (`min(free, waiting)` over
//!   time) over N × the windows' length.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, PermitGuard, Semaphore};
use locks_port::{LockAcquisitionError, WaitStrategy, lock_id};
use locks_postgres::tokio_postgres::error::SqlState;
use locks_postgres::{PostgresLockGuard, PostgresLockManager, PostgresPermit};
use serde_json::{Value, json};

mod recorder;
use recorder::Recorder;

use crate::chart::{Curve, Panel, Unit, cdf, curves_svg};
use crate::db::{Database, Raw};
use crate::harness::{self, Outcome, cells, verdict};
use crate::stats::{Latencies, as_f64, fairness, finite, fmt_ns, nanos};
use crate::{BoxError, Plan};

const HOLD: Duration = Duration::from_millis(2);
const BOUNDED: Duration = Duration::from_secs(5);
const CONTENDERS: [usize; 2] = [4, 16];
const PERMITS: u32 = 4;
const JOB_TASKS: usize = 8;
const JOB_WINDOW: Duration = Duration::from_secs(8);

/// Who contends, and how they wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    /// Raw `pg_advisory_lock` under `lock_timeout = 5s`, one dedicated connection per task.
    Raw,
    /// The library, `WaitStrategy::Queue`: one server-side wait.
    Queue,
    /// The library, `WaitStrategy::Poll`: the Python library's `pg_try_advisory_lock` every 100 ms.
    Poll,
    /// The library's semaphore of [`PERMITS`] (its waiters always wait on the server).
    Permits,
}

impl Contender {
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
            Self::Permits => ("permits", "library, semaphore of N = 4", (0x2c, 0xa0, 0x2c)),
        }
    }

    fn capacity(self) -> usize {
        if self == Self::Permits {
            PERMITS as usize
        } else {
            1
        }
    }
}

/// How a task of one window takes and gives back the lock: a manager of its own, or a
/// raw connection under `lock_timeout = 5s`.
enum Taker {
    Library(PostgresLockManager, Contender),
    Raw(Raw),
}

enum Taken {
    Lock(PostgresLockGuard),
    Permit(PostgresPermit),
    Raw,
    TimedOut,
}

impl Taker {
    async fn new(db: &Database, contender: Contender) -> Result<Self, BoxError> {
        if contender == Contender::Raw {
            let raw = Raw::connect(db, "lock-bench-handoff", false).await?;
            raw.client.simple_query("SET lock_timeout = '5s'").await?;
            return Ok(Self::Raw(raw));
        }
        let pool = db.pool(1, "lock-bench-handoff");
        db.warm(&pool, 1).await?;
        Ok(Self::Library(PostgresLockManager::new(pool), contender))
    }

    async fn take(&self, key: &str, id: i64) -> Result<Taken, BoxError> {
        let timed_out = |error: LockAcquisitionError| -> Result<Taken, BoxError> {
            if error.is_timeout() {
                Ok(Taken::TimedOut)
            } else {
                Err(error.into())
            }
        };
        let options = AcquireOptions::new().with_timeout(BOUNDED);
        match self {
            Self::Library(manager, Contender::Permits) => manager
                .acquire_permit(key, PERMITS, options)
                .await
                .map_or_else(timed_out, |permit| Ok(Taken::Permit(permit))),
            Self::Library(manager, contender) => {
                let strategy = if *contender == Contender::Poll {
                    WaitStrategy::Poll
                } else {
                    WaitStrategy::Queue
                };
                let options = options.with_wait_strategy(strategy);
                (manager.acquire(key, options).await).map_or_else(timed_out, |g| Ok(Taken::Lock(g)))
            }
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
            (_, Taken::Lock(guard)) => drop(guard.release().await),
            (_, Taken::Permit(permit)) => drop(permit.release().await),
            (Self::Raw(raw), Taken::Raw) => raw.unlock(id).await?,
            _ => {}
        }
        Ok(())
    }
}

/// How long a task holds on its `turn`: [`HOLD`], or with `jobs` a job of 100–400 ms
/// (spread by task and turn).
fn hold(jobs: bool, task: usize, turn: u64) -> Duration {
    let spread = (task as u64)
        .wrapping_mul(7_919)
        .wrapping_add(turn.wrapping_mul(104_729));
    if jobs {
        Duration::from_millis(100 + spread % 301)
    } else {
        HOLD
    }
}

/// One measured combination: who contends, how many, and what they did.
struct Cell {
    contender: Contender,
    tasks: usize,
    jobs: bool,
    recorder: Arc<Recorder>,
    /// The turns of each task, a window each.
    windows: Vec<Vec<u64>>,
    measured: Duration,
}

impl Cell {
    fn new(contender: Contender, tasks: usize, jobs: bool) -> Self {
        let recorder = Arc::new(Recorder::new(tasks, contender.capacity()));
        let (windows, measured) = (Vec::new(), Duration::ZERO);
        Self {
            contender,
            tasks,
            jobs,
            recorder,
            windows,
            measured,
        }
    }

    /// One window: the cell's tasks loop on a key of their own until `length` has passed.
    async fn window(
        &mut self,
        db: &Database,
        length: Duration,
        key: String,
    ) -> Result<(), BoxError> {
        let mut takers = Vec::with_capacity(self.tasks);
        for _ in 0..self.tasks {
            takers.push(Taker::new(db, self.contender).await?);
        }
        let id = lock_id(&key);
        let key: Arc<str> = key.into();
        let end = Instant::now() + length;
        let mut running = tokio::task::JoinSet::new();
        for (task, taker) in takers.into_iter().enumerate() {
            let (recorder, key, jobs) = (Arc::clone(&self.recorder), Arc::clone(&key), self.jobs);
            running.spawn(async move {
                let mut turn = 0;
                while Instant::now() < end {
                    let called = Instant::now();
                    recorder.begin_wait(task, called);
                    let Ok(taken) = tokio::time::timeout_at(end.into(), taker.take(&key, id)).await
                    else {
                        // The window is over; dropping the wait cancels it.
                        recorder.gave_up(task, Instant::now(), true);
                        break;
                    };
                    let taken = taken?;
                    if matches!(taken, Taken::TimedOut) {
                        recorder.gave_up(task, Instant::now(), false);
                        continue;
                    }
                    recorder.acquired(task, called, Instant::now());
                    tokio::time::sleep(hold(jobs, task, turn)).await;
                    turn += 1;
                    recorder.releasing(task, Instant::now());
                    taker.give_back(taken, id).await?;
                }
                Ok::<_, BoxError>(())
            });
        }
        while let Some(joined) = running.join_next().await {
            joined??;
        }
        self.windows.push(self.recorder.finish_window());
        self.measured += length;
        Ok(())
    }

    /// Its targets: gap p99, fairness, idle share, and whether at most N hold at once.
    fn limits(&self) -> (Option<Duration>, Option<f64>, Option<f64>, bool) {
        let ms = Duration::from_millis;
        match (self.contender, self.tasks, self.jobs) {
            (Contender::Queue, 4, _) => (Some(ms(2)), Some(1.5), None, false),
            (Contender::Queue, ..) => (None, Some(1.5), None, false),
            (Contender::Permits, _, false) => (Some(ms(5)), Some(1.5), None, true),
            (Contender::Permits, _, true) => (Some(ms(10)), None, Some(0.01), true),
            _ => (None, None, None, false),
        }
    }

    fn name(&self) -> String {
        let label = self.contender.says().1;
        if self.jobs {
            format!("{label}, 100–400 ms jobs")
        } else {
            label.to_owned()
        }
    }
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
    let locks = [Contender::Raw, Contender::Queue, Contender::Poll];
    let mut cells: Vec<Cell> = CONTENDERS
        .iter()
        .flat_map(|&tasks| locks.map(|contender| Cell::new(contender, tasks, false)))
        .chain([Cell::new(Contender::Permits, 16, false)])
        .collect();
    harness::rounds(plan.handoff_rounds, cells.len(), async |round, side| {
        let cell = &mut cells[side];
        let length = if cell.contender == Contender::Poll {
            plan.handoff_poll_window
        } else {
            plan.handoff_window
        };
        let key = format!("bench:handoff:{round}:{side}:{}", std::process::id());
        cell.window(db, length, key).await
    })
    .await?;
    let mut jobs = Cell::new(Contender::Permits, JOB_TASKS, true);
    let key = format!("bench:handoff:jobs:{}", std::process::id());
    jobs.window(db, JOB_WINDOW, key).await?;
    cells.push(jobs);

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
        "most inside",
        "idle share",
        "Result",
    ];
    let title = "4. Handoff under contention: one key, hold 2 ms, acquire timeout 5 s";
    let mut out = Outcome::new("handoff", title, &header);
    out.note(format!(
        "{} rounds, each one window per row ({:.1} s, Poll {:.1} s), the order rotating; \
         then one window of {JOB_WINDOW:?} of long jobs. Every task has its own manager and \
         pool of one (like separate processes). **gap** = from just before a holder calls \
         release to the return of the next acquisition by anyone, matched in order; **gap \
         to a waiter** = from a release while others waited to the return of an acquisition \
         by one of those waiters; **wait** = one acquire call, start to grant; **fairness** \
         = most turns / fewest turns per window (worst window); **re-taken** = share of \
         handoffs where the releaser took the lock straight back; **idle share** = capacity \
         left free while someone waited, over N × the time.",
        plan.handoff_rounds,
        plan.handoff_window.as_secs_f64(),
        plan.handoff_poll_window.as_secs_f64(),
    ));
    let mut json_cells = Vec::new();
    let mut curves: [Vec<Curve>; 2] = Default::default();
    for cell in &cells {
        let (id, _, color) = cell.contender.says();
        let name = cell.name();
        let state = cell.recorder.with(std::mem::take);
        let gaps = Latencies::of(&state.gaps);
        let waiter_gaps = Latencies::of(&state.waiter_gaps);
        let waits = Latencies::of(&state.waits);
        let fairness_by_window: Vec<f64> = cell.windows.iter().map(|t| fairness(t)).collect();
        let worst = fairness_by_window.iter().copied().fold(0.0_f64, f64::max);
        let turns: u64 = cell.windows.iter().flatten().sum();
        let capacity = cell.contender.capacity();
        let idle =
            state.idle.as_secs_f64() / (cell.measured.as_secs_f64() * as_f64(capacity as u64));
        let what = format!("{name}, {} tasks", cell.tasks);
        let (gap_limit, fairness_limit, idle_limit, inside) = cell.limits();
        let mut missed = Vec::new();
        let mut gate = |measure: &str, measured: String, limit: String, pass: bool| {
            out.gate(format!("handoff {measure}, {what}"), measured, limit, pass);
            if !pass {
                missed.push(measure.to_owned());
            }
        };
        if let Some(limit) = gap_limit {
            let pass = gaps.count() > 0 && gaps.p99() <= nanos(limit);
            gate(
                "gap p99",
                fmt_ns(gaps.p99()),
                format!("≤ {}", fmt_ns(nanos(limit))),
                pass,
            );
        }
        if let Some(limit) = fairness_limit {
            gate(
                "fairness (worst window)",
                fmt_fairness(worst),
                format!("≤ {limit}"),
                worst <= limit,
            );
        }
        if let Some(limit) = idle_limit {
            let shown = format!("{:.2} %", idle * 100.0);
            gate(
                "idle share",
                shown,
                format!("≤ {:.0} %", limit * 100.0),
                idle <= limit,
            );
        }
        if inside {
            let most = state.most_inside;
            gate(
                "most inside at once",
                most.to_string(),
                format!("≤ {capacity}"),
                most <= capacity,
            );
        }
        let gated = gap_limit.is_some() || fairness_limit.is_some() || inside;
        let result = match &missed[..] {
            [] if !gated => String::new(),
            [] => verdict(true).to_owned(),
            missed => format!("MISS: {}", missed.join(", ")),
        };
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
            name,
            turns,
            fmt_ns(gaps.p50()),
            fmt_ns(gaps.p99()),
            fmt_ns(waiter_gaps.p50()),
            fmt_ns(waiter_gaps.p99()),
            fmt_ns(waits.p99()),
            fmt_fairness(worst),
            retaken,
            state.timeouts,
            state.most_inside,
            format!("{:.2} %", idle * 100.0),
            result,
        ]);
        let fairness_by_window: Vec<Value> =
            fairness_by_window.iter().map(|&f| finite(f)).collect();
        json_cells.push(json!({
            "contenders": cell.tasks,
            "strategy": id,
            "jobs": cell.jobs,
            "label": name,
            "turns": turns,
            "turns_by_window": cell.windows,
            "fairness_by_window": fairness_by_window,
            "fairness_worst": finite(worst),
            "gap": gaps.to_json(),
            "gap_to_waiter": waiter_gaps.to_json(),
            "wait": waits.to_json(),
            "most_inside": state.most_inside,
            "idle_share": idle,
            "retaken_by_releaser": state.retaken,
            "timeouts": state.timeouts,
            "releases_abandoned_by_all_waiters": state.abandoned,
            "releases_unserved_at_window_end": state.unserved_at_end,
        }));
        if cell.contender != Contender::Permits {
            for (side, samples) in [&state.gaps, &state.waiter_gaps].into_iter().enumerate() {
                curves[side].push(Curve {
                    label: format!("{name}, {} contenders (n = {})", cell.tasks, samples.len()),
                    color,
                    dashed: cell.tasks > CONTENDERS[0],
                    points: cdf(samples),
                });
            }
        }
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
    let titles = [
        "release → next acquisition (anyone)",
        "release → acquisition by a task already waiting",
    ];
    let panels = titles.into_iter().zip(curves).map(|(title, curves)| Panel {
        title: title.to_owned(),
        x_desc: "gap",
        y_desc: "share of handoffs",
        y_unit: Unit::Share,
        curves,
    });
    let title = "Lock handoff: cumulative distribution of gaps (log scale)";
    let svg = curves_svg(title, &panels.collect::<Vec<_>>(), 2, &chart_notes)?;
    out.files.push(("handoff.svg", svg));
    Ok(out.with(json!({
        "hold_ms": 2,
        "acquire_timeout_s": 5,
        "permits": PERMITS,
        "rounds": plan.handoff_rounds,
        "window_s": plan.handoff_window.as_secs_f64(),
        "poll_window_s": plan.handoff_poll_window.as_secs_f64(),
        "jobs_window_s": JOB_WINDOW.as_secs_f64(),
        "cells": json_cells,
    })))
}
