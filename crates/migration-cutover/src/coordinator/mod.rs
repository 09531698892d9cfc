//! The migration coordinator: the type, and what every step shares (the migration's
//! record, the tenant's route, the stores, the cutover lock).
//!
//! One file per step, in the order a migration runs them:
//! [`start`] → [`bulk_copy`] → [`dual_write`] → ([`readiness`]) → [`cutover`] (itself one
//! file per step of the cutover sequence), and [`abort`] at any point before the cutover.

use std::fmt;

use locks_port::{AcquireOptions, DistributedLock, migration_lock_key};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::context::MigrationPorts;
use crate::copy::Endpoint;
use crate::error::MigrationError;
use crate::memory::{
    InMemoryEventStore, InMemoryMigrationRepository, InMemoryRoutingRepository, InMemoryWritePause,
};
use crate::nolock::NoLockManager;
use crate::ports::{
    EventStore, Migration, MigrationRepository, RoutingRepository, StoreId, TenantRoute, WritePause,
};
use crate::router::WriteRouter;
use crate::{MigrationConfig, RoutingState};

/// The span of one migration step, with the ids as fields.
macro_rules! step_span {
    ($name:literal, $migration:expr) => {
        tracing::info_span!(
            $name,
            migration_id = %$migration.id,
            tenant_id = %$migration.tenant_id
        )
    };
}

mod abort;
mod bulk_copy;
mod cutover;

pub use cutover::CUTOVER_STEP_TARGET;
mod dual_write;
mod readiness;
mod start;

/// The operation name of the cutover lock: the key is `cutover:{tenant uuid}`.
pub const CUTOVER_LOCK_OPERATION: &str = "cutover";

/// Moves tenants from one event store to another while they keep writing.
///
/// `L` is the lock manager that serializes cutovers across instances (any
/// [`DistributedLock`]: `PostgresLockManager` in production, an in-memory one in
/// tests). It is optional: a coordinator built with
/// [`without_lock_manager`](Self::without_lock_manager) does every step but
/// [`cutover`](Self::cutover). The other parameters are the ports, in-memory by
/// default (see [`MigrationPorts`]).
///
/// The steps, each its own call so an operator (or a job) can drive and watch them:
/// [`start_migration`](Self::start_migration) → [`bulk_copy`](Self::bulk_copy) →
/// [`enable_dual_write`](Self::enable_dual_write) → ([`catch_up`](Self::catch_up),
/// [`cutover_readiness`](Self::cutover_readiness)) → [`cutover`](Self::cutover);
/// [`abort`](Self::abort) at any point before the cutover.
pub struct MigrationCoordinator<
    L,
    S = InMemoryEventStore,
    R = InMemoryRoutingRepository,
    P = InMemoryWritePause,
    M = InMemoryMigrationRepository,
> {
    ports: MigrationPorts<S, R, P, M>,
    lock_manager: Option<L>,
    config: MigrationConfig,
}

impl<L, S, R, P, M> fmt::Debug for MigrationCoordinator<L, S, R, P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrationCoordinator")
            .field("ports", &self.ports)
            .field("has_lock_manager", &self.lock_manager.is_some())
            .field("config", &self.config)
            .finish()
    }
}

impl<S, R, P, M> MigrationCoordinator<NoLockManager, S, R, P, M>
where
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// A coordinator for copy and dual-write work only: [`cutover`](Self::cutover)
    /// fails with [`MigrationError::LockManagerRequired`].
    #[must_use]
    pub fn without_lock_manager(ports: MigrationPorts<S, R, P, M>) -> Self {
        Self::with_optional_lock_manager(ports, None)
    }
}

impl<L, S, R, P, M> MigrationCoordinator<L, S, R, P, M>
where
    L: DistributedLock,
    S: EventStore,
    R: RoutingRepository,
    P: WritePause,
    M: MigrationRepository,
{
    /// A coordinator that serializes cutovers with `lock_manager`.
    #[must_use]
    pub fn new(ports: MigrationPorts<S, R, P, M>, lock_manager: L) -> Self {
        Self::with_optional_lock_manager(ports, Some(lock_manager))
    }

    /// A coordinator with or without a lock manager (the Python library's
    /// `lock_manager=None`).
    #[must_use]
    pub fn with_optional_lock_manager(
        ports: MigrationPorts<S, R, P, M>,
        lock_manager: Option<L>,
    ) -> Self {
        Self {
            ports,
            lock_manager,
            config: MigrationConfig::new(),
        }
    }

    /// The same coordinator with other settings.
    #[must_use]
    pub fn with_config(mut self, config: MigrationConfig) -> Self {
        self.config = config;
        self
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &MigrationConfig {
        &self.config
    }

    /// The ports.
    #[must_use]
    pub fn ports(&self) -> &MigrationPorts<S, R, P, M> {
        &self.ports
    }

    /// The lock manager, if the coordinator has one.
    #[must_use]
    pub fn lock_manager(&self) -> Option<&L> {
        self.lock_manager.as_ref()
    }

    /// A write router over the same ports, with this coordinator's write timeout.
    #[must_use]
    pub fn router(&self) -> WriteRouter<S, R, P> {
        WriteRouter::new(&self.ports, &self.config)
    }

    /// The migration record `migration_id`.
    ///
    /// # Errors
    /// [`MigrationError::NotFound`], or the repository's failure.
    pub async fn migration(&self, migration_id: Uuid) -> Result<Migration, MigrationError> {
        self.ports
            .migrations()
            .get(migration_id)
            .await
            .map_err(MigrationError::Record)?
            .ok_or(MigrationError::NotFound { migration_id })
    }

    /// Saves the migration's record, stamped with the time of the change.
    async fn save(&self, migration: &mut Migration) -> Result<(), MigrationError> {
        migration.updated_at = OffsetDateTime::now_utc();
        self.ports
            .migrations()
            .save(migration)
            .await
            .map_err(MigrationError::Record)
    }

    /// The store registered as `id`.
    fn store<'a>(&'a self, id: &'a StoreId) -> Result<Endpoint<'a, S>, MigrationError> {
        let store =
            self.ports
                .stores()
                .get(id.as_str())
                .ok_or_else(|| MigrationError::UnknownStore {
                    store_id: id.clone(),
                })?;
        Ok(Endpoint { id, store })
    }

    /// The tenant's route.
    async fn route(&self, tenant_id: Uuid) -> Result<TenantRoute, MigrationError> {
        self.ports
            .routing()
            .get(tenant_id)
            .await
            .map_err(MigrationError::Routing)?
            .ok_or(MigrationError::NoRoute { tenant_id })
    }

    /// The tenant's route, checked to belong to `migration`.
    async fn route_of(&self, migration: &Migration) -> Result<TenantRoute, MigrationError> {
        let route = self.route(migration.tenant_id).await?;
        if route.migration_id != Some(migration.id) {
            return Err(MigrationError::TenantBusy {
                tenant_id: migration.tenant_id,
                migration_id: route.migration_id,
            });
        }
        Ok(route)
    }

    /// Moves the route to `state` (a no-op when it is there already, so a step can
    /// be retried after a partial failure).
    async fn move_route(
        &self,
        route: &mut TenantRoute,
        state: RoutingState,
    ) -> Result<(), MigrationError> {
        if route.state == state {
            return Ok(());
        }
        let next = TenantRoute {
            state: route.state.transition_to(state)?,
            ..route.clone()
        };
        self.ports
            .routing()
            .put(next.clone())
            .await
            .map_err(MigrationError::Routing)?;
        *route = next;
        Ok(())
    }

    /// The options of every wait for the cutover lock: the configured lock timeout.
    fn cutover_lock_options(&self) -> AcquireOptions {
        AcquireOptions::new().with_timeout(self.config.lock_timeout())
    }
}

/// The key of the lock that serializes the cutover (and abort) of `tenant_id`.
fn cutover_lock_key(tenant_id: Uuid) -> String {
    migration_lock_key(tenant_id, Some(CUTOVER_LOCK_OPERATION))
}
