//! The guard of a held lock.

use std::fmt;
use std::sync::Arc;

use locks_port::{LockGuard, LockInfo, ReleaseOutcome};

use crate::manager::Inner;

/// A lock held by a [`PostgresLockManager`](crate::PostgresLockManager).
///
/// Dropping the guard releases the lock: inside a Tokio runtime the unlock is spawned
/// onto it; with no runtime at hand the session is closed instead, which frees the
/// lock on the server just the same. [`release`](LockGuard::release) unlocks now and
/// says how it went; [`into_held`](LockGuard::into_held) leaves the lock to the
/// manager until `release(key)` or `release_all()`.
#[must_use = "dropping the guard releases the lock at once"]
pub struct PostgresLockGuard {
    inner: Arc<Inner>,
    info: LockInfo,
    token: u64,
    armed: bool,
}

impl PostgresLockGuard {
    pub(crate) fn new(inner: Arc<Inner>, info: LockInfo, token: u64) -> Self {
        Self {
            inner,
            info,
            token,
            armed: true,
        }
    }
}

impl LockGuard for PostgresLockGuard {
    fn info(&self) -> &LockInfo {
        &self.info
    }

    /// Unlocks now.
    ///
    /// # Cancel safety
    /// The entry leaves the bookkeeping before the first await; if the future is
    /// dropped, the session is closed instead of unlocked, which frees the lock.
    async fn release(mut self) -> ReleaseOutcome {
        self.armed = false;
        match self.inner.take(self.info.key(), Some(self.token)) {
            Some(held) => self.inner.unlock(self.info.key(), held).await,
            None => ReleaseOutcome::AlreadyReleased,
        }
    }

    fn into_held(mut self) -> LockInfo {
        self.armed = false;
        self.info.clone()
    }
}

impl Drop for PostgresLockGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(held) = self.inner.take(self.info.key(), Some(self.token)) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let inner = Arc::clone(&self.inner);
                let key = self.info.key().to_owned();
                // If the runtime drops this task before it runs, the session inside is
                // closed by its own drop: the lock is freed either way.
                runtime.spawn(async move {
                    inner.unlock(&key, held).await;
                });
            }
            Err(_) => drop(held),
        }
    }
}

impl fmt::Debug for PostgresLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockGuard")
            .field("info", &self.info)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}
