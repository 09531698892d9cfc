//! How long one step may take, and the timers that hold it to that: armed only once
//! the step has to wait, and, for statements, one per connection, reused from one
//! statement to the next.
//!
//! Why not `tokio::time::timeout` around every step: a tokio timer is registered in the
//! runtime's timer wheel (under the driver's lock) the first time it is polled and taken
//! out again (under the lock) when dropped, and the handle it keeps is found and cloned
//! when it is made. On the uncontended path that was a third of what the library added
//! to a lock+unlock cycle. Here a step that finishes at its first poll (a pool checkout
//! of an idle connection) makes no timer at all, and a statement resets its
//! connection's timer, which, while the deadline only moves later, is one atomic write:
//! the entry stays in the wheel and is moved when its old deadline comes round.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
use tokio::time::{Instant, Sleep};

/// How long one step may take.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Limit {
    /// Until this instant (a bounded call: its deadline plus the margin).
    Until(Instant),
    /// This long from when the step first has to wait (a step of an unbounded call,
    /// bounded by the connect or the answer timeout).
    For(Duration),
    /// No limit (an unbounded wait for the lock: it waits as long as it takes, and a
    /// connection that ends meanwhile fails the statement).
    None,
}

/// The step did not finish within its [`Limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Expired;

/// How far away a limit of [`Duration::MAX`] is set (about 30 years).
const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

impl Limit {
    /// The instant the limit passes, counted from now; `None` without a limit.
    fn at(self) -> Option<Instant> {
        match self {
            Self::Until(at) => Some(at),
            Self::For(duration) => {
                let now = Instant::now();
                Some(now.checked_add(duration).unwrap_or_else(|| now + FAR))
            }
            Self::None => None,
        }
    }

    /// `future` within the limit, with a timer of its own (made only if `future` does
    /// not finish at its first poll).
    pub(crate) fn run<F: Future>(self, future: F) -> Bounded<'static, F> {
        self.bounded(future, TimerRef::Own(Timer::default()))
    }

    /// `future` within the limit, on `timer` (a connection's, reused).
    pub(crate) fn run_on<F: Future>(self, timer: &mut Timer, future: F) -> Bounded<'_, F> {
        self.bounded(future, TimerRef::Borrowed(timer))
    }

    fn bounded<F: Future>(self, future: F, timer: TimerRef<'_>) -> Bounded<'_, F> {
        Bounded {
            future,
            limit: self,
            armed: false,
            timer,
        }
    }
}

/// A reusable timer: one tokio [`Sleep`], made the first time a step has to wait and
/// reset for every later one on the same runtime.
#[derive(Debug, Default)]
pub(crate) struct Timer {
    /// The sleep and the runtime whose timer wheel it is in: reused on that runtime
    /// only, since a sleep polled after its runtime shut down panics.
    sleep: Option<(Id, Pin<Box<Sleep>>)>,
}

impl Timer {
    /// The sleep, set to end at `at`.
    fn set(&mut self, at: Instant) -> Pin<&mut Sleep> {
        let runtime = Handle::current().id();
        match &mut self.sleep {
            Some((id, sleep)) if *id == runtime => sleep.as_mut().reset(at),
            slot => *slot = Some((runtime, Box::pin(tokio::time::sleep_until(at)))),
        }
        let Some((_, sleep)) = self.sleep.as_mut() else {
            unreachable!("set just now")
        };
        sleep.as_mut()
    }

    fn armed(&mut self) -> Option<Pin<&mut Sleep>> {
        self.sleep.as_mut().map(|(_, sleep)| sleep.as_mut())
    }
}

/// The timer of one [`Bounded`] step.
#[derive(Debug)]
enum TimerRef<'t> {
    Own(Timer),
    Borrowed(&'t mut Timer),
}

impl TimerRef<'_> {
    fn get(&mut self) -> &mut Timer {
        match self {
            Self::Own(timer) => timer,
            Self::Borrowed(timer) => timer,
        }
    }
}

pin_project_lite::pin_project! {
    /// A future within a [`Limit`]: its output, or [`Expired`] when the limit passed
    /// first. The future is polled first, so an answer that is there wins over a limit
    /// that passed meanwhile (as with `tokio::time::timeout`).
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub(crate) struct Bounded<'t, F> {
        #[pin]
        future: F,
        limit: Limit,
        armed: bool,
        timer: TimerRef<'t>,
    }
}

impl<F: Future> Future for Bounded<'_, F> {
    type Output = Result<F::Output, Expired>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        let timer = this.timer.get();
        let sleep = if *this.armed {
            timer.armed()
        } else {
            let at = this.limit.at();
            *this.armed = at.is_some();
            at.map(|at| timer.set(at))
        };
        match sleep {
            Some(sleep) => sleep.poll(cx).map(|()| Err(Expired)),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_ready_future_makes_no_timer_and_a_waiting_one_expires() {
        let mut timer = Timer::default();
        let ready = Limit::For(Duration::from_secs(1)).run_on(&mut timer, async { 7 });
        assert_eq!(ready.await, Ok(7));
        assert!(
            timer.sleep.is_none(),
            "no timer for a step that did not wait"
        );

        let started = Instant::now();
        let waiting = Limit::For(Duration::from_secs(1))
            .run_on(&mut timer, std::future::pending::<()>())
            .await;
        assert_eq!(waiting, Err(Expired));
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_timer_holds_each_steps_own_limit() {
        let mut timer = Timer::default();
        for seconds in [5, 1, 3] {
            let started = Instant::now();
            let limit = Limit::Until(started + Duration::from_secs(seconds));
            let outcome = limit.run_on(&mut timer, std::future::pending::<()>()).await;
            assert_eq!(outcome, Err(Expired));
            assert_eq!(started.elapsed(), Duration::from_secs(seconds));
        }
        let sleeping = Limit::For(Duration::from_secs(2))
            .run_on(&mut timer, tokio::time::sleep(Duration::from_secs(1)))
            .await;
        assert_eq!(
            sleeping,
            Ok(()),
            "a step that ends in time is not cut short"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_never_expires_and_a_far_limit_saturates() {
        let step = Limit::None.run(tokio::time::sleep(Duration::from_secs(3600)));
        assert_eq!(step.await, Ok(()));
        let far = Limit::For(Duration::MAX).run(tokio::time::sleep(Duration::from_secs(60)));
        assert_eq!(far.await, Ok(()));
    }

    #[test]
    fn a_timer_from_a_runtime_that_ended_is_not_reused() {
        let mut timer = Timer::default();
        for _ in 0..2 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime");
            let outcome = runtime.block_on(
                Limit::For(Duration::from_millis(5))
                    .run_on(&mut timer, std::future::pending::<()>()),
            );
            assert_eq!(outcome, Err(Expired));
        }
    }
}
