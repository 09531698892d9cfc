//! How long a call and each of its steps may take: the call's [`Deadline`], the
//! [`Limit`] of one step, and a timer that holds a step to it, armed only once the step
//! has to wait.
//!
//! Lock statements are held to their limits by the watchdog (one floor up, in
//! `watchdog.rs`); the other steps (a pool checkout, waiting for a shared
//! connection) use [`Limit::run`]: a tokio timer, made only if the step does not
//! finish at its first poll, so a checkout of an idle connection costs no timer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use locks_port::deadline_after;
use tokio::time::{Instant, Sleep};

/// How long one step may take.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Limit {
    /// This long from that instant (a bounded call: its start, and its timeout plus
    /// the margin), saturating.
    Since(Instant, Duration),
    /// This long from when the step first has to wait (a step of an unbounded call,
    /// bounded by the connect or the answer timeout).
    Waiting(Duration),
    /// No limit (an unbounded wait for the lock: it waits as long as it takes, and a
    /// connection that ends meanwhile fails the statement).
    None,
}

/// The deadline of a bounded call: when the call started and its timeout (kept apart:
/// the uncontended path never needs the sum, only the contended one does).
#[derive(Clone, Copy)]
pub(crate) struct Deadline {
    started: Instant,
    pub(crate) timeout: Duration,
}

impl Deadline {
    /// `timeout` from now.
    pub(crate) fn after(timeout: Duration) -> Self {
        Self {
            started: Instant::now(),
            timeout,
        }
    }

    /// The deadline, saturating (a `Duration::MAX` timeout is centuries away).
    pub(crate) fn at(self) -> Instant {
        after(self.started, self.timeout)
    }

    pub(crate) fn remaining(self) -> Duration {
        self.at().saturating_duration_since(Instant::now())
    }

    /// The `lock_timeout` of a wait that must end by this deadline, in whole ms
    /// rounded up, capped at `i32::MAX` ms (about 24.8 days: the server's limit);
    /// `None` when no time is left.
    pub(crate) fn lock_timeout_ms(self) -> Option<u32> {
        let ms = self.remaining().as_micros().div_ceil(1000);
        if ms == 0 {
            return None;
        }
        Some(u32::try_from(ms).map_or(i32::MAX.unsigned_abs(), |ms| {
            ms.min(i32::MAX.unsigned_abs())
        }))
    }

    pub(crate) fn passed(self) -> bool {
        Instant::now() >= self.at()
    }

    /// The limit of a step of a call with this deadline (`None`: an unbounded call):
    /// the deadline plus `margin`, or `otherwise` from when the step has to wait.
    pub(crate) fn limit(deadline: Option<Self>, margin: Duration, otherwise: Duration) -> Limit {
        match deadline {
            Some(deadline) => {
                Limit::Since(deadline.started, deadline.timeout.saturating_add(margin))
            }
            None => Limit::Waiting(otherwise),
        }
    }
}

/// The step did not finish within its [`Limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Expired;

/// `duration` after `start`, saturating (the port's [`deadline_after`]: a limit of
/// [`Duration::MAX`] is centuries away).
pub(crate) fn after(start: Instant, duration: Duration) -> Instant {
    Instant::from_std(deadline_after(start.into_std(), duration))
}

impl Limit {
    /// The instant the limit passes, counted from now; `None` without a limit.
    fn at(self) -> Option<Instant> {
        match self {
            Self::Since(start, duration) => Some(after(start, duration)),
            Self::Waiting(duration) => Some(after(Instant::now(), duration)),
            Self::None => None,
        }
    }

    /// `future` within the limit, on a timer of its own made only if `future` does not
    /// finish at its first poll.
    pub(crate) fn run<F: Future>(self, future: F) -> Bounded<F> {
        Bounded {
            future,
            limit: self,
            sleep: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// A future within a [`Limit`]: its output, or [`Expired`] when the limit passed
    /// first. The future is polled first, so an answer that is there wins over a limit
    /// that passed meanwhile (as with `tokio::time::timeout`).
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub(crate) struct Bounded<F> {
        #[pin]
        future: F,
        limit: Limit,
        sleep: Option<Pin<Box<Sleep>>>,
    }
}

impl<F: Future> Future for Bounded<F> {
    type Output = Result<F::Output, Expired>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        if this.sleep.is_none() {
            let Some(at) = this.limit.at() else {
                return Poll::Pending;
            };
            *this.sleep = Some(Box::pin(tokio::time::sleep_until(at)));
        }
        match this.sleep {
            Some(sleep) => sleep.as_mut().poll(cx).map(|()| Err(Expired)),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_ready_future_makes_no_timer_and_a_waiting_one_expires() {
        let ready = Limit::Waiting(Duration::from_secs(1)).run(async { 7 });
        assert_eq!(ready.await, Ok(7));

        let started = Instant::now();
        let waiting = Limit::Waiting(Duration::from_secs(1))
            .run(std::future::pending::<()>())
            .await;
        assert_eq!(waiting, Err(Expired));
        assert_eq!(started.elapsed(), Duration::from_secs(1));

        let started = Instant::now();
        let until = Limit::Since(started, Duration::from_secs(3))
            .run(std::future::pending::<()>())
            .await;
        assert_eq!(until, Err(Expired));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_never_expires_and_a_far_limit_saturates() {
        let step = Limit::None.run(tokio::time::sleep(Duration::from_secs(3600)));
        assert_eq!(step.await, Ok(()));
        let far = Limit::Waiting(Duration::MAX).run(tokio::time::sleep(Duration::from_secs(60)));
        assert_eq!(far.await, Ok(()));
    }
}
