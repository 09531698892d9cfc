//! Floor 2: tasks taking turns on one key (`handoff`, the scale waiters curve), each with a
//! manager and pool of its own (or a raw connection) looping acquire / hold / release
//! until the window ends, timed on one clock by [`State`] (the figures' definitions:
//! `docs/benchmarks.md`, "What each scenario measures").

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockAcquisitionError, LockGuard};
use locks_port::{PermitGuard, Semaphore, WaitStrategy, lock_id};
use locks_postgres::tokio_postgres::error::SqlState;
use locks_postgres::{PostgresLockGuard, PostgresLockManager, PostgresPermit};

use crate::db::{Database, OPENING, Raw, each, open_pool};
use crate::stats::nanos;
use crate::{BoxError, Result};

/// Who contends: raw `pg_advisory_lock`, one dedicated connection per task; the library
/// waiting on the server (`Queue`) or polling every 100 ms as the Python library
/// (`Poll`); or the library's semaphore of this many permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contender {
    Raw,
    Queue,
    Poll,
    Permits(u32),
}

impl Contender {
    /// How many may hold at once.
    pub(crate) fn capacity(self) -> usize {
        match self {
            Self::Permits(n) => n as usize,
            _ => 1,
        }
    }
}

/// How one task takes and gives back the lock: a manager of its own, or a raw connection.
enum Taker {
    Library(PostgresLockManager, Contender, AcquireOptions),
    Raw(Raw),
}

enum Taken {
    Lock(PostgresLockGuard),
    Permit(PostgresPermit),
    Raw,
}

impl Taker {
    /// The lock (or a permit), or `None` when the acquisition timed out.
    async fn take(&self, key: &str, id: i64) -> Result<Option<Taken>> {
        let timed_out = |error: LockAcquisitionError| match error.is_timeout() {
            true => Ok(None),
            false => Err(error.into()),
        };
        match self {
            Self::Library(manager, Contender::Permits(n), options) => {
                let permit = manager.acquire_permit(key, *n, *options).await;
                permit.map_or_else(timed_out, |permit| Ok(Some(Taken::Permit(permit))))
            }
            Self::Library(manager, _, options) => (manager.acquire(key, *options).await)
                .map_or_else(timed_out, |guard| Ok(Some(Taken::Lock(guard)))),
            Self::Raw(raw) => match raw.lock(id).await {
                Ok(()) => Ok(Some(Taken::Raw)),
                Err(error) if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(None),
                Err(error) => Err(error.into()),
            },
        }
    }

    async fn give_back(&self, taken: Taken, id: i64) -> Result<()> {
        match (self, taken) {
            (_, Taken::Lock(guard)) => drop(guard.release().await),
            (_, Taken::Permit(permit)) => drop(permit.release().await),
            (Self::Raw(raw), Taken::Raw) => raw.unlock(id).await?,
            (Self::Library(..), Taken::Raw) => unreachable!("a library taker takes no raw lock"),
        }
        Ok(())
    }
}

/// What the windows of one contender and task count measured: the turns of each task, a
/// window each, and the windows' length, summed.
#[derive(Debug)]
pub(crate) struct Turns {
    pub(crate) contender: Contender,
    pub(crate) tasks: usize,
    state: Arc<Mutex<State>>,
    pub(crate) windows: Vec<Vec<u64>>,
    pub(crate) measured: Duration,
}

impl Turns {
    pub(crate) fn new(contender: Contender, tasks: usize) -> Self {
        let state = Arc::new(Mutex::new(State::new(tasks, contender.capacity())));
        let (windows, measured) = (Vec::new(), Duration::ZERO);
        Self {
            contender,
            tasks,
            state,
            windows,
            measured,
        }
    }

    /// One window: the tasks, on connections tagged `app` ([`OPENING`] opened at once),
    /// loop acquire / hold `hold(task, turn)` / release on `key` until `length` has passed
    /// (then the connections close); `bounded`: acquisitions time out after 5 s (raw:
    /// `lock_timeout`).
    pub(crate) async fn window(
        &mut self,
        db: &Database,
        (app, bounded): (&'static str, bool),
        key: String,
        length: Duration,
        hold: fn(usize, u64) -> Duration,
    ) -> Result<()> {
        let (db, contender) = (db.clone(), self.contender);
        let takers = each(0..self.tasks, OPENING, move |_| {
            let db = db.clone();
            async move {
                if contender == Contender::Raw {
                    let raw = Raw::connect(&db, app, false).await?;
                    if bounded {
                        raw.client.simple_query("SET lock_timeout = '5s'").await?;
                    }
                    return Ok(Taker::Raw(raw));
                }
                let pool = open_pool(&db, 1, app).await?;
                let strategy = match contender {
                    Contender::Poll => WaitStrategy::Poll,
                    _ => WaitStrategy::Queue,
                };
                let mut options = AcquireOptions::new().with_wait_strategy(strategy);
                if bounded {
                    options = options.with_timeout(Duration::from_secs(5));
                }
                let manager = PostgresLockManager::new(pool);
                Ok(Taker::Library(manager, contender, options))
            }
        });
        let (takers, id) = (takers.await?, lock_id(&key));
        let key: Arc<str> = key.into();
        let end = Instant::now() + length;
        let mut running = tokio::task::JoinSet::new();
        for (task, taker) in takers.into_iter().enumerate() {
            let (state, key) = (Arc::clone(&self.state), Arc::clone(&key));
            running.spawn(async move {
                let record = |f: &dyn Fn(&mut State)| f(&mut lock(&state));
                let mut turn = 0;
                while Instant::now() < end {
                    let called = Instant::now();
                    record(&|s| s.begin_wait(task, called));
                    let Ok(taken) = tokio::time::timeout_at(end.into(), taker.take(&key, id)).await
                    else {
                        // The window is over; dropping the wait cancels it.
                        record(&|s| s.gave_up(task, Instant::now(), true));
                        break;
                    };
                    let Some(taken) = taken? else {
                        record(&|s| s.gave_up(task, Instant::now(), false));
                        continue;
                    };
                    record(&|s| s.acquired(task, called, Instant::now()));
                    tokio::time::sleep(hold(task, turn)).await;
                    turn += 1;
                    record(&|s| s.releasing(task, Instant::now()));
                    taker.give_back(taken, id).await?;
                }
                Ok::<_, BoxError>(())
            });
        }
        while let Some(joined) = running.join_next().await {
            joined??;
        }
        self.windows.push(lock(&self.state).finish_window());
        self.measured += length;
        Ok(())
    }

    /// What the windows recorded (taken: a second call finds it empty).
    pub(crate) fn take(&self) -> State {
        std::mem::take(&mut lock(&self.state))
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What happened during the windows of one [`Turns`].
#[derive(Debug, Default)]
pub(crate) struct State {
    /// How many may hold at once (N), and how many do.
    capacity: usize,
    inside: usize,
    pub(crate) most_inside: usize,
    /// Events so far: a release's waiters are the tasks whose wait began before it.
    events: u64,
    /// The event at which each task's current wait began.
    waiting_since: Vec<Option<u64>>,
    waiting: usize,
    /// Releases not yet followed by an acquisition, oldest first, and who released.
    released: VecDeque<(Instant, usize)>,
    /// Releases made while others waited: when, their event, waiters still waiting.
    open: Vec<(Instant, u64, usize)>,
    /// Capacity left free while someone waited, up to `last`.
    pub(crate) idle: Duration,
    last: Option<Instant>,
    pub(crate) gaps: Vec<u64>,
    pub(crate) waiter_gaps: Vec<u64>,
    pub(crate) waits: Vec<u64>,
    turns: Vec<u64>,
    pub(crate) retaken: u64,
    pub(crate) timeouts: u64,
    pub(crate) abandoned: u64,
    pub(crate) unserved_at_end: u64,
}

impl State {
    fn new(tasks: usize, capacity: usize) -> Self {
        let (turns, waiting_since) = (vec![0; tasks], vec![None; tasks]);
        Self {
            capacity,
            turns,
            waiting_since,
            ..Self::default()
        }
    }

    /// Adds the idle capacity since the last event, up to `now`; the next event's number.
    fn advance(&mut self, now: Instant) -> u64 {
        if let Some(last) = self.last {
            let idle = self.capacity.saturating_sub(self.inside).min(self.waiting);
            self.idle += now.saturating_duration_since(last) * u32::try_from(idle).unwrap_or(0);
        }
        self.last = Some(now);
        self.events += 1;
        self.events
    }

    /// Ends `task`'s wait: the open releases it was waiting at, each as `f` decides to
    /// keep it (`true`) or not.
    fn end_wait(&mut self, task: usize, mut f: impl FnMut(&mut (Instant, u64, usize)) -> bool) {
        if let Some(since) = self.waiting_since[task].take() {
            self.waiting -= 1;
            self.open.retain_mut(|open| open.1 < since || f(open));
        }
    }

    fn begin_wait(&mut self, task: usize, at: Instant) {
        self.waiting_since[task] = Some(self.advance(at));
        self.waiting += 1;
    }

    fn acquired(&mut self, task: usize, called: Instant, at: Instant) {
        self.advance(at);
        let mut served = Vec::new();
        self.end_wait(task, |&mut (released, ..)| {
            served.push(nanos(at.saturating_duration_since(released)));
            false
        });
        self.waiter_gaps.extend(served);
        self.inside += 1;
        self.most_inside = self.most_inside.max(self.inside);
        self.turns[task] += 1;
        self.waits.push(nanos(at - called));
        if let Some((released, releaser)) = self.released.pop_front() {
            self.gaps
                .push(nanos(at.saturating_duration_since(released)));
            self.retaken += u64::from(releaser == task);
        }
    }

    /// Call just before the release is issued.
    fn releasing(&mut self, task: usize, at: Instant) {
        let event = self.advance(at);
        self.inside -= 1;
        self.released.push_back((at, task));
        if self.waiting > 0 {
            self.open.push((at, event, self.waiting));
        }
    }

    /// `task` stopped waiting without the lock: its acquire timed out, or the window
    /// ended (`at_end`).
    fn gave_up(&mut self, task: usize, at: Instant, at_end: bool) {
        self.advance(at);
        self.timeouts += u64::from(!at_end);
        let mut emptied = 0;
        self.end_wait(task, |(_, _, waiters)| {
            *waiters -= 1;
            emptied += u64::from(*waiters == 0);
            *waiters > 0
        });
        match at_end {
            true => self.unserved_at_end += emptied,
            false => self.abandoned += emptied,
        }
    }

    /// Ends a window: what is still open was not served within it. The turns of each task.
    fn finish_window(&mut self) -> Vec<u64> {
        self.unserved_at_end += self.open.len() as u64;
        self.open.clear();
        self.released.clear();
        self.waiting_since.fill(None);
        (self.waiting, self.inside, self.last) = (0, 0, None);
        let tasks = self.turns.len();
        std::mem::replace(&mut self.turns, vec![0; tasks])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state of `tasks` tasks on `capacity`, and the time `n` milliseconds after a start.
    fn start(tasks: usize, capacity: usize) -> (State, impl Fn(u64) -> Instant) {
        let (t0, state) = (Instant::now(), State::new(tasks, capacity));
        (state, move |n| t0 + Duration::from_millis(n))
    }

    /// `task` begins to wait at `called` and gets the lock (or a permit) at `at`.
    fn turn(state: &mut State, task: usize, called: Instant, at: Instant) {
        state.begin_wait(task, called);
        state.acquired(task, called, at);
    }

    #[test]
    fn a_waiter_gap_closes_only_when_a_waiter_gets_the_lock() {
        let (mut state, ms) = start(3, 1);
        // Task 0 holds; 1 waits; 0 releases at 10 ms and takes it back at 11 ms.
        turn(&mut state, 0, ms(0), ms(1));
        state.begin_wait(1, ms(5));
        state.releasing(0, ms(10));
        turn(&mut state, 0, ms(10), ms(11));
        // 0 releases again at 20 ms; 1 gets it at 22 ms.
        state.releasing(0, ms(20));
        state.acquired(1, ms(5), ms(22));
        assert_eq!(state.finish_window(), vec![2, 1, 0]);
        assert_eq!((state.gaps, state.retaken), (vec![1_000_000, 2_000_000], 1));
        // Both releases had task 1 waiting: passed over for 12 ms, then 2 ms.
        assert_eq!(state.waiter_gaps, vec![12_000_000, 2_000_000]);
        // Free while someone waited: 0–1, 10–11 and 20–22 ms.
        assert_eq!(state.idle, Duration::from_millis(4));
    }

    #[test]
    fn a_semaphore_matches_releases_and_grants_in_order() {
        let (mut state, ms) = start(3, 2);
        state.acquired(0, ms(0), ms(0));
        state.acquired(1, ms(0), ms(0));
        state.begin_wait(2, ms(0));
        state.releasing(0, ms(10));
        state.releasing(1, ms(11));
        state.acquired(2, ms(0), ms(13));
        turn(&mut state, 0, ms(13), ms(14));
        assert_eq!(state.gaps, vec![3_000_000, 3_000_000]);
        assert_eq!((state.most_inside, state.inside), (2, 2));
        // One permit free while 2 waited (10–13 ms), then one while 0 waited (13–14).
        assert_eq!(state.idle, Duration::from_millis(4));
    }

    #[test]
    fn releases_whose_waiters_all_gave_up_are_counted_apart() {
        let (mut state, ms) = start(3, 1);
        state.acquired(0, ms(0), ms(0));
        state.begin_wait(1, ms(0));
        state.begin_wait(2, ms(0));
        state.releasing(0, ms(3));
        state.gave_up(1, ms(4), false);
        // Task 2 still waits: the release stays open until it too gives up.
        assert_eq!((state.abandoned, state.open.len()), (0, 1));
        state.gave_up(2, ms(5), false);
        assert_eq!((state.abandoned, state.timeouts), (1, 2));
        assert!(state.waiter_gaps.is_empty());
    }
}
