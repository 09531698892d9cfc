//! What a manager holds: one entry per held key, with the session that holds it and
//! the notifier of its guard's lost signal; registering a grant, taking entries out,
//! and the unlock.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use locks_port::{
    AcquisitionErrorKind, LockAcquisitionError, LockInfo, LockMode, LossNotifier, LostReason,
    ReleaseOutcome,
};
use smallvec::SmallVec;
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::classify::{driver_kind, sqlstate};
use crate::connection::{Answer, Session};
use crate::guard::PostgresLockGuard;
use crate::limit::Limit;
use crate::manager::Inner;
use crate::metrics::Metrics;
use crate::multiplex::Membership;
use crate::sql::Statement;
use crate::telemetry::{record_failure, record_released, release_span};

/// The session of a held lock. Shared between the bookkeeping entry and the health
/// monitor's keepalive; whoever takes it out owns the connection. `None` once taken.
pub(crate) type SessionSlot = Arc<AsyncMutex<Option<Session>>>;

/// The bookkeeping entry of one held lock.
pub(crate) struct Held {
    /// The key, shared with the guard's [`LockInfo`]: booking a grant copies none.
    pub(crate) key: Arc<str>,
    pub(crate) token: u64,
    pub(crate) lock_id: i64,
    pub(crate) mode: LockMode,
    pub(crate) slot: SessionSlot,
    pub(crate) notifier: LossNotifier,
    /// When the connection last answered (the last keepalive), or, until the first,
    /// when the monitor first saw the lock: `None` until then (a grant reads no clock;
    /// the first keepalive comes at most one health-check interval later for it).
    pub(crate) last_answer: Option<Instant>,
    /// Whether a keepalive is in flight on the connection.
    pub(crate) pinging: bool,
    /// For locks taken together by `acquire_many` on one session: the group.
    pub(crate) group: Option<Arc<Group>>,
    /// For a lock on a shared connection (multiplexing): its place there.
    pub(crate) host: Option<Membership>,
}

impl Held {
    /// Which acquisition this is, to find its entry again.
    pub(crate) fn ticket(&self) -> Ticket {
        Ticket {
            lock_id: self.lock_id,
            token: self.token,
        }
    }
}

/// The locks of one `acquire_many`, held on one session under one ticket number and
/// one lost signal.
pub(crate) struct Group {
    /// How many of the group are still held: the session goes back to the pool with
    /// the last unlock.
    pub(crate) left: AtomicUsize,
    /// The lock ids of the group: a lost session takes every one of them out of the
    /// bookkeeping before the group's signal fires.
    pub(crate) lock_ids: Box<[i64]>,
}

/// One acquisition, as the health monitor finds it again.
#[derive(Clone, Debug)]
pub(crate) struct Ticket {
    pub(crate) lock_id: i64,
    pub(crate) token: u64,
}

/// The entries of one lock id: almost always one, kept inline (no allocation per
/// grant).
pub(crate) type Entries = SmallVec<[Held; 1]>;

/// Every lock one manager holds, by lock id: what the server locks, and a number to
/// hash, where a key is a string (the lock id of a key is known on every path that
/// looks it up). An id has one entry, or several when the manager holds it shared more
/// than once (one per guard), or, by a 64-bit collision, holds another key of the same
/// id (the server sees one lock). Every change of the count is told to the locks-held
/// instrument.
pub(crate) struct Book {
    by_id: HashMap<i64, Entries, foldhash::fast::RandomState>,
    count: usize,
    metrics: Arc<Metrics>,
}

impl Book {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            by_id: HashMap::default(),
            count: 0,
            metrics,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether `key` (whose lock id is `lock_id`) is held.
    pub(crate) fn contains(&self, key: &str, lock_id: i64) -> bool {
        self.by_id
            .get(&lock_id)
            .is_some_and(|entries| entries.iter().any(|held| *held.key == *key))
    }

    /// Adds an entry; gives back the entries it displaces: a second exclusive grant of
    /// one lock id (only a transaction-pooling proxy can make that happen).
    pub(crate) fn insert(&mut self, entry: Held) -> Entries {
        let entries = self.by_id.entry(entry.lock_id).or_default();
        let conflict = entry.mode == LockMode::Exclusive
            || entries.iter().any(|held| held.mode == LockMode::Exclusive);
        let displaced = if conflict {
            std::mem::take(entries)
        } else {
            Entries::new()
        };
        self.metrics.held_changed(entry.mode, 1);
        entries.push(entry);
        self.count = self.count + 1 - displaced.len();
        displaced
            .iter()
            .for_each(|held| self.metrics.held_changed(held.mode, -1));
        displaced
    }

    /// Takes out the entry of the acquisition `token` of `lock_id`. The id is looked
    /// up once: its entries come out whole, and the rest (other shared holds, rare) go
    /// back.
    pub(crate) fn remove_one(&mut self, lock_id: i64, token: u64) -> Option<Held> {
        let mut entries = self.by_id.remove(&lock_id)?;
        let taken = entries
            .iter()
            .position(|held| held.token == token)
            .map(|index| entries.swap_remove(index));
        if !entries.is_empty() {
            self.by_id.insert(lock_id, entries);
        }
        self.count -= usize::from(taken.is_some());
        if let Some(held) = &taken {
            self.metrics.held_changed(held.mode, -1);
        }
        taken
    }

    /// Takes out the entry of the acquisition `token` of `lock_id` and, when it
    /// belongs to a group, the rest of its group: a lost session loses them all at once.
    pub(crate) fn remove_with_group(&mut self, lock_id: i64, token: u64) -> Vec<Held> {
        let Some(first) = self.remove_one(lock_id, token) else {
            return Vec::new();
        };
        let group = first.group.clone();
        let mut taken = vec![first];
        if let Some(group) = group {
            for &other in group.lock_ids.iter().filter(|&&other| other != lock_id) {
                taken.extend(self.remove_one(other, token));
            }
        }
        taken
    }

    /// Takes out every entry of `key` (whose lock id is `lock_id`).
    pub(crate) fn remove_all(&mut self, key: &str, lock_id: i64) -> Entries {
        let Some(entries) = self.by_id.remove(&lock_id) else {
            return Entries::new();
        };
        let (taken, rest): (Entries, Entries) =
            entries.into_iter().partition(|held| *held.key == *key);
        if !rest.is_empty() {
            self.by_id.insert(lock_id, rest);
        }
        self.count -= taken.len();
        taken
            .iter()
            .for_each(|held| self.metrics.held_changed(held.mode, -1));
        taken
    }

    fn drain(&mut self) -> Vec<Held> {
        self.count = 0;
        let drained: Vec<Held> = self
            .by_id
            .drain()
            .flat_map(|(_, entries)| entries)
            .collect();
        drained
            .iter()
            .for_each(|held| self.metrics.held_changed(held.mode, -1));
        drained
    }

    /// Every entry, for the health monitor.
    pub(crate) fn entries_mut(&mut self) -> impl Iterator<Item = &mut Held> {
        self.by_id.values_mut().flatten()
    }

    /// The entry of one acquisition.
    pub(crate) fn get_mut(&mut self, lock_id: i64, token: u64) -> Option<&mut Held> {
        self.by_id
            .get_mut(&lock_id)?
            .iter_mut()
            .find(|held| held.token == token)
    }
}

impl Inner {
    /// Takes the entry of the acquisition `token` of `lock_id` out of the bookkeeping;
    /// its guard's signal fires ([`LostReason::Released`]).
    pub(crate) fn take_one(&self, lock_id: i64, token: u64) -> Option<Held> {
        let taken = self.held().remove_one(lock_id, token)?;
        taken.notifier.notify(LostReason::Released);
        Some(taken)
    }

    /// Takes every entry of `key` out of the bookkeeping; their guards' signals fire.
    pub(crate) fn take_all_of(&self, key: &str, lock_id: i64) -> Entries {
        let taken = self.held().remove_all(key, lock_id);
        for held in &taken {
            held.notifier.notify(LostReason::Released);
        }
        taken
    }

    /// Takes every entry out (a shutdown): every guard's signal fires.
    pub(crate) fn take_all(&self) -> Vec<Held> {
        let drained = self.held().drain();
        for held in &drained {
            held.notifier.notify(LostReason::Released);
        }
        drained
    }

    /// Records a granted lock and hands out its guard; with fencing on, first takes
    /// the grant's token (on failure the session is closed, which frees the lock).
    pub(crate) async fn register(
        self: &Arc<Self>,
        key: Arc<str>,
        lock_id: i64,
        mode: LockMode,
        session: Session,
        span: &Span,
    ) -> Result<PostgresLockGuard, LockAcquisitionError> {
        let slot = Arc::new(AsyncMutex::new(Some(session)));
        self.register_in(key, lock_id, mode, slot, None, span).await
    }

    /// [`register`](Self::register) for a session in a slot: its own, or a shared
    /// connection's (`host`).
    pub(crate) async fn register_in(
        self: &Arc<Self>,
        shared_key: Arc<str>,
        lock_id: i64,
        mode: LockMode,
        slot: SessionSlot,
        host: Option<Membership>,
        span: &Span,
    ) -> Result<PostgresLockGuard, LockAcquisitionError> {
        let key: &str = &shared_key;
        let mut info =
            LockInfo::acquired_now(Arc::clone(&shared_key), lock_id, self.holder_id.clone())
                .with_mode(mode);
        if self.settings.fencing {
            let mut session = slot.lock().await;
            let Some(session) = session.as_mut() else {
                return Err(LockAcquisitionError::new(
                    key,
                    AcquisitionErrorKind::ConnectionLost,
                    "Database error: the connection ended before the fencing token",
                ));
            };
            let token = Box::pin(
                self.next_fencing_token(key, lock_id, session)
                    .instrument(span.clone()),
            )
            .await?;
            info = info.with_fencing_token(token);
        }
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let notifier = LossNotifier::new();
        let lost = notifier.signal();
        let entry = Held {
            key: Arc::clone(&shared_key),
            token,
            lock_id,
            mode,
            slot,
            notifier,
            last_answer: None,
            pinging: false,
            group: None,
            host,
        };
        let displaced = self.held().insert(entry);
        for previous in displaced {
            // Two sessions of one manager were both granted one exclusive advisory
            // lock: the sessions are not real (a transaction-pooling proxy). Do not
            // orphan the older one.
            tracing::error!(
                parent: span,
                key = self.shown(key),
                lock_id,
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
        self.ensure_monitor();
        tracing::debug!(
            parent: span,
            key = self.shown(key),
            lock_id,
            mode = mode.as_str(),
            holder_id = self.holder_id.as_deref(),
            "lock acquired"
        );
        Ok(PostgresLockGuard::new(Arc::clone(self), info, token, lost))
    }

    /// Unlocks a lock taken out of the bookkeeping. Never fails: when the unlock fails
    /// or the session did not hold the lock, the session is closed instead of being
    /// given back, which frees whatever it held.
    pub(crate) async fn unlock(&self, mut held: Held) -> ReleaseOutcome {
        let key = Arc::clone(&held.key);
        let key: &str = &key;
        let span = release_span(
            self.settings.span_level,
            self.shown(key),
            held.lock_id,
            held.mode,
        );
        // The span's own handle, to record the outcome on (cheaper than looking up the
        // current span).
        let recorder = span.clone();
        let lock_id = held.lock_id;
        let statement = Statement::Unlock {
            lock_id,
            mode: held.mode,
        };
        let unlocking = std::pin::pin!(async {
            let current = &recorder;
            // Waits for a keepalive in flight (bounded by the answer timeout).
            let mut slot = held.slot.lock().await;
            let Some(session) = slot.as_mut() else {
                // The health monitor took it: the lock was lost meanwhile.
                record_released(current, false);
                return ReleaseOutcome::AlreadyReleased;
            };
            // Pinned where made (the statement's future is large), and gone after.
            let answer = {
                let running = std::pin::pin!(
                    session.run_within(statement, Limit::For(self.settings.answer_timeout))
                );
                running.await
            };
            // The session of a group, or a shared connection's, holds the others' locks
            // until the last unlock.
            let last = match (held.host.as_mut(), held.group.as_ref()) {
                (Some(member), _) => member.leave(),
                (None, group) => {
                    group.is_none_or(|group| group.left.fetch_sub(1, Ordering::AcqRel) == 1)
                }
            };
            if !last && matches!(answer, Ok(Ok(Answer::Bool(true)))) {
                // The session still holds the rest of its group: it stays in the slot.
                record_released(current, true);
                tracing::debug!(key = self.shown(key), lock_id, "lock released");
                return ReleaseOutcome::Unlocked;
            }
            let Some(session) = slot.take() else {
                return ReleaseOutcome::AlreadyReleased;
            };
            drop(slot);
            // Every path but a confirmed unlock closes the session, which frees
            // whatever it held; each says why first.
            let (kind, code) = match &answer {
                Ok(Ok(Answer::Bool(true))) => {
                    session.into_pool();
                    record_released(current, true);
                    tracing::debug!(key = self.shown(key), lock_id, "lock released");
                    return ReleaseOutcome::Unlocked;
                }
                Ok(Ok(Answer::WrongSession)) => {
                    tracing::error!(
                        key = self.shown(key),
                        lock_id,
                        reason = crate::acquire::MOVED_BETWEEN_SESSIONS,
                        "Error releasing advisory lock: the unlock reached another server \
                         session and did nothing; closed the connection, but the server \
                         session that took the lock may still hold it"
                    );
                    (AcquisitionErrorKind::Configuration, None)
                }
                Ok(Ok(_)) => {
                    tracing::warn!(
                        key = self.shown(key),
                        lock_id,
                        "Error releasing advisory lock: the session no longer held it; \
                         closed the session"
                    );
                    (AcquisitionErrorKind::Backend, None)
                }
                Ok(Err(error)) => {
                    tracing::warn!(
                        key = self.shown(key),
                        lock_id,
                        error = %crate::classify::describe(error),
                        sqlstate = sqlstate(error),
                        "Error releasing advisory lock; closed the session, which frees it"
                    );
                    (driver_kind(error), sqlstate(error))
                }
                Err(_elapsed) => {
                    tracing::warn!(
                        key = self.shown(key),
                        lock_id,
                        "Error releasing advisory lock: the server did not answer; closed \
                         the session, which frees it"
                    );
                    (AcquisitionErrorKind::ConnectionLost, None)
                }
            };
            session.close();
            record_released(current, false);
            record_failure(current, kind, code);
            ReleaseOutcome::SessionClosed
        });
        unlocking.instrument(span).await
    }
}
