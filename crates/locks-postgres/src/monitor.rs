//! The lost-lock monitor: one background task per manager, alive while it holds locks
//! (with a lease on stopped holders, for the manager's life: it also closes the pool's
//! idle connections before the server's `idle_session_timeout` would end them).
//!
//! When a connection of a pool built on [`LockConnect`](crate::LockConnect) ends (as
//! every pool of [`plain_pool`](crate::plain_pool) and [`tls_pool`](crate::tls_pool)),
//! and otherwise every
//! [`health_check_interval`](crate::PostgresLockManagerBuilder::health_check_interval),
//! it looks, locally and without I/O, at each held lock's connection: one that has
//! ended (the server terminated the backend, restarted, failed over, or the socket
//! was reset) loses its lock with [`LostReason::ConnectionClosed`]. Every
//! [`keepalive`](crate::PostgresLockManagerBuilder::keepalive) cadence it sends an idle
//! held connection one `SELECT true`; no answer within the answer timeout (a hung or
//! stopped server, a silent network cut) loses the lock with
//! [`LostReason::KeepaliveFailed`], and the connection is closed; with stall patience,
//! not while the server shows the session's backend alive (the ping, `stall.rs`).
//!
//! A lost lock leaves the bookkeeping at once (`is_held` is false, `held_lock_count`
//! drops), its guard's signal fires, its connection is discarded, a WARNING event in
//! an `eventsource.lock.lost` span says so, and the per-reason count grows.

//!
//! Its state is kept in the manager (`health.rs`); the book gives back what a grant
//! displaced, and the grant tells the monitor here.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use foldhash::fast::RandomState;

use locks_port::{AcquisitionErrorKind, LostReason, ReleaseOutcome};
use tokio::time::Instant;

use crate::bookkeeping::{Held, Ticket};
use crate::connection::Session;
use crate::errors::{MOVED_BETWEEN_SESSIONS, describe, driver_kind};
use crate::health::{LostLockCounts, Watched};
use crate::inner::Inner;
use crate::pool::connect::connection_ended;
use crate::slot::SessionSlot;
use crate::sql::Answer;
use crate::stall::ping;
use crate::telemetry::lost_span;
use crate::watchdog::Watch;

/// [`PostgresLockManager::lost_lock_counts`](crate::PostgresLockManager::lost_lock_counts).
pub(crate) fn lost_lock_counts(inner: &Inner) -> LostLockCounts {
    inner.health().lost.snapshot()
}

/// What one look at a watched connection's slot found.
enum Look {
    /// Released or pinged right now.
    Busy,
    /// Released (or lost) already.
    Gone,
    Ended,
    Open,
}

/// What one look at the bookkeeping and the watched connections found.
#[derive(Default)]
struct Findings {
    ended: Vec<Ticket>,
    /// Per connection due a keepalive, the locks it holds (several when they share it).
    due: Vec<(SessionSlot, Vec<Ticket>)>,
    /// Watched connections (permits) that ended, and those due a keepalive.
    ended_watched: Vec<Arc<Watched>>,
    due_watched: Vec<Arc<Watched>>,
}

/// What one round's look at a held lock's connection found.
#[derive(Clone, Copy)]
enum Verdict {
    /// Released or pinged right now.
    Busy,
    /// Ended, or its session taken out.
    Ended,
    Open,
    /// Open and due a keepalive: its place in [`Findings::due`].
    Due(usize),
}

/// Looks at the connection in `slot`; one due a keepalive at `cadence` joins `due`.
fn look(
    slot: &SessionSlot,
    now: Instant,
    cadence: Option<std::time::Duration>,
    due: &mut Vec<(SessionSlot, Vec<Ticket>)>,
) -> Verdict {
    let Ok(session) = slot.try_lock() else {
        return Verdict::Busy;
    };
    match session.as_ref() {
        Some(session) if session.is_closed() => Verdict::Ended,
        None => Verdict::Ended,
        Some(_) if cadence.is_some_and(|cadence| slot.keepalive_due(now, cadence)) => {
            due.push((Arc::clone(slot), Vec::new()));
            Verdict::Due(due.len() - 1)
        }
        Some(_) => Verdict::Open,
    }
}

impl Inner {
    /// Starts the monitor if it is not running (called after each grant). Without a
    /// Tokio runtime at hand nothing is started; the next grant inside one starts it.
    pub(crate) fn ensure_monitor(self: &Arc<Self>) {
        // Read first: it runs already on every grant but the first, and a read is
        // cheaper than a swap.
        let running = &self.health().monitor_running;
        if running.load(Ordering::Acquire) || running.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(monitor(Arc::downgrade(self)));
            }
            Err(_) => self
                .health()
                .monitor_running
                .store(false, Ordering::Release),
        }
    }

    /// Watches `watched` (a permit's connection) until it is released or lost.
    pub(crate) fn watch(self: &Arc<Self>, watched: &Arc<Watched>) {
        let mut list = self.health().watched();
        list.retain(|weak| weak.strong_count() > 0);
        list.push(Arc::downgrade(watched));
        drop(list);
        self.ensure_monitor();
    }

    /// Looks at every watched connection (permits); forgets those released or dropped.
    fn inspect_watched(&self, now: Instant, findings: &mut Findings) {
        let cadence = self.settings().keepalive;
        self.health().watched().retain(|weak| {
            let Some(watched) = weak.upgrade() else {
                return false;
            };
            // A session being released or pinged is looked at next round.
            let look = match watched.slot().try_lock() {
                Err(_) => Look::Busy,
                Ok(session) => match session.as_ref() {
                    None => Look::Gone,
                    Some(session) if session.is_closed() => Look::Ended,
                    Some(_) => Look::Open,
                },
            };
            match look {
                Look::Busy => true,
                Look::Gone => false,
                Look::Ended => {
                    findings.ended_watched.push(watched);
                    true
                }
                Look::Open => {
                    if cadence.is_some_and(|cadence| watched.keepalive_due(now, cadence)) {
                        findings.due_watched.push(watched);
                    }
                    true
                }
            }
        });
    }

    /// A watched connection is lost: its session comes out of the slot and is
    /// discarded, and, unless a release took it first, the loss is counted and its owner
    /// told.
    async fn lose_watched(&self, watched: &Watched, reason: LostReason) {
        let taken = watched.slot().lock().await.take();
        if taken.is_none() {
            return;
        }
        drop(taken);
        watched.holder.gone(self.metrics());
        self.watched_lost(watched, reason);
        watched.notifier().notify(reason);
    }

    /// One keepalive on a watched connection.
    async fn keepalive_watched(&self, watched: &Watched) {
        let outcome = {
            let mut session = watched.slot().lock().await;
            let Some(session) = session.as_mut() else {
                return; // released meanwhile
            };
            match ping(self, session).await {
                Ok(Ok(Answer::Bool(true))) => None,
                Ok(Err(error)) if error.is_closed() || error.code().is_some() => {
                    Some(LostReason::ConnectionClosed)
                }
                _ if session.is_closed() => Some(LostReason::ConnectionClosed),
                Err(silence) => Some(silence.reason),
                _ => Some(LostReason::KeepaliveFailed),
            }
        };
        match outcome {
            None => watched.answered(Instant::now()),
            Some(reason) => self.lose_watched(watched, reason).await,
        }
    }

    /// Looks at every connection that holds locks: which ended, which are due a
    /// keepalive. A connection of a lock's own (or a group's) is looked at through its
    /// entries, once a round (a group's share one: the verdict is kept by the slot's
    /// address). A shared connection (multiplexing) is looked at once, from the book's
    /// list of them, without walking the thousands of locks it may hold: its locks are
    /// walked only when it ended (here) or failed its keepalive (then), so a round at
    /// rest costs a look a connection, not a lookup a held lock (ADR 0029).
    fn inspect(&self, now: Instant) -> Findings {
        let mut findings = Findings::default();
        self.inspect_watched(now, &mut findings);
        let cadence = self.settings().keepalive;
        let mut verdicts: HashMap<usize, Verdict, RandomState> = HashMap::default();
        let book = self.book();
        for held in book.own_entries() {
            let slot = held.slot();
            let verdict = *verdicts
                .entry(Arc::as_ptr(slot).addr())
                .or_insert_with(|| look(slot, now, cadence, &mut findings.due));
            match verdict {
                // A session being released or pinged is skipped this round.
                Verdict::Busy | Verdict::Open => {}
                // Ended, or closed under a group member (a failed unlock of another
                // lock of its group): this lock went with it.
                Verdict::Ended => findings.ended.push(held.ticket()),
                Verdict::Due(at) => findings.due[at].1.push(held.ticket()),
            }
        }
        // A shared connection due a keepalive is pinged with no list of its locks: a
        // failed ping finds them in the book then (`keepalive`).
        let mut ended_shared: Vec<usize> = Vec::new();
        for slot in book.shared_slots() {
            if let Verdict::Ended = look(slot, now, cadence, &mut findings.due) {
                ended_shared.push(Arc::as_ptr(slot).addr());
            }
        }
        if !ended_shared.is_empty() {
            findings.ended.extend(
                book.shared_entries()
                    .filter(|held| ended_shared.contains(&Arc::as_ptr(held.slot()).addr()))
                    .map(Held::ticket),
            );
        }
        findings
    }

    /// Takes one lost acquisition (with the rest of its group, for `acquire_many`) out
    /// of the bookkeeping, then tells its guard.
    fn lose_entry(&self, ticket: &Ticket, reason: LostReason, detail: &str) {
        let taken = {
            let mut book = self.book();
            let taken = book.remove_with_group(ticket);
            // The session goes before the entry is seen gone: whoever finds the key no
            // longer held also finds its pool slot free.
            taken.iter().for_each(discard);
            taken
        };
        self.report_lost(&taken, reason, detail);
    }

    fn lose_entries(&self, entries: &[Ticket], reason: LostReason, detail: &str) {
        for ticket in entries {
            self.lose_entry(ticket, reason, detail);
        }
    }

    /// A strategy closed the session in `slot` because it could not know what the
    /// session held (a downgrade that failed or was dropped part-way): every lock on it
    /// (a shared connection's neighbours too) is lost now, each guard told, rather than
    /// at the monitor's next look (a connection this crate closes wakes no monitor).
    pub(crate) fn lose_closed_session(&self, slot: &SessionSlot, detail: &str) {
        let tickets = self.tickets_on(slot);
        self.lose_entries(&tickets, LostReason::ConnectionClosed, detail);
    }

    /// The acquisitions whose locks the session in `slot` holds now.
    fn tickets_on(&self, slot: &SessionSlot) -> Vec<Ticket> {
        self.book()
            .entries()
            .filter(|held| Arc::ptr_eq(held.slot(), slot))
            .map(Held::ticket)
            .collect()
    }

    /// A lost lock already out of the bookkeeping: discard its session, tell its
    /// guard, say so in an event and count it.
    fn lose(&self, held: Held, reason: LostReason, detail: &str) {
        discard(&held);
        self.report_lost(std::slice::from_ref(&held), reason, detail);
    }

    /// An entry the bookkeeping let go because a second session of this manager was
    /// granted the same exclusive lock: the sessions are not real (a
    /// transaction-pooling proxy), so the older holder cannot trust its lock. It is
    /// lost, and its session closed rather than orphaned.
    pub(crate) fn lose_displaced(&self, previous: Held, span: &tracing::Span) {
        tracing::error!(
            parent: span,
            key = self.shown(previous.key()),
            lock_id = previous.lock_id(),
            "two sessions were granted one exclusive advisory lock: session locks \
             need a direct connection or session pooling, not a transaction-pooling \
             proxy (closing the older session)"
        );
        self.lose(
            previous,
            LostReason::ConnectionClosed,
            "a second grant displaced it",
        );
    }

    /// A release whose unlock failed with `error`: when the error says the session had
    /// ended (the unlock found no connection), the lock was lost while held, before the
    /// monitor saw it. The release tells its guard; this counts it as lost.
    pub(crate) fn judge_failed_release(&self, held: &Held, error: &tokio_postgres::Error) {
        if driver_kind(error) == AcquisitionErrorKind::ConnectionLost {
            let reason = LostReason::ConnectionClosed;
            self.health().lost.add(reason, 1);
            self.metrics().lost(held.mode(), held.lock_id(), reason);
        }
    }

    /// The end of a watched holder's release (a permit's), `session` taken out of
    /// `watched`'s slot: back to the pool when the strategy's release was confirmed
    /// (`left`), closed otherwise (which frees what it held). A session that had ended
    /// under the holder before the monitor saw it was lost while held, and the loss
    /// counts say so (as a lock's, see
    /// [`judge_failed_release`](Self::judge_failed_release)). The owner's signal then says
    /// it is released.
    pub(crate) fn watched_released(
        &self,
        watched: &Watched,
        session: Session,
        left: bool,
    ) -> ReleaseOutcome {
        let outcome = if left {
            session.into_pool();
            ReleaseOutcome::Unlocked
        } else {
            if session.is_closed() {
                self.watched_lost(watched, LostReason::ConnectionClosed);
            }
            session.close();
            ReleaseOutcome::SessionClosed
        };
        watched.notifier().notify(LostReason::Released);
        outcome
    }

    /// A watched holder (a permit) lost while held: counted with the locks, and told to
    /// its strategy (its own instrument and event).
    fn watched_lost(&self, watched: &Watched, reason: LostReason) {
        self.health().lost.add(reason, 1);
        watched
            .holder
            .lost(self.metrics(), self.key_visibility(), reason);
    }

    /// Counts and reports locks already out of the bookkeeping that share one lost
    /// signal (one lock, or a group), and fires it.
    fn report_lost(&self, taken: &[Held], reason: LostReason, detail: &str) {
        let Some(first) = taken.first() else {
            return;
        };
        // Counted (one per lock) before the signal fires, so a holder woken by it
        // already sees the count; taken back if another reason (a release) got there
        // first.
        let counter = self.health().lost.counter(reason);
        let count = u64::try_from(taken.len()).unwrap_or(u64::MAX);
        counter.fetch_add(count, Ordering::AcqRel);
        if !first.notifier().notify(reason) {
            counter.fetch_sub(count, Ordering::AcqRel);
            return;
        }
        for held in taken {
            self.metrics().lost(held.mode(), held.lock_id(), reason);
            let key = self.shown(held.key());
            let span = lost_span(key, held.lock_id(), held.mode(), reason);
            tracing::warn!(
                parent: &span,
                key,
                lock_id = held.lock_id(),
                reason = reason.as_str(),
                detail,
                "advisory lock lost: {reason}"
            );
        }
    }

    /// One keepalive on a held, idle connection, for the locks `entries` on it (none
    /// listed for a shared connection: those on it when the ping fails are lost).
    async fn keepalive(&self, entries: Vec<Ticket>, slot: SessionSlot) {
        let (outcome, sent) = {
            let mut session = slot.lock().await;
            let Some(session) = session.as_mut() else {
                return; // released meanwhile
            };
            let sent = Instant::now();
            (ping(self, session).await, sent)
        };
        if let Ok(Ok(Answer::Bool(true))) = outcome {
            self.metrics().keepalive_answered(sent.elapsed());
            slot.answered(Instant::now());
            return;
        }
        let entries = if entries.is_empty() {
            self.tickets_on(&slot)
        } else {
            entries
        };
        match outcome {
            Ok(Ok(Answer::Bool(true))) => {}
            Ok(Ok(Answer::WrongSession)) => self.lose_entries(
                &entries,
                LostReason::KeepaliveFailed,
                MOVED_BETWEEN_SESSIONS,
            ),
            Ok(Ok(_)) => {
                self.lose_entries(&entries, LostReason::KeepaliveFailed, "unexpected answer")
            }
            Ok(Err(error)) => {
                let reason = if error.is_closed() || error.code().is_some() {
                    LostReason::ConnectionClosed
                } else {
                    LostReason::KeepaliveFailed
                };
                self.lose_entries(&entries, reason, &describe(&error));
            }
            Err(silence) => self.lose_entries(&entries, silence.reason, &silence.detail),
        }
    }
}

impl Inner {
    /// Whether nothing is held: no lock in the bookkeeping, no watched connection.
    fn is_idle(&self) -> bool {
        self.book().is_empty() && self.health().watched().is_empty()
    }
}

/// Drops a lost lock's session: detached from the pool and closed, never reused. The
/// slot may be busy (a keepalive that is timing out); then the keepalive's own end
/// drops it.
fn discard(held: &Held) {
    if let Ok(mut session) = held.slot().try_lock() {
        drop(session.take());
    } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let slot = Arc::clone(held.slot());
        runtime.spawn(async move {
            drop(slot.lock().await.take());
        });
    }
}

/// The monitor task: runs while the manager is alive and holds locks. It sleeps on a
/// watch of the watchdog (see [`crate::watchdog`]), not on a runtime timer: a timer in
/// the runtime's wheel would make every park of the runtime a timed one while locks are
/// held.
async fn monitor(manager: Weak<Inner>) {
    let watch = Watch::new();
    let mut ended = connection_ended();
    // With a lease on stopped holders, when idle pooled connections are next looked at.
    let mut next_close = Instant::now();
    loop {
        let interval = match manager.upgrade() {
            Some(inner) => inner.settings().health_check_interval,
            None => return,
        };
        let sleep = async {
            match &watch {
                Some(watch) => watch.sleep(interval).await,
                None => tokio::time::sleep(interval).await,
            }
        };
        // A connection of this crate's pools that ends says so at once: look now.
        tokio::select! {
            () = sleep => {}
            _ = ended.changed() => {}
        }
        let Some(inner) = manager.upgrade() else {
            return;
        };
        let findings = inner.inspect(Instant::now());
        for ticket in &findings.ended {
            inner.lose_entry(ticket, LostReason::ConnectionClosed, "the connection ended");
        }
        for (slot, entries) in findings.due {
            let inner = Arc::clone(&inner);
            tokio::spawn(async move { inner.keepalive(entries, slot).await });
        }
        for watched in findings.ended_watched {
            let inner = Arc::clone(&inner);
            tokio::spawn(async move {
                inner
                    .lose_watched(&watched, LostReason::ConnectionClosed)
                    .await;
            });
        }
        for watched in findings.due_watched {
            let inner = Arc::clone(&inner);
            tokio::spawn(async move { inner.keepalive_watched(&watched).await });
        }
        // The server ends a session idle for the lease's `idle_session_timeout`: close
        // the pool's idle ones first, so that a checkout never takes one it is ending
        // (every quarter of the bound, those not checked out for half of it).
        if let Some(bound) = inner.idle_session_limit() {
            let now = Instant::now();
            if now >= next_close {
                crate::pool::close_idle(inner.pool(), bound / 2);
                next_close = now + bound / 4;
            }
        } else if inner.is_idle() {
            inner
                .health()
                .monitor_running
                .store(false, Ordering::Release);
            // A grant between the look and the store found the flag set and started
            // nothing: take the monitor back up for it.
            if inner.is_idle() || inner.health().monitor_running.swap(true, Ordering::AcqRel) {
                return;
            }
        }
        drop(inner);
    }
}
