//! The write path: appends routed by the tenant's routing state.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{Instrument, debug, warn};
use uuid::Uuid;

use crate::context::{MigrationPorts, Stores};
use crate::copy::{Endpoint, sync_to};
use crate::error::{StoreFailure, WriteError};
use crate::memory::{InMemoryEventStore, InMemoryRoutingRepository, InMemoryWritePause};
use crate::ports::{
    Event, EventStore, RoutingRepository, StoreId, StoredEvent, TenantRoute, WritePause,
    WritesPaused,
};
use crate::timer::sleep;
use crate::{MigrationConfig, RoutingState};

/// How often a write looks again at a tenant whose routing says `cutover_paused`
/// (a pause taken by another process, which this process's write pause does not see).
const PAUSED_ROUTE_POLL: Duration = Duration::from_millis(10);

/// Where one routed write went.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WriteReceipt {
    /// The store that took the write (the tenant's store of record).
    pub store_id: StoreId,
    /// The head of the tenant's stream there after the write.
    pub position: u64,
    /// The store the write was also mirrored to, in `dual_write`, when mirroring
    /// worked (when it did not, the next catch-up copies the events).
    pub mirrored_to: Option<StoreId>,
}

/// Appends a tenant's events where its routing says:
///
/// | routing state | writes go to |
/// | --- | --- |
/// | `normal`, `bulk_copy` | the routed store (the source during a migration) |
/// | `dual_write` | the source, then mirrored to the target |
/// | `cutover_paused` | nowhere yet: the write waits, up to its timeout; but if the write holds a permit of the pause (so no live cutover holds it), the cutover that wrote `cutover_paused` is gone, and the write rolls the route back to `dual_write` (one compare-and-set) and goes ahead |
/// | `migrated` | the routed store (the target) |
///
/// Every write holds a permit of the [`WritePause`] while it runs, so a cutover that
/// pauses the tenant waits for writes under way to finish before it measures the lag.
/// Rolling back an abandoned `cutover_paused` relies on the pause covering every
/// instance that writes to or cuts over the tenant (one process with the in-memory
/// pause, or a fleet-wide pause such as `migration-cutover-postgres`'s): a permit then
/// proves that no cutover is in its paused window.
pub struct WriteRouter<
    S = InMemoryEventStore,
    R = InMemoryRoutingRepository,
    P = InMemoryWritePause,
> {
    stores: Arc<Stores<S>>,
    routing: Arc<R>,
    pause: Arc<P>,
    timeout: Duration,
    batch_size: usize,
}

impl<S, R, P> Clone for WriteRouter<S, R, P> {
    fn clone(&self) -> Self {
        Self {
            stores: self.stores.clone(),
            routing: self.routing.clone(),
            pause: self.pause.clone(),
            timeout: self.timeout,
            batch_size: self.batch_size,
        }
    }
}

impl<S, R, P> fmt::Debug for WriteRouter<S, R, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteRouter")
            .field("stores", &self.stores)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<S: EventStore, R: RoutingRepository, P: WritePause> WriteRouter<S, R, P> {
    /// A router over `ports`, with the write timeout and batch size of `config`.
    #[must_use]
    pub fn new<M>(ports: &MigrationPorts<S, R, P, M>, config: &MigrationConfig) -> Self {
        let (stores, routing, pause) = ports.shared();
        Self {
            stores,
            routing,
            pause,
            timeout: config.write_timeout(),
            batch_size: config.batch_size(),
        }
    }

    /// The same router with another default write timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Appends `events` to the tenant's stream, waiting out a cutover pause for up to
    /// the router's timeout.
    ///
    /// # Errors
    /// [`WriteError::Paused`] when the pause outlasted the timeout;
    /// [`WriteError::CommitUncertain`] when the store lost the answer to its commit (the
    /// events may be stored: retry the same events, which is idempotent); otherwise the
    /// routing or store failure, and nothing was written.
    ///
    /// # Cancel safety
    /// Dropping the future while it waits writes nothing. Dropping it during a store
    /// call leaves that call's outcome to the store (the in-memory store completes
    /// every call in one poll).
    pub async fn append(
        &self,
        tenant_id: Uuid,
        events: &[Event],
    ) -> Result<WriteReceipt, WriteError> {
        self.append_within(tenant_id, events, self.timeout).await
    }

    /// [`append`](Self::append) with this write's own timeout.
    ///
    /// # Errors
    /// As [`append`](Self::append).
    pub async fn append_within(
        &self,
        tenant_id: Uuid,
        events: &[Event],
        timeout: Duration,
    ) -> Result<WriteReceipt, WriteError> {
        let span =
            tracing::debug_span!("migration.write", tenant_id = %tenant_id, events = events.len());
        self.append_inner(tenant_id, events, timeout)
            .instrument(span)
            .await
    }

    async fn append_inner(
        &self,
        tenant_id: Uuid,
        events: &[Event],
        timeout: Duration,
    ) -> Result<WriteReceipt, WriteError> {
        let started = Instant::now();
        loop {
            let remaining = timeout.saturating_sub(started.elapsed());
            let permit = self
                .pause
                .admit(tenant_id, remaining)
                .await
                .map_err(|error| WritesPaused {
                    tenant_id,
                    waited: started.elapsed().max(error.waited),
                })?;
            let route = self
                .routing
                .get(tenant_id)
                .await
                .map_err(WriteError::Routing)?
                .ok_or(WriteError::NoRoute { tenant_id })?;
            if let Some(resumed) = route.abandoned_pause_rollback() {
                // Holding a permit, no cutover holds the pause: the one that wrote
                // `cutover_paused` is gone. Roll it back (one compare-and-set; of two
                // writers doing so at once, one wins) and look again.
                let rolled_back = self
                    .routing
                    .compare_and_set(&route, resumed)
                    .await
                    .map_err(WriteError::Routing)?;
                if rolled_back {
                    warn!(tenant_id = %tenant_id, "rolled back a `cutover_paused` route no live cutover holds");
                }
                drop(permit);
                continue;
            }
            if !route.state.accepts_writes() {
                drop(permit);
                let remaining = timeout.saturating_sub(started.elapsed());
                if remaining.is_zero() {
                    return Err(WritesPaused {
                        tenant_id,
                        waited: started.elapsed(),
                    }
                    .into());
                }
                debug!(tenant_id = %tenant_id, "routing says cutover_paused; waiting");
                sleep(remaining.min(PAUSED_ROUTE_POLL)).await;
                continue;
            }
            let receipt = self.write_routed(&route, events).await;
            drop(permit);
            return receipt;
        }
    }

    async fn write_routed(
        &self,
        route: &TenantRoute,
        events: &[Event],
    ) -> Result<WriteReceipt, WriteError> {
        let tenant_id = route.tenant_id;
        let store = self.endpoint(&route.store_id)?;
        let position = store
            .store
            .append(tenant_id, None, events)
            .await
            .map_err(|error| store.fail(error))?;
        let mut receipt = WriteReceipt {
            store_id: route.store_id.clone(),
            position,
            mirrored_to: None,
        };
        if route.state != RoutingState::DualWrite {
            return Ok(receipt);
        }
        let Some(target_id) = &route.target_store_id else {
            warn!(tenant_id = %tenant_id, "dual_write without a target store; not mirrored");
            return Ok(receipt);
        };
        match self
            .mirror(tenant_id, store, target_id, events, position)
            .await
        {
            Ok(()) => receipt.mirrored_to = Some(target_id.clone()),
            Err(error) => warn!(
                tenant_id = %tenant_id,
                target = %target_id,
                error = %error,
                "mirroring a dual write failed; the next catch-up copies it"
            ),
        }
        Ok(receipt)
    }

    /// Makes the target hold everything up to `position`: appends the events directly
    /// when the target is exactly where they start, or copies from the source when it
    /// is behind (a conflict means a copier got there first).
    async fn mirror(
        &self,
        tenant_id: Uuid,
        source: Endpoint<'_, S>,
        target_id: &StoreId,
        events: &[Event],
        position: u64,
    ) -> Result<(), StoreFailure> {
        let target = self.endpoint(target_id).map_err(|_| StoreFailure {
            store_id: target_id.clone(),
            error: crate::ports::StoreError::unavailable("the target store is not registered"),
        })?;
        let start = position.saturating_sub(u64::try_from(events.len()).unwrap_or(u64::MAX));
        match target.store.append(tenant_id, Some(start), events).await {
            Ok(_) => Ok(()),
            Err(crate::ports::StoreError::Conflict { .. }) => {
                sync_to(tenant_id, source, target, position, self.batch_size)
                    .await
                    .map(|_| ())
            }
            Err(error) => Err(target.fail(error)),
        }
    }

    fn endpoint<'a>(&'a self, id: &'a StoreId) -> Result<Endpoint<'a, S>, WriteError> {
        let store = self
            .stores
            .get(id.as_str())
            .ok_or_else(|| WriteError::UnknownStore {
                store_id: id.clone(),
            })?;
        Ok(Endpoint { id, store })
    }

    /// Up to `limit` of the tenant's events after `after`, from the store it is
    /// routed to.
    ///
    /// # Errors
    /// The routing or store failure.
    pub async fn read(
        &self,
        tenant_id: Uuid,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, WriteError> {
        let route = self
            .routing
            .get(tenant_id)
            .await
            .map_err(WriteError::Routing)?
            .ok_or(WriteError::NoRoute { tenant_id })?;
        let store = self.endpoint(&route.store_id)?;
        let events = store
            .store
            .read(tenant_id, after, limit)
            .await
            .map_err(|error| store.fail(error))?;
        Ok(events)
    }
}
