//! Writes resume before the cutover lock is released, on every path.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_memory::{InMemoryLockGuard, InMemoryLockManager};
use migration_cutover::locks_port::{
    AcquireOptions, DistributedLock, LockAcquisitionError, LockGuard, LockInfo, LockMode,
    LockNotHeldError, LostSignal, ReleaseOutcome,
};
use migration_cutover::{MigrationCoordinator, RoutingState, WritePause};
use uuid::Uuid;

use crate::support::{Harness, config};

/// Records, at each release of a lock, whether the tenant's writes were paused.
#[derive(Debug, Clone)]
struct Witness {
    pause: migration_cutover::InMemoryWritePause,
    tenant: Uuid,
    paused_at_release: Arc<Mutex<Vec<bool>>>,
}

impl Witness {
    fn record(&self) {
        let paused = self.pause.is_paused(self.tenant);
        self.paused_at_release.lock().unwrap().push(paused);
    }
}

/// A lock manager whose guards tell the witness when they release.
struct WitnessedLock {
    inner: InMemoryLockManager,
    witness: Witness,
}

#[derive(Debug)]
struct WitnessedGuard {
    inner: Option<InMemoryLockGuard>,
    witness: Witness,
}

impl Drop for WitnessedGuard {
    fn drop(&mut self) {
        if self.inner.take().is_some() {
            self.witness.record();
        }
    }
}

impl LockGuard for WitnessedGuard {
    fn info(&self) -> &LockInfo {
        self.inner.as_ref().expect("held").info()
    }

    fn lost(&self) -> LostSignal {
        self.inner.as_ref().expect("held").lost()
    }

    fn release(mut self) -> impl Future<Output = ReleaseOutcome> + Send {
        self.witness.record();
        let inner = self.inner.take().expect("held");
        inner.release()
    }

    fn into_held(mut self) -> LockInfo {
        self.inner.take().expect("held").into_held()
    }
}

impl DistributedLock for WitnessedLock {
    type Guard = WitnessedGuard;

    fn acquire(
        &self,
        key: &str,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<Self::Guard, LockAcquisitionError>> + Send {
        let witness = self.witness.clone();
        let acquire = self.inner.acquire(key, options.into());
        async move {
            Ok(WitnessedGuard {
                inner: Some(acquire.await?),
                witness,
            })
        }
    }

    fn try_acquire_with(
        &self,
        key: &str,
        mode: LockMode,
    ) -> impl Future<Output = Result<Option<Self::Guard>, LockAcquisitionError>> + Send {
        let witness = self.witness.clone();
        let attempt = self.inner.try_acquire_with(key, mode);
        async move {
            Ok(attempt.await?.map(|guard| WitnessedGuard {
                inner: Some(guard),
                witness,
            }))
        }
    }

    fn release(&self, key: &str) -> impl Future<Output = Result<(), LockNotHeldError>> + Send {
        self.inner.release(key)
    }

    fn is_held(&self, key: &str) -> bool {
        self.inner.is_held(key)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_resume_before_the_lock_is_released_on_success_failure_and_cancellation() {
    let h = Harness::new().await;
    let witness = Witness {
        pause: h.ports.pause().clone(),
        tenant: h.tenant,
        paused_at_release: Arc::default(),
    };
    let lock = WitnessedLock {
        inner: h.table.manager(),
        witness: witness.clone(),
    };
    let coordinator =
        Arc::new(MigrationCoordinator::new(h.ports.clone(), lock).with_config(config()));
    h.write(3).await;
    let migration = coordinator
        .start_migration(h.tenant, "source", "target")
        .await
        .unwrap();
    coordinator.bulk_copy(migration.id).await.unwrap();
    coordinator.enable_dual_write(migration.id).await.unwrap();

    // A failure in the paused window (the routing flip is refused).
    h.routing.fail_puts_of(Some(RoutingState::Migrated));
    assert!(!coordinator.cutover(migration.id).await.unwrap().success());
    h.routing.fail_puts_of(None);

    // The future dropped while writes are paused (a hanging health check).
    h.target.faults.ping.delay(Duration::from_secs(30));
    let running = {
        let coordinator = coordinator.clone();
        tokio::spawn(async move { coordinator.cutover(migration.id).await })
    };
    h.until_paused().await;
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    h.target.faults.ping.delay(Duration::ZERO);
    assert!(!h.is_paused(), "dropping the cutover resumed writes");
    assert!(h.table.is_empty(), "and released the lock");

    // The routing says cutover_paused now, with the record in cutover, and no pause
    // holds it: the next write rolls the route back by itself, and the next call
    // resolves the record and succeeds.
    assert_eq!(h.route().state, RoutingState::CutoverPaused);
    h.write(1).await;
    assert_eq!(h.route().state, RoutingState::DualWrite);
    let result = coordinator.cutover(migration.id).await.unwrap();
    assert!(result.success(), "{}", result.message());

    let seen = witness.paused_at_release.lock().unwrap().clone();
    assert_eq!(
        seen,
        [false, false, false],
        "writes were paused when a lock was released"
    );
}
