//! The in-memory world a cutover test runs in (feature `testing`): for this crate's tests
//! and the workspace's cutover race, which wrap the stores and the routing table to
//! inject faults or count writes; and the contracts every [`RoutingRepository`] and
//! [`MigrationRepository`](crate::MigrationRepository) runs ([`routing_contract`],
//! [`migration_contract`]).

use locks_port::DistributedLock;
use uuid::Uuid;

mod contract;
mod migration;
mod routing;

pub use migration::migration_contract;
pub use routing::routing_contract;

use crate::{
    Event, EventStore, InMemoryMigrationRepository, InMemoryWritePause, MigrationConfig,
    MigrationCoordinator, MigrationPorts, RoutingRepository, Stores, WriteRouter,
};

/// The ports of a [`World`].
pub type WorldPorts<S, R> = MigrationPorts<S, R, InMemoryWritePause, InMemoryMigrationRepository>;

/// One instance of the service in a [`World`]: a coordinator with its lock manager `L`.
pub type WorldCoordinator<L, S, R> =
    MigrationCoordinator<L, S, R, InMemoryWritePause, InMemoryMigrationRepository>;

/// One tenant, a source and a target store, a routing table, and an in-memory write
/// pause and migration records, all shared by every instance made with
/// [`coordinator`](Self::coordinator) (as instances share their databases).
///
/// The tenant has no route yet: a test routes it to the source through whichever table
/// it wants the write recorded in (the wrapper, or the table inside it).
#[derive(Debug)]
pub struct World<S, R> {
    /// The tenant to migrate (a new id each time).
    pub tenant: Uuid,
    /// The source store's id.
    pub source_id: &'static str,
    /// The target store's id.
    pub target_id: &'static str,
    /// The store the tenant starts in.
    pub source: S,
    /// The store it moves to, empty.
    pub target: S,
    /// The routing table.
    pub routing: R,
    /// The ports every instance shares.
    pub ports: WorldPorts<S, R>,
}

impl<S, R> World<S, R>
where
    S: EventStore + Clone,
    R: RoutingRepository + Clone,
{
    /// A world of the stores `source` (id `source_id`) and `target` (id `target_id`), and
    /// `routing`.
    #[must_use]
    pub fn new(
        (source_id, source): (&'static str, S),
        (target_id, target): (&'static str, S),
        routing: R,
    ) -> Self {
        let ports = MigrationPorts::new(
            Stores::new()
                .with_store(source_id, source.clone())
                .with_store(target_id, target.clone()),
            routing.clone(),
            InMemoryWritePause::new(),
            InMemoryMigrationRepository::new(),
        );
        Self {
            tenant: Uuid::new_v4(),
            source_id,
            target_id,
            source,
            target,
            routing,
            ports,
        }
    }

    /// An instance cutting over with `locks` and `config`.
    #[must_use]
    pub fn coordinator<L: DistributedLock>(
        &self,
        locks: L,
        config: MigrationConfig,
    ) -> WorldCoordinator<L, S, R> {
        MigrationCoordinator::new(self.ports.clone(), locks).with_config(config)
    }

    /// A write router with the default settings.
    #[must_use]
    pub fn router(&self) -> WriteRouter<S, R, InMemoryWritePause> {
        WriteRouter::new(&self.ports, &MigrationConfig::new())
    }

    /// Writes `n` events (`Written`, payload `0`, `1`, …) one by one through a
    /// [`router`](Self::router); returns their ids in order. Panics on a failed write.
    pub async fn write(&self, n: usize) -> Vec<Uuid> {
        let router = self.router();
        let mut ids = Vec::new();
        for i in 0..n {
            let event = Event::new("Written", i.to_string());
            router
                .append(self.tenant, std::slice::from_ref(&event))
                .await
                .expect("write");
            ids.push(event.id);
        }
        ids
    }

    /// Starts a migration of the tenant with `coordinator`, copies and enables dual
    /// write; returns the migration id. Panics on a failed step.
    pub async fn to_dual_write<L: DistributedLock>(
        &self,
        coordinator: &WorldCoordinator<L, S, R>,
    ) -> Uuid {
        let migration = coordinator
            .start_migration(self.tenant, self.source_id, self.target_id)
            .await
            .expect("start");
        coordinator.bulk_copy(migration.id).await.expect("copy");
        coordinator
            .enable_dual_write(migration.id)
            .await
            .expect("dual write");
        migration.id
    }
}
