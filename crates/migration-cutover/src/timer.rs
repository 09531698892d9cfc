//! A runtime-free timer: `sleep` and `timeout` for any executor.
//!
//! The crate bounds the paused window of a cutover and the waits of paused writers,
//! and must do so whatever executor runs it, so it does not depend on tokio's timer.
//! One background thread (`migration-cutover-timer`, started on first use) keeps a
//! heap of deadlines and wakes each sleeping task when its deadline passes.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Locks a mutex, carrying on with the data if a panicking thread poisoned it: every
/// critical section in this crate leaves its data consistent at each statement.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

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
pub(crate) fn sleep(duration: Duration) -> Sleep {
    Sleep {
        deadline: Instant::now().checked_add(duration),
        slot: None,
    }
}

/// The future of [`sleep`].
#[derive(Debug)]
pub(crate) struct Sleep {
    /// `None`: too far away to represent, never completes.
    deadline: Option<Instant>,
    slot: Option<Arc<Slot>>,
}

#[derive(Debug, Default)]
struct Slot {
    waker: Mutex<Option<Waker>>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(deadline) = self.deadline else {
            return Poll::Pending;
        };
        if Instant::now() >= deadline {
            return Poll::Ready(());
        }
        match &self.slot {
            Some(slot) => {
                *lock(&slot.waker) = Some(cx.waker().clone());
            }
            None => {
                let slot = Arc::new(Slot {
                    waker: Mutex::new(Some(cx.waker().clone())),
                });
                timer().schedule(deadline, Arc::downgrade(&slot));
                self.slot = Some(slot);
            }
        }
        // The deadline may have passed while registering; the timer only wakes what
        // it finds registered, so look again.
        if Instant::now() >= deadline {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[derive(Debug)]
struct Entry {
    deadline: Instant,
    seq: u64,
    slot: Weak<Slot>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

#[derive(Debug, Default)]
struct Timer {
    queue: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Queue {
    heap: BinaryHeap<Reverse<Entry>>,
    next_seq: u64,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::default());
        std::thread::Builder::new()
            .name("migration-cutover-timer".into())
            .spawn(move || timer.run())
            // Without a thread no timeout could ever fire; there is nothing to fall back on.
            .expect("the migration-cutover timer thread could not be started");
        timer
    })
}

impl Timer {
    fn schedule(&self, deadline: Instant, slot: Weak<Slot>) {
        let mut queue = lock(&self.queue);
        let seq = queue.next_seq;
        queue.next_seq = queue.next_seq.wrapping_add(1);
        queue.heap.push(Reverse(Entry {
            deadline,
            seq,
            slot,
        }));
        drop(queue);
        self.changed.notify_one();
    }

    fn run(&self) {
        let mut queue = lock(&self.queue);
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while queue
                .heap
                .peek()
                .is_some_and(|Reverse(entry)| entry.deadline <= now)
            {
                if let Some(Reverse(entry)) = queue.heap.pop() {
                    due.push(entry.slot);
                }
            }
            if !due.is_empty() {
                drop(queue);
                for slot in due.iter().filter_map(Weak::upgrade) {
                    let waker = lock(&slot.waker).take();
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                }
                queue = lock(&self.queue);
                continue;
            }
            queue = match queue.heap.peek() {
                Some(Reverse(entry)) => {
                    let wait = entry.deadline.saturating_duration_since(now);
                    self.changed
                        .wait_timeout(queue, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
    use std::task::Wake;

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
    fn many_sleepers_all_wake_in_deadline_order() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = [120u64, 10, 60]
            .into_iter()
            .map(|ms| {
                let order = order.clone();
                std::thread::spawn(move || {
                    block_on(sleep(Duration::from_millis(ms)));
                    lock(&order).push(ms);
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("sleeper thread");
        }
        assert_eq!(*lock(&order), vec![10, 60, 120]);
    }
}
