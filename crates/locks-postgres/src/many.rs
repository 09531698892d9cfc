//! Several keys at once: all or nothing, in one global order, within one deadline, on
//! one session.

use std::fmt;
use std::sync::Arc;

use locks_port::{
    AcquireOptions, LockAcquisitionError, LockGroup, LockInfo, LockMode, LossNotifier, LostSignal,
    ReleaseOutcome,
};
use tracing::{Instrument, Span};

use crate::acquire;
use crate::bookkeeping::{Entries, Granted, Group, Held, Holding};
use crate::connection::Session;
use crate::fencing;
use crate::grant;
use crate::guard::gone;
use crate::inner::Inner;
use crate::release;
use crate::slot::new_slot;
use crate::telemetry::{finish_acquire_span, manager_acquire_span, started};

/// [`PostgresLockManager::acquire_many`] of checked keys.
pub(crate) async fn acquire_many(
    inner: &Arc<Inner>,
    keys: &[&str],
    options: AcquireOptions,
) -> Result<PostgresLockGroup, LockAcquisitionError> {
    // One global order (the port's), with the lock ids from the manager's cache.
    let ordered = locks_port::lock_order_with(keys, |key| inner.lock_ids().lock_id(key));
    let first = ordered.values().next().copied().unwrap_or("");
    let span = manager_acquire_span(
        inner.settings().span_level,
        inner.shown(first),
        *ordered.keys().next().unwrap_or(&0),
        &options,
    );
    let started = started(&span);
    let began = inner.metrics().started();
    let keys: Vec<&str> = ordered.values().copied().collect();
    let lock_ids: Box<[i64]> = ordered.keys().copied().collect();
    let attempt = async {
        let session = acquire::acquire_group(inner, &keys, &lock_ids, options).await?;
        register_group(inner, &keys, lock_ids, options.mode(), session, &span).await
    }
    .instrument(span.clone())
    .await;
    finish_acquire_span(&span, started, attempt.as_ref().map(|_| true));
    let first_id = ordered.keys().next().copied().unwrap_or(0);
    let outcome = attempt.as_ref().map(|_| true);
    inner
        .metrics()
        .acquisition(options.mode(), first_id, began, outcome);
    attempt
}

/// Records a group: one entry per key, one shared session and one shared signal;
/// with fencing on, first takes a token per key (one round trip; on failure the
/// session is closed, which frees them all).
async fn register_group(
    inner: &Arc<Inner>,
    keys: &[&str],
    lock_ids: Box<[i64]>,
    mode: LockMode,
    mut session: Session,
    span: &Span,
) -> Result<PostgresLockGroup, LockAcquisitionError> {
    let fencing_tokens = if inner.settings().fencing && !lock_ids.is_empty() {
        let first = keys.first().copied().unwrap_or("");
        Some(
            Box::pin(fencing::next_fencing_tokens(
                inner,
                first,
                &lock_ids,
                &mut session,
            ))
            .await?,
        )
    } else {
        None
    };
    let ticket = inner.next_ticket();
    let notifier = LossNotifier::new();
    let slot = new_slot(session);
    let group = Arc::new(Group::new(lock_ids));
    let mut infos = Vec::with_capacity(keys.len());
    let mut entries = Vec::with_capacity(keys.len());
    for (&lock_id, &key) in group.lock_ids().iter().zip(keys) {
        let shared_key: Arc<str> = Arc::from(key);
        let granted = Granted::now();
        let mut info = granted
            .info(Arc::clone(&shared_key), lock_id, inner.holder_id().cloned())
            .with_mode(mode);
        if let Some(&token) = fencing_tokens
            .as_ref()
            .and_then(|tokens| tokens.get(&lock_id))
        {
            info = info.with_fencing_token(token);
        }
        entries.push(Held::new(
            shared_key,
            ticket,
            &info,
            granted,
            Arc::clone(&slot),
            notifier.clone(),
            Holding::Group(Arc::clone(&group)),
        ));
        infos.push(info);
    }
    grant::book_entries(inner, entries, span);
    Ok(PostgresLockGroup {
        inner: Arc::clone(inner),
        infos,
        ticket,
        lost: notifier.signal(),
        armed: true,
    })
}

/// The inherent methods, for code generic over the manager.
impl LockGroup for PostgresLockGroup {
    fn infos(&self) -> &[LockInfo] {
        Self::infos(self)
    }

    fn lost(&self) -> LostSignal {
        Self::lost(self)
    }

    async fn release(self) -> ReleaseOutcome {
        Self::release(self).await
    }
}

/// The locks of one [`acquire_many`](crate::PostgresLockManager::acquire_many), held on one
/// session and released together.
///
/// Dropping it releases them all (spawned onto the runtime, or by closing the session
/// when there is none). [`lost`](Self::lost) fires when any of them is no longer held.
#[must_use = "dropping the guard releases the locks at once"]
pub struct PostgresLockGroup {
    inner: Arc<Inner>,
    infos: Vec<LockInfo>,
    /// The group's bookkeeping ticket.
    ticket: u64,
    lost: LostSignal,
    armed: bool,
}

impl PostgresLockGroup {
    /// The locks, in the order they were taken (ascending lock id).
    #[must_use]
    pub fn infos(&self) -> &[LockInfo] {
        &self.infos
    }

    /// Fires when any of the locks is no longer held (see
    /// [`LockGuard::lost`](locks_port::LockGuard::lost)).
    #[must_use]
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Whether any of the locks is no longer held.
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Releases every lock now, in one round trip: `Unlocked` when each was unlocked,
    /// else what happened instead (a lock lost or released meanwhile, a session closed
    /// instead).
    ///
    /// # Cancel safety
    /// The entries leave the bookkeeping before the first await; if the future is
    /// dropped, the shared session is closed, which frees what is left.
    pub async fn release(mut self) -> ReleaseOutcome {
        self.armed = false;
        let taken = self.take();
        let expected = self.infos.len();
        let found = taken.len();
        let mut outcome = release::unlock_together(&self.inner, Entries::from_vec(taken)).await;
        if found < expected && outcome == ReleaseOutcome::Unlocked {
            outcome = gone(&self.lost);
        }
        outcome
    }

    fn take(&self) -> Vec<Held> {
        self.infos
            .iter()
            .filter_map(|info| self.inner.take_one(info.lock_id(), self.ticket))
            .collect()
    }
}

impl Drop for PostgresLockGroup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let taken = self.take();
        if !taken.is_empty() {
            release::unlock_later(&self.inner, Entries::from_vec(taken));
        }
    }
}

impl fmt::Debug for PostgresLockGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockGroup")
            .field("infos", &self.infos)
            .field("lost", &self.lost.reason())
            .finish_non_exhaustive()
    }
}
