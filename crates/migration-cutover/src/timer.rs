//! `sleep` and `timeout` for any executor.
//!
//! The crate bounds the paused window of a cutover and the waits of paused writers,
//! and must do so whatever executor runs it (it depends on no runtime, architecture
//! invariant 5). [`futures_timer::Delay`] does that: one helper thread, started on first
//! use, wakes each sleeping task at its deadline, whoever polls it. A duration too long
//! to represent is clamped to about 30 years, so no bound the API accepts overflows.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use futures_timer::Delay;

/// The deadline passed before the future finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Elapsed;

/// Runs `future` for at most `limit`; `Err(Elapsed)` drops it unfinished.
pub(crate) async fn timeout<F: Future>(limit: Duration, future: F) -> Result<F::Output, Elapsed> {
    let mut future = pin!(future);
    let mut sleep = pin!(sleep(limit));
    std::future::poll_fn(|cx| {
        // The future goes first: if it finishes in the poll the timer fires, it wins.
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(Elapsed));
        }
        Poll::Pending
    })
    .await
}

/// Completes once `duration` has passed.
pub(crate) fn sleep(duration: Duration) -> Delay {
    Delay::new(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Wake, Waker};
    use std::time::Instant;

    struct Flag(AtomicBool, std::thread::Thread);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, AtomicOrdering::SeqCst);
            self.1.unpark();
        }
    }

    /// A minimal executor: poll, park until woken.
    fn block_on<F: Future>(future: F) -> F::Output {
        let flag = Arc::new(Flag(AtomicBool::new(false), std::thread::current()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut future = pin!(future);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return output;
            }
            while !flag.0.swap(false, AtomicOrdering::SeqCst) {
                std::thread::park();
            }
        }
    }

    #[test]
    fn sleep_waits_at_least_its_duration_and_wakes_the_task() {
        let started = Instant::now();
        block_on(sleep(Duration::from_millis(30)));
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(30), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    }

    #[test]
    fn timeout_gives_the_output_when_the_future_is_quick() {
        let output = block_on(timeout(Duration::from_secs(5), async { 7 }));
        assert_eq!(output, Ok(7));
    }

    #[test]
    fn timeout_gives_elapsed_when_the_future_is_slow() {
        let started = Instant::now();
        let output = block_on(timeout(
            Duration::from_millis(20),
            sleep(Duration::from_secs(30)),
        ));
        assert_eq!(output, Err(Elapsed));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn the_longest_timeout_does_not_overflow_and_gives_the_output() {
        let output = block_on(timeout(Duration::MAX, async { 7 }));
        assert_eq!(output, Ok(7));
    }

    #[test]
    fn many_sleepers_all_wake_in_deadline_order() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = [120u64, 10, 60]
            .into_iter()
            .map(|ms| {
                let order = order.clone();
                std::thread::spawn(move || {
                    block_on(sleep(Duration::from_millis(ms)));
                    order.lock().expect("order").push(ms);
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("sleeper thread");
        }
        assert_eq!(*order.lock().expect("order"), vec![10, 60, 120]);
    }
}
