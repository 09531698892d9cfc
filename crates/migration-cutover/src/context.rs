//! The store registry and the bundle of ports a coordinator and a router share.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::memory::{
    InMemoryEventStore, InMemoryMigrationRepository, InMemoryRoutingRepository, InMemoryWritePause,
};
use crate::ports::{EventStore, StoreId};

/// The event stores a migration can move tenants between, by id.
///
/// ```
/// use migration_cutover::{InMemoryEventStore, Stores};
///
/// let stores = Stores::new()
///     .with_store("shared", InMemoryEventStore::new())
///     .with_store("dedicated", InMemoryEventStore::new());
/// assert!(stores.get("shared").is_some());
/// assert!(stores.get("other").is_none());
/// ```
pub struct Stores<S> {
    stores: BTreeMap<StoreId, Arc<S>>,
}

impl<S> Stores<S> {
    /// No stores.
    #[must_use]
    pub fn new() -> Self {
        Self {
            stores: BTreeMap::new(),
        }
    }

    /// Registers `store` as `id` (replacing any store of that id).
    #[must_use]
    pub fn with_store(mut self, id: impl Into<StoreId>, store: S) -> Self {
        self.insert(id, store);
        self
    }

    /// Registers `store` as `id` (replacing any store of that id).
    pub fn insert(&mut self, id: impl Into<StoreId>, store: S) {
        self.stores.insert(id.into(), Arc::new(store));
    }

    /// The store registered as `id`.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<&Arc<S>> {
        self.stores.get(id)
    }

    /// The registered ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = &StoreId> {
        self.stores.keys()
    }
}

impl<S> Default for Stores<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> fmt::Debug for Stores<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.stores.keys()).finish()
    }
}

/// Everything a migration touches, shared (cheaply cloned) between a coordinator, the
/// write router, and other coordinators of the same deployment.
///
/// `S` event stores, `R` routing table, `P` write pause, `M` migration records.
pub struct MigrationPorts<
    S = InMemoryEventStore,
    R = InMemoryRoutingRepository,
    P = InMemoryWritePause,
    M = InMemoryMigrationRepository,
> {
    stores: Arc<Stores<S>>,
    routing: Arc<R>,
    pause: Arc<P>,
    migrations: Arc<M>,
}

impl<S, R, P, M> MigrationPorts<S, R, P, M> {
    /// Bundles the ports.
    #[must_use]
    pub fn new(stores: Stores<S>, routing: R, pause: P, migrations: M) -> Self {
        Self {
            stores: Arc::new(stores),
            routing: Arc::new(routing),
            pause: Arc::new(pause),
            migrations: Arc::new(migrations),
        }
    }

    /// The event stores.
    #[must_use]
    pub fn stores(&self) -> &Stores<S> {
        &self.stores
    }

    /// The routing table.
    #[must_use]
    pub fn routing(&self) -> &R {
        &self.routing
    }

    /// The write pause.
    #[must_use]
    pub fn pause(&self) -> &P {
        &self.pause
    }

    /// The migration records.
    #[must_use]
    pub fn migrations(&self) -> &M {
        &self.migrations
    }

    /// The handles a [`WriteRouter`](crate::WriteRouter) keeps.
    pub(crate) fn shared(&self) -> (Arc<Stores<S>>, Arc<R>, Arc<P>) {
        (
            self.stores.clone(),
            self.routing.clone(),
            self.pause.clone(),
        )
    }
}

impl<S: EventStore> MigrationPorts<S> {
    /// The given stores with an in-memory routing table, write pause and migration
    /// records.
    #[must_use]
    pub fn in_memory(stores: Stores<S>) -> Self {
        Self::new(
            stores,
            InMemoryRoutingRepository::new(),
            InMemoryWritePause::new(),
            InMemoryMigrationRepository::new(),
        )
    }
}

impl<S, R, P, M> Clone for MigrationPorts<S, R, P, M> {
    fn clone(&self) -> Self {
        Self {
            stores: self.stores.clone(),
            routing: self.routing.clone(),
            pause: self.pause.clone(),
            migrations: self.migrations.clone(),
        }
    }
}

impl<S, R, P, M> fmt::Debug for MigrationPorts<S, R, P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrationPorts")
            .field("stores", &self.stores)
            .finish_non_exhaustive()
    }
}
