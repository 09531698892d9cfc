//! The lost-lock signal: how a guard tells its holder that the lock is no longer held.
//!
//! A manager creates one [`LossNotifier`] per acquisition and hands its
//! [`LostSignal`] to the guard. The first [`notify`](LossNotifier::notify) wins; every
//! clone of the signal then answers [`is_lost`](LostSignal::is_lost) with `true` and
//! every waiting `.await` completes with the reason. Runtime-agnostic: plain `std`
//! wakers, no executor.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// Why a lock is no longer held.
///
/// The signal fires once per acquisition with the first reason that applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lock was released through the manager or the guard: the manager's
    /// `release(key)` or `release_all()` took it from a guard that was still in use
    /// (a shutdown), or the guard itself released it.
    Released,
    /// The session that held the lock ended: its backend was terminated
    /// (`pg_terminate_backend`), the server restarted, crashed or failed over, an
    /// `idle_session_timeout` ended it, or the connection was reset. The server freed the
    /// lock; someone else may hold it now.
    ConnectionClosed,
    /// The server did not answer a keepalive in time (a hung or stopped server, a silent
    /// network cut). The manager closed the connection; the lock is freed on the server
    /// once it notices, so treat it as gone.
    KeepaliveFailed,
}

impl LostReason {
    /// A low-cardinality name, for metrics and span attributes.
    ///
    /// ```
    /// assert_eq!(locks_port::LostReason::KeepaliveFailed.as_str(), "keepalive_failed");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::ConnectionClosed => "connection_closed",
            Self::KeepaliveFailed => "keepalive_failed",
        }
    }

    const fn code(self) -> u8 {
        match self {
            Self::Released => 1,
            Self::ConnectionClosed => 2,
            Self::KeepaliveFailed => 3,
        }
    }

    const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Released),
            2 => Some(Self::ConnectionClosed),
            3 => Some(Self::KeepaliveFailed),
            _ => None,
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Released => "the lock was released",
            Self::ConnectionClosed => "the session holding the lock ended",
            Self::KeepaliveFailed => "the server did not answer a keepalive in time",
        })
    }
}

/// What a notifier and its signals share: 40 bytes with the `Arc`'s counts, one
/// allocation a held lock (the wakers get one of their own only when someone awaits the
/// signal; most guards are released without anyone awaiting it).
struct Shared {
    /// `0` while held, else [`LostReason::code`]: read without the mutex.
    reason: AtomicU8,
    /// Whether a waker was ever registered: when none was, `notify` need not take the
    /// mutex.
    waited: AtomicBool,
    /// `None` until a waker is registered.
    wakers: Mutex<Option<Box<Wakers>>>,
}

#[derive(Default)]
struct Wakers {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Shared {
    fn reason(&self) -> Option<LostReason> {
        LostReason::from_code(self.reason.load(Ordering::Acquire))
    }

    fn wakers(&self) -> MutexGuard<'_, Option<Box<Wakers>>> {
        self.wakers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The manager's side of one acquisition's [`LostSignal`].
///
/// ```
/// use locks_port::{LossNotifier, LostReason};
///
/// let notifier = LossNotifier::new();
/// let signal = notifier.signal();
/// assert!(!signal.is_lost());
/// assert!(notifier.notify(LostReason::ConnectionClosed));
/// assert!(!notifier.notify(LostReason::Released), "the first reason wins");
/// assert_eq!(signal.reason(), Some(LostReason::ConnectionClosed));
/// ```
#[derive(Clone)]
pub struct LossNotifier {
    shared: Arc<Shared>,
}

impl LossNotifier {
    /// A notifier whose lock is held.
    #[must_use]
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                reason: AtomicU8::new(0),
                waited: AtomicBool::new(false),
                wakers: Mutex::new(None),
            }),
        }
    }

    /// A notifier whose lock is held, for the next acquisition: this one made new
    /// again when nothing else shares it (no clone of it, no signal, no future
    /// awaiting one), so its allocation is reused; else a new one.
    ///
    /// ```
    /// use locks_port::{LossNotifier, LostReason};
    ///
    /// let notifier = LossNotifier::new();
    /// notifier.notify(LostReason::Released);
    /// let next = notifier.renewed();
    /// assert!(!next.is_lost());
    /// ```
    #[must_use]
    pub fn renewed(mut self) -> Self {
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            return Self::new();
        };
        *shared.reason.get_mut() = 0;
        *shared.waited.get_mut() = false;
        *shared
            .wakers
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self
    }

    /// The signal to hand to the guard (any number of clones).
    #[must_use]
    pub fn signal(&self) -> LostSignal {
        LostSignal {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Marks the lock lost and wakes every waiter. Returns `false` (and changes
    /// nothing) when it was already marked.
    pub fn notify(&self, reason: LostReason) -> bool {
        if self
            .shared
            .reason
            .compare_exchange(0, reason.code(), Ordering::SeqCst, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        // A waiter says it waits, then looks at the reason; this sets the reason, then
        // looks whether anyone waits: one of the two sees the other.
        if !self.shared.waited.load(Ordering::SeqCst) {
            return true;
        }
        let Some(wakers) = self.shared.wakers().take() else {
            return true;
        };
        for waker in wakers.slots.into_iter().flatten() {
            waker.wake();
        }
        true
    }

    /// Whether the lock has been marked lost.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.shared.reason().is_some()
    }
}

impl Default for LossNotifier {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LossNotifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossNotifier")
            .field("lost", &self.shared.reason())
            .finish()
    }
}

/// Tells whether, and why, a held lock was lost; `.await` it to wait for that.
///
/// Cheap to clone and to check. Awaiting it completes with the [`LostReason`] once the
/// lock is no longer held, and never while it is; it is meant for a `select!` beside
/// the work the lock protects (or see
/// [`DistributedLock::with_lock_until_lost`](crate::DistributedLock::with_lock_until_lost)).
///
/// ```
/// use locks_port::{LossNotifier, LostReason};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let notifier = LossNotifier::new();
/// let lost = notifier.signal();
/// let watcher = lost.clone();
/// notifier.notify(LostReason::KeepaliveFailed);
/// assert_eq!(watcher.await, LostReason::KeepaliveFailed);
/// assert!(lost.is_lost());
/// # });
/// ```
#[derive(Clone)]
pub struct LostSignal {
    shared: Arc<Shared>,
}

impl LostSignal {
    /// Whether the lock is no longer held (a relaxed read of one byte).
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.shared.reason().is_some()
    }

    /// Why the lock is no longer held, `None` while it is.
    #[must_use]
    pub fn reason(&self) -> Option<LostReason> {
        self.shared.reason()
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("lost", &self.shared.reason())
            .finish()
    }
}

impl IntoFuture for LostSignal {
    type Output = LostReason;
    type IntoFuture = Lost;

    fn into_future(self) -> Lost {
        Lost {
            shared: self.shared,
            slot: None,
        }
    }
}

/// The future of [`LostSignal`]'s `.await`: completes with the reason once the lock is
/// lost. Dropping it unregisters its waker.
#[must_use = "futures do nothing unless awaited"]
pub struct Lost {
    shared: Arc<Shared>,
    slot: Option<usize>,
}

impl Future for Lost {
    type Output = LostReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LostReason> {
        if let Some(reason) = self.shared.reason() {
            return Poll::Ready(reason);
        }
        let shared = Arc::clone(&self.shared);
        shared.waited.store(true, Ordering::SeqCst);
        let mut wakers = shared.wakers();
        // Checked again after saying it waits, under the mutex: `notify` sets the
        // reason before it looks for waiters and takes the wakers, so a waker
        // registered now is either woken or sees the reason.
        if let Some(reason) = LostReason::from_code(shared.reason.load(Ordering::SeqCst)) {
            return Poll::Ready(reason);
        }
        let waker = cx.waker().clone();
        let wakers = wakers.get_or_insert_with(Box::default);
        match self.slot {
            Some(slot) if slot < wakers.slots.len() => wakers.slots[slot] = Some(waker),
            _ => {
                let slot = match wakers.free.pop() {
                    Some(slot) => {
                        wakers.slots[slot] = Some(waker);
                        slot
                    }
                    None => {
                        wakers.slots.push(Some(waker));
                        wakers.slots.len() - 1
                    }
                };
                self.slot = Some(slot);
            }
        }
        Poll::Pending
    }
}

impl Drop for Lost {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let mut wakers = self.shared.wakers();
        let Some(wakers) = wakers.as_mut() else {
            return;
        };
        if let Some(entry) = wakers.slots.get_mut(slot) {
            *entry = None;
            wakers.free.push(slot);
        }
    }
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost")
            .field("lost", &self.shared.reason())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewed_notifier_is_held_again_and_reused_only_when_unshared() {
        let notifier = LossNotifier::new();
        let signal = notifier.signal();
        notifier.notify(LostReason::ConnectionClosed);
        let at = Arc::as_ptr(&notifier.shared);
        // A signal still out there keeps its reason: a new notifier, not this one.
        let shared = notifier.renewed();
        assert_ne!(Arc::as_ptr(&shared.shared), at);
        assert_eq!(signal.reason(), Some(LostReason::ConnectionClosed));

        let notifier = LossNotifier::new();
        let waiter = notifier.signal();
        let mut waiting = Box::pin(waiter.clone().into_future());
        let waker = std::task::Waker::noop();
        assert!(
            waiting
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending()
        );
        notifier.notify(LostReason::Released);
        drop((waiting, waiter));
        let at = Arc::as_ptr(&notifier.shared);
        let next = notifier.renewed();
        assert_eq!(Arc::as_ptr(&next.shared), at, "unshared: reused");
        assert!(!next.is_lost());
        assert!(!next.shared.waited.load(Ordering::SeqCst));
        let signal = next.signal();
        assert!(next.notify(LostReason::KeepaliveFailed));
        assert_eq!(signal.reason(), Some(LostReason::KeepaliveFailed));
    }

    #[test]
    fn a_held_lock_costs_its_signal_at_most_40_bytes() {
        // The `Arc`'s two counts and what a notifier shares with its signals: one
        // allocation a held lock, 10⁶ of them in a manager that holds a million.
        assert!(2 * size_of::<usize>() + size_of::<Shared>() <= 40);
    }

    #[test]
    fn waiters_are_woken_and_dropped_waiters_unregister() {
        let notifier = LossNotifier::new();
        let signal = notifier.signal();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            // A waiter that is polled and dropped, many times, leaves no waker behind.
            for _ in 0..100 {
                let mut lost = std::pin::pin!(signal.clone().into_future());
                let pending = std::future::poll_fn(|cx| Poll::Ready(lost.as_mut().poll(cx))).await;
                assert!(pending.is_pending());
            }
            assert_eq!(
                notifier.shared.wakers().as_ref().map(|w| w.slots.len()),
                Some(1)
            );
            let waiter = signal.clone();
            let task = async move { waiter.await };
            let notify = async {
                notifier.notify(LostReason::ConnectionClosed);
            };
            let (reason, ()) = tokio::join!(task, notify);
            assert_eq!(reason, LostReason::ConnectionClosed);
        });
        assert_eq!(signal.reason(), Some(LostReason::ConnectionClosed));
    }
}
