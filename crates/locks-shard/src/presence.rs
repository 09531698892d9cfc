//! Presence: a member holds a lock of its own for as long as it is a member, and waits
//! in the queue of the presence locks of the next members on the list, so that it
//! ticks as soon as one of them dies instead of on its next tick.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use locks_port::{AcquisitionErrorKind, DistributedLock, LockGuard};

use crate::assign::to_watch;
use crate::group::ShardGroup;
use crate::waits::Waits;

/// How long one watch waits before it is armed again (on a later tick): a bound on
/// how long a pool connection goes unchecked by a watch that is never granted, and on
/// how long the server may keep a wait of a member cut off from it.
const WATCH_WAIT: Duration = Duration::from_secs(10);

/// A member whose presence lock was found free is not watched again for this long
/// while it is still listed (a member without a presence lock, or one that lost it and
/// has not taken it again: watching it would only wake this member in a loop).
const REWATCH_AFTER: Duration = Duration::from_millis(250);

/// A member's own presence lock and its watches of the next members' ones.
pub(crate) struct Presence<'s, M: DistributedLock> {
    locks: &'s M,
    group: &'s ShardGroup,
    own: Option<M::Guard>,
    watches: Waits<'s, u32, bool>,
    /// Watched members whose presence lock was found free, and when.
    free: BTreeMap<u32, Instant>,
}

impl<'s, M> Presence<'s, M>
where
    M: DistributedLock,
    M::Guard: 'static,
{
    pub(crate) fn new(locks: &'s M, group: &'s ShardGroup) -> Self {
        Self {
            locks,
            group,
            own: None,
            watches: Waits::default(),
            free: BTreeMap::new(),
        }
    }

    /// Takes this member's presence lock (its membership slot's) if it does not hold it
    /// (its first tick, or its session ended): one try; a failure is tried again on the
    /// next tick.
    pub(crate) async fn hold(&mut self, slot: u32) {
        if self.own.as_ref().is_some_and(|own| !own.is_lost()) {
            return;
        }
        self.own = match self.locks.try_acquire(&self.group.presence_key(slot)).await {
            Ok(own) => own,
            Err(error) => {
                tracing::debug!(error = %error, "taking this member's presence lock failed");
                None
            }
        };
    }

    /// Watches the members that follow `me` on `members` ([`to_watch`]), and only
    /// those.
    pub(crate) fn watch(&mut self, members: &[u32], me: u32) {
        let now = Instant::now();
        self.free
            .retain(|slot, at| members.contains(slot) && now.duration_since(*at) < REWATCH_AFTER);
        let watched: Vec<u32> = to_watch(members, me)
            .into_iter()
            .filter(|slot| !self.free.contains_key(slot))
            .collect();
        self.watches.keep_only(&watched);
        for slot in watched {
            if self.watches.contains(slot) {
                continue;
            }
            let (locks, key) = (self.locks, self.group.presence_key(slot));
            self.watches.push(slot, async move {
                match locks.acquire(&key, WATCH_WAIT).await {
                    Ok(guard) => {
                        guard.release().await;
                        true
                    }
                    Err(error) => {
                        if error.kind() != AcquisitionErrorKind::Timeout {
                            tracing::debug!(error = %error, "watching a member failed");
                        }
                        false
                    }
                }
            });
        }
    }

    /// The slot of a watched member whose presence lock was found free (most often:
    /// its process died, and every session of it ended with it); pending until then.
    pub(crate) async fn ended(&mut self) -> u32 {
        loop {
            let (slot, free) = self.watches.next().await;
            if free {
                self.free.insert(slot, Instant::now());
                return slot;
            }
        }
    }
}
