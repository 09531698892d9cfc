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
use crate::multiplex::Membership;
use crate::sql::Statement;
use crate::telemetry::{record_failure, release_span};

/// The session of a held lock. Shared between the bookkeeping entry and the health
/// monitor's keepalive; whoever takes it out owns the connection. `None` once taken.
pub(crate) type SessionSlot = Arc<AsyncMutex<Option<Session>>>;

/// The bookkeeping entry of one held lock.
pub(crate) struct Held {
    pub(crate) token: u64,
    pub(crate) lock_id: i64,
    pub(crate) mode: LockMode,
    pub(crate) slot: SessionSlot,
    pub(crate) notifier: LossNotifier,
    /// When the connection last answered (the grant, or the last keepalive).
    pub(crate) last_answer: Instant,
    /// Whether a keepalive is in flight on the connection.
    pub(crate) pinging: bool,
    /// For locks taken together by `acquire_many` on one session: how many of the
    /// group are still held. The session goes back to the pool with the last unlock.
    pub(crate) group: Option<Arc<AtomicUsize>>,
    /// For a lock on a shared connection (multiplexing): its place there.
    pub(crate) host: Option<Membership>,
}

/// The entries of one key: almost always one, kept inline (no allocation per grant).
pub(crate) type Entries = SmallVec<[Held; 1]>;

/// Every lock one manager holds, by key. A key has one entry, or several when the
/// manager holds it shared more than once (one per guard).
#[derive(Default)]
pub(crate) struct Book {
    /// Hashed with foldhash: a key is hashed on every grant and release.
    by_key: HashMap<String, Entries, foldhash::fast::RandomState>,
    count: usize,
}

impl Book {
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// Adds an entry; gives back the entries it displaces: a second exclusive grant of
    /// one key (only a transaction-pooling proxy can make that happen).
    pub(crate) fn insert(&mut self, key: &str, entry: Held) -> Entries {
        let entries = self.by_key.entry(key.to_owned()).or_default();
        let conflict = entry.mode == LockMode::Exclusive
            || entries.iter().any(|held| held.mode == LockMode::Exclusive);
        let displaced = if conflict {
            std::mem::take(entries)
        } else {
            Entries::new()
        };
        entries.push(entry);
        self.count = self.count + 1 - displaced.len();
        displaced
    }

    /// Takes out the entries of `key`: with a token, only that acquisition's.
    pub(crate) fn remove(&mut self, key: &str, token: Option<u64>) -> Entries {
        let Some(entries) = self.by_key.get_mut(key) else {
            return Entries::new();
        };
        let taken = match token {
            None => std::mem::take(entries),
            Some(token) => match entries.iter().position(|held| held.token == token) {
                Some(index) => smallvec::smallvec![entries.swap_remove(index)],
                None => Entries::new(),
            },
        };
        if entries.is_empty() {
            self.by_key.remove(key);
        }
        self.count -= taken.len();
        taken
    }

    fn drain(&mut self) -> Vec<(String, Held)> {
        self.count = 0;
        self.by_key
            .drain()
            .flat_map(|(key, entries)| entries.into_iter().map(move |held| (key.clone(), held)))
            .collect()
    }

    /// Every entry, for the health monitor.
    pub(crate) fn entries_mut(&mut self) -> impl Iterator<Item = (&str, &mut Held)> {
        self.by_key
            .iter_mut()
            .flat_map(|(key, entries)| entries.iter_mut().map(move |held| (key.as_str(), held)))
    }

    /// The entry of one acquisition.
    pub(crate) fn get_mut(&mut self, key: &str, token: u64) -> Option<&mut Held> {
        self.by_key
            .get_mut(key)?
            .iter_mut()
            .find(|held| held.token == token)
    }
}

impl Inner {
    /// Takes the entries of `key` out of the bookkeeping; with a token, only that
    /// acquisition's. Their guards' signals fire ([`LostReason::Released`]).
    pub(crate) fn take(&self, key: &str, token: Option<u64>) -> Entries {
        let taken = self.held().remove(key, token);
        for held in &taken {
            held.notifier.notify(LostReason::Released);
        }
        taken
    }

    /// Takes every entry out (a shutdown): every guard's signal fires.
    pub(crate) fn take_all(&self) -> Vec<(String, Held)> {
        let drained = self.held().drain();
        for (_, held) in &drained {
            held.notifier.notify(LostReason::Released);
        }
        drained
    }

    /// Records a granted lock and hands out its guard; with fencing on, first takes
    /// the grant's token (on failure the session is closed, which frees the lock).
    pub(crate) async fn register(
        self: &Arc<Self>,
        key: &str,
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
        key: &str,
        lock_id: i64,
        mode: LockMode,
        slot: SessionSlot,
        host: Option<Membership>,
        span: &Span,
    ) -> Result<PostgresLockGuard, LockAcquisitionError> {
        let mut info = LockInfo::acquired_now(key, lock_id, self.holder_id.clone()).with_mode(mode);
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
            token,
            lock_id,
            mode,
            slot,
            notifier,
            last_answer: Instant::now(),
            pinging: false,
            group: None,
            host,
        };
        let displaced = self.held().insert(key, entry);
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
    pub(crate) async fn unlock(&self, key: &str, mut held: Held) -> ReleaseOutcome {
        let span = release_span(self.shown(key), held.lock_id, held.mode);
        let lock_id = held.lock_id;
        let statement = Statement::Unlock {
            lock_id,
            mode: held.mode,
        };
        let unlocking = std::pin::pin!(async {
            let current = Span::current();
            // Waits for a keepalive in flight (bounded by the answer timeout).
            let mut slot = held.slot.lock().await;
            let Some(session) = slot.as_mut() else {
                // The health monitor took it: the lock was lost meanwhile.
                current.record("lock.released", false);
                return ReleaseOutcome::AlreadyReleased;
            };
            let answer = session
                .run_within(statement, Limit::For(self.settings.answer_timeout))
                .await;
            // The session of a group, or a shared connection's, holds the others' locks
            // until the last unlock.
            let last = match (held.host.as_mut(), held.group.as_ref()) {
                (Some(member), _) => member.leave(),
                (None, group) => group.is_none_or(|left| left.fetch_sub(1, Ordering::AcqRel) == 1),
            };
            if !last && matches!(answer, Ok(Ok(Answer::Bool(true)))) {
                // The session still holds the rest of its group: it stays in the slot.
                current.record("lock.released", true);
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
                    current.record("lock.released", true);
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
            current.record("lock.released", false);
            record_failure(&current, kind, code);
            ReleaseOutcome::SessionClosed
        });
        unlocking.instrument(span).await
    }
}
