//! Deadlines and wake-ups held by one watchdog thread per process, instead of a
//! runtime timer per statement.
//!
//! Every lock statement runs within a limit (the call's deadline plus the margin, or
//! the answer timeout), so that a server that stops answering cannot hold a caller
//! past it, and the lost-lock monitor wakes every health-check interval while locks
//! are held. With tokio timers, each statement put an entry in the runtime's timer
//! wheel and took it out again, and while any timer was registered every park of the
//! runtime was a timed one; on the uncontended lock+unlock cycle that was a fifth of
//! what the library adds to its two statements.
//!
//! Here each connection (and each monitor) has a [`Watch`]: one atomic word that holds
//! a deadline, in whole milliseconds from the watchdog's start, while something waits
//! on it, and the waker of the task waiting. A statement arms it only once it has to
//! wait for its answer, and disarms it when answered: two atomic writes, no lock. The
//! watchdog thread sleeps until the earliest armed deadline (or [`NAP`] at most), marks
//! what is due as expired and wakes its task. A deadline earlier than the thread's
//! planned wake-up wakes the thread (rare: statement limits are seconds, naps one).
//!
//! Bounds: a deadline is never cut short and is held to within two milliseconds, plus
//! however late the operating system runs the thread. A statement that arms its watch
//! reads the clock once, on Linux straight from `CLOCK_MONOTONIC` (the clock of
//! [`Instant`]) in whole ms ([`Monotonic`]; `Instant::now` and the subtraction of the
//! epoch cost the lock cycle's two arms about 90 instructions more). With nothing armed
//! for [`IDLE`] the thread sleeps until something is. If the thread cannot be started
//! (or the process forked since), watches are not made and callers fall back to tokio
//! timers; so too when the environment says [`SWITCH`]` = off` (read when a watch is
//! made: the bench compares the two ways, ADR 0015).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;

use crate::limit::{Expired, Limit};

/// The longest the thread sleeps while something was armed within [`IDLE`].
const NAP: Duration = Duration::from_secs(1);
/// How long the thread keeps napping with nothing armed, before it sleeps until woken.
const IDLE: Duration = Duration::from_secs(10);

/// The environment variable that, set to `off`, makes no watches: statements and the
/// monitor use tokio timers (the fallback), and no watchdog thread is started.
pub(crate) const SWITCH: &str = "LOCKS_POSTGRES_WATCHDOG";

/// A watch's word when nothing waits on it.
const DISARMED: u64 = 0;
/// A watch's word once its deadline passed.
const EXPIRED: u64 = u64::MAX;

/// The deadline of one connection's statements (or one monitor's sleeps).
#[derive(Debug)]
pub(crate) struct Watch {
    /// [`DISARMED`], [`EXPIRED`], or the deadline in ms of the watchdog's clock.
    word: AtomicU64,
    waker: AtomicWaker,
    dog: &'static Watchdog,
}

impl Watch {
    /// A watch on the process's watchdog; `None` when its thread cannot be started or
    /// the environment turns it off ([`SWITCH`]).
    pub(crate) fn new() -> Option<Arc<Self>> {
        if std::env::var_os(SWITCH).is_some_and(|value| value == "off") {
            return None;
        }
        Watchdog::get().map(Self::on)
    }

    fn on(dog: &'static Watchdog) -> Arc<Self> {
        let watch = Arc::new(Self {
            word: AtomicU64::new(DISARMED),
            waker: AtomicWaker::new(),
            dog,
        });
        dog.lock().watches.push(Arc::downgrade(&watch));
        watch
    }

    /// `future` within `limit`: its output, or [`Expired`] once the watchdog found the
    /// limit passed.
    pub(crate) fn run<F: Future>(&self, limit: Limit, future: F) -> Watched<'_, F> {
        Watched {
            future,
            watch: self,
            limit,
            armed: false,
        }
    }

    /// Sleeps for `duration`.
    pub(crate) async fn sleep(&self, duration: Duration) {
        let _expired = self
            .run(Limit::Waiting(duration), std::future::pending::<()>())
            .await;
    }

    fn arm(&self, deadline_ms: u64, waker: &Waker) {
        self.waker.register(waker);
        self.word.store(deadline_ms, Ordering::SeqCst);
        // The thread stores its planned wake-up, then looks at every word: either it
        // sees this one, or this sees its plan.
        if deadline_ms < self.dog.next_wake.load(Ordering::SeqCst) {
            self.dog.rouse();
        }
    }

    fn disarm(&self) {
        self.word.store(DISARMED, Ordering::Release);
    }

    fn expired(&self) -> bool {
        self.word.load(Ordering::Acquire) == EXPIRED
    }

    /// Expires the watch if its deadline is at or before `now_ms`; the deadline still
    /// to come, if any.
    fn check(&self, now_ms: u64) -> Option<u64> {
        let word = self.word.load(Ordering::SeqCst);
        if word == DISARMED || word == EXPIRED {
            return None;
        }
        if now_ms < word {
            return Some(word);
        }
        if self
            .word
            .compare_exchange(word, EXPIRED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.waker.wake();
        }
        None
    }
}

pin_project_lite::pin_project! {
    /// A future within its [`Limit`], watched (see [`Watch::run`]). The future is
    /// polled first, so an answer that is there wins over a limit that passed.
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub(crate) struct Watched<'w, F> {
        #[pin]
        future: F,
        watch: &'w Watch,
        limit: Limit,
        armed: bool,
    }

    impl<'w, F> PinnedDrop for Watched<'w, F> {
        fn drop(this: Pin<&mut Self>) {
            if this.armed {
                this.watch.disarm();
            }
        }
    }
}

impl<F: Future> Future for Watched<'_, F> {
    type Output = Result<F::Output, Expired>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let watch = *this.watch;
        if let Poll::Ready(output) = this.future.poll(cx) {
            if *this.armed {
                *this.armed = false;
                watch.disarm();
            }
            return Poll::Ready(Ok(output));
        }
        if *this.armed {
            watch.waker.register(cx.waker());
        } else {
            let Some(deadline_ms) = watch.dog.deadline_ms(*this.limit) else {
                return Poll::Pending; // no limit
            };
            watch.arm(deadline_ms, cx.waker());
            *this.armed = true;
        }
        if watch.expired() {
            *this.armed = false;
            return Poll::Ready(Err(Expired));
        }
        Poll::Pending
    }
}

/// The watchdog: its clock, its watches, and when its thread next wakes.
#[derive(Debug)]
struct Watchdog {
    /// Its clock counts milliseconds from here.
    epoch: Instant,
    /// The clock statements arm with, read directly (`None`: through [`Instant`]).
    monotonic: Option<Monotonic>,
    /// When the thread plans to wake next (ms of its clock; `u64::MAX`: when woken).
    next_wake: AtomicU64,
    state: Mutex<State>,
    wake: Condvar,
    nap: Duration,
    idle: Duration,
}

/// What the watchdog's mutex guards.
#[derive(Debug, Default)]
struct State {
    watches: Vec<Weak<Watch>>,
    /// Set by a deadline earlier than the planned wake-up.
    roused: bool,
}

/// The process's watchdog and the process it was started in (a forked child has no
/// thread: it starts its own).
static WATCHDOG: Mutex<Option<(u32, &'static Watchdog)>> = Mutex::new(None);

impl Watchdog {
    /// The process's watchdog, its thread started on first use; `None` if it cannot be.
    fn get() -> Option<&'static Self> {
        let mut current = WATCHDOG.lock().unwrap_or_else(PoisonError::into_inner);
        let process = std::process::id();
        match *current {
            Some((started_in, dog)) if started_in == process => Some(dog),
            _ => {
                let dog = Self::start(NAP, IDLE)?;
                *current = Some((process, dog));
                Some(dog)
            }
        }
    }

    /// A watchdog and its thread (which lives as long as the process).
    fn start(nap: Duration, idle: Duration) -> Option<&'static Self> {
        let (epoch, monotonic) = Monotonic::start();
        let dog: &'static Self = Box::leak(Box::new(Self {
            epoch,
            monotonic,
            next_wake: AtomicU64::new(0),
            state: Mutex::default(),
            wake: Condvar::new(),
            nap,
            idle,
        }));
        std::thread::Builder::new()
            .name("locks-watchdog".into())
            .spawn(move || dog.run())
            .ok()
            .map(|_| dog)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn rouse(&self) {
        self.lock().roused = true;
        self.wake.notify_one();
    }

    fn ms(&self, at: Instant) -> u64 {
        millis(at.saturating_duration_since(self.epoch))
    }

    /// Now, in ms of the watchdog's clock, never earlier than [`ms`](Self::ms) of
    /// `Instant::now()` would say (two ms later at most): the start of a wait that
    /// arms a watch.
    fn arming_ms(&self) -> u64 {
        self.monotonic
            .and_then(Monotonic::now_ms)
            .unwrap_or_else(|| self.ms(Instant::now()))
    }

    /// The deadline of a wait from now within `limit`, in ms of the watchdog's clock,
    /// rounded up; `None` without a limit. Never [`DISARMED`] nor [`EXPIRED`].
    fn deadline_ms(&self, limit: Limit) -> Option<u64> {
        let ms = match limit {
            Limit::None => return None,
            Limit::Since(start, duration) => {
                self.ms(start.into_std()).saturating_add(millis(duration))
            }
            Limit::Waiting(duration) => self.arming_ms().saturating_add(millis(duration)),
        };
        Some(ms.saturating_add(1).clamp(1, EXPIRED - 1))
    }

    fn run(&self) {
        let mut last_armed = Instant::now();
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            let mut earliest = self.check_all(&mut state, self.ms(now));
            if earliest.is_some() {
                last_armed = now;
            }
            let napping = now.duration_since(last_armed) < self.idle;
            let mut plan = match earliest {
                Some(deadline) => deadline.min(self.ms(now + self.nap)),
                None if napping => self.ms(now + self.nap),
                None => u64::MAX,
            };
            loop {
                self.next_wake.store(plan, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                // A deadline armed while the plan was made, before it could be seen.
                earliest = self.check_all(&mut state, self.ms(Instant::now()));
                match earliest {
                    Some(deadline) if deadline < plan => plan = deadline,
                    _ => break,
                }
            }
            if !state.roused {
                state = if plan == u64::MAX {
                    self.wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner)
                } else {
                    let wait = Duration::from_millis(plan.saturating_sub(self.ms(Instant::now())));
                    match self.wake.wait_timeout(state, wait) {
                        Ok((state, _)) => state,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                };
            }
            state.roused = false;
        }
    }

    /// Expires what is due at `now_ms`, forgetting the watches of closed connections;
    /// the earliest deadline still to come.
    fn check_all(&self, state: &mut State, now_ms: u64) -> Option<u64> {
        let mut earliest = None;
        state.watches.retain(|watch| match watch.upgrade() {
            Some(watch) => {
                if let Some(deadline) = watch.check(now_ms) {
                    earliest = Some(earliest.map_or(deadline, |e: u64| e.min(deadline)));
                }
                true
            }
            None => false,
        });
        earliest
    }
}

/// `CLOCK_MONOTONIC` read directly (Linux), the clock of [`Instant`]: in whole ms
/// from the epoch's ms, without std's `Timespec` checks and `Instant` subtraction.
#[derive(Debug, Clone, Copy)]
struct Monotonic {
    /// `CLOCK_MONOTONIC` in whole ms, read just before the watchdog's epoch: never
    /// later than it, so a time counted from it is never earlier than the epoch's count.
    epoch_ms: u64,
}

#[cfg(target_os = "linux")]
impl Monotonic {
    /// The watchdog's epoch and its clock in ms (`None` if it cannot be read).
    fn start() -> (Instant, Option<Self>) {
        // Read again if the thread was held up between the reads (the epoch's ms would
        // be early, and every deadline that much late).
        let read = || (Self::read_ms(), Instant::now(), Self::read_ms());
        let (mut epoch_ms, mut epoch, mut after) = read();
        for _ in 0..3 {
            match (epoch_ms, after) {
                (Some(before), Some(after)) if after.saturating_sub(before) > 1 => {}
                _ => break,
            }
            (epoch_ms, epoch, after) = read();
        }
        (epoch, epoch_ms.map(|epoch_ms| Self { epoch_ms }))
    }

    /// `CLOCK_MONOTONIC` in whole ms (rounded down).
    fn read_ms() -> Option<u64> {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
        let secs = u64::try_from(now.tv_sec()).ok()?;
        let ms = u64::try_from(now.tv_nsec()).ok()? / 1_000_000;
        Some(secs.saturating_mul(1000).saturating_add(ms))
    }

    /// Now, in ms from the epoch: never earlier than the epoch's count of `Instant`s,
    /// two ms later at most (the roundings down, the reads around the epoch);
    /// `None` if the clock cannot be read.
    fn now_ms(self) -> Option<u64> {
        Some(Self::read_ms()?.saturating_sub(self.epoch_ms))
    }
}

#[cfg(not(target_os = "linux"))]
impl Monotonic {
    fn start() -> (Instant, Option<Self>) {
        (Instant::now(), None)
    }

    fn now_ms(self) -> Option<u64> {
        None
    }
}

/// Whole milliseconds, saturating (in 64-bit arithmetic: `Duration::as_millis` divides
/// in 128).
fn millis(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(duration.subsec_millis()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watchdog of the test's own, quick to go idle.
    fn watchdog(nap: Duration, idle: Duration) -> &'static Watchdog {
        Watchdog::start(nap, idle).expect("a watchdog thread")
    }

    async fn expires_after(watch: &Watch, limit: Duration) -> Duration {
        let started = Instant::now();
        let outcome = tokio::time::timeout(
            Duration::from_secs(10),
            watch.run(Limit::Waiting(limit), std::future::pending::<()>()),
        )
        .await
        .expect("the watchdog expired the wait");
        assert_eq!(outcome, Err(Expired));
        started.elapsed()
    }

    #[tokio::test]
    async fn a_wait_expires_at_its_limit_never_before() {
        let watch = Watch::on(watchdog(NAP, IDLE));
        for limit in [Duration::from_millis(30), Duration::from_millis(120)] {
            let waited = expires_after(&watch, limit).await;
            assert!(waited >= limit, "{waited:?} < {limit:?}");
            assert!(waited < limit + Duration::from_millis(900), "{waited:?}");
        }
        let until = Limit::Since(tokio::time::Instant::now(), Duration::from_millis(50));
        let started = Instant::now();
        let outcome = watch.run(until, std::future::pending::<()>()).await;
        assert_eq!(outcome, Err(Expired));
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[tokio::test]
    async fn an_answer_in_time_wins_and_disarms() {
        let watch = Watch::on(watchdog(NAP, IDLE));
        let answered = watch
            .run(
                Limit::Waiting(Duration::from_millis(500)),
                tokio::time::sleep(Duration::from_millis(20)),
            )
            .await;
        assert_eq!(answered, Ok(()));
        assert_eq!(watch.word.load(Ordering::SeqCst), DISARMED);

        let dropped = watch.run(
            Limit::Waiting(Duration::from_secs(5)),
            std::future::pending::<()>(),
        );
        let mut dropped = Box::pin(dropped);
        assert!(futures_util::poll!(dropped.as_mut()).is_pending());
        assert_ne!(watch.word.load(Ordering::SeqCst), DISARMED);
        drop(dropped);
        assert_eq!(watch.word.load(Ordering::SeqCst), DISARMED);

        let none = watch.run(Limit::None, tokio::time::sleep(Duration::from_millis(20)));
        assert_eq!(none.await, Ok(()));
    }

    #[tokio::test]
    async fn a_deadline_before_the_planned_wake_up_wakes_the_thread() {
        // Naps of 5 s: only being woken can expire a 50 ms wait in time.
        let dog = watchdog(Duration::from_secs(5), Duration::from_secs(60));
        let long = Watch::on(dog);
        let mut long_wait = Box::pin(long.run(
            Limit::Waiting(Duration::from_secs(30)),
            std::future::pending::<()>(),
        ));
        assert!(futures_util::poll!(long_wait.as_mut()).is_pending());
        tokio::time::sleep(Duration::from_millis(50)).await; // the thread plans its nap
        let short = Watch::on(dog);
        let waited = expires_after(&short, Duration::from_millis(50)).await;
        assert!(waited < Duration::from_secs(2), "{waited:?}");
    }

    #[tokio::test]
    async fn an_idle_watchdog_is_woken_by_the_next_wait() {
        let dog = watchdog(Duration::from_millis(20), Duration::from_millis(50));
        let watch = Watch::on(dog);
        tokio::time::sleep(Duration::from_millis(300)).await; // idle: sleeps until woken
        assert_eq!(dog.next_wake.load(Ordering::SeqCst), u64::MAX);
        let waited = expires_after(&watch, Duration::from_millis(40)).await;
        assert!(waited < Duration::from_secs(2), "{waited:?}");
    }

    /// The clock a watch arms with is never behind the one the thread expires
    /// deadlines by (a deadline is never cut short), and at most two ms ahead of it (a
    /// third for a start held up between its reads of the clocks).
    #[test]
    fn the_arming_clock_is_never_behind_the_expiring_one() {
        let dog = watchdog(NAP, IDLE);
        for round in 0..3_000 {
            if round % 100 == 0 {
                // Past the clock's first ms (where a count saturating at 0 hides a shift).
                std::thread::sleep(Duration::from_millis(1));
            }
            let before = dog.ms(Instant::now());
            let arming = dog.arming_ms();
            let after = dog.ms(Instant::now());
            assert!(
                arming >= before,
                "armed at {arming} ms, before it {before} ms"
            );
            assert!(
                arming <= after + 3,
                "armed at {arming} ms, after it {after} ms"
            );
        }
    }

    #[tokio::test]
    async fn short_waits_never_end_early() {
        let watch = Watch::on(watchdog(NAP, IDLE));
        for limit in (2..12).map(Duration::from_millis) {
            let waited = expires_after(&watch, limit).await;
            assert!(waited >= limit, "{waited:?} < {limit:?}");
        }
    }

    #[tokio::test]
    async fn sleep_sleeps() {
        let watch = Watch::new().expect("the process's watchdog");
        let started = Instant::now();
        watch.sleep(Duration::from_millis(60)).await;
        assert!(started.elapsed() >= Duration::from_millis(60));
    }
}
