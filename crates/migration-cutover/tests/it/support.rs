//! Fault-injecting wrappers around the in-memory ports, and a harness that wires a
//! tenant, two stores, a routing table and a shared lock table.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_memory::{InMemoryLockManager, InMemoryLockTable};
use migration_cutover::testing::{World, WorldCoordinator};
use migration_cutover::{
    Event, EventStore, InMemoryEventStore, InMemoryRoutingRepository, MigrationConfig,
    RepositoryError, RoutingRepository, RoutingState, StoreError, StoredEvent, TenantRoute,
    WritePause,
};
use uuid::Uuid;

/// One operation's fault: fail it, and/or delay it.
#[derive(Debug, Default)]
pub(crate) struct Fault {
    fail: AtomicBool,
    delay_ms: AtomicU64,
}

impl Fault {
    pub(crate) fn fail(&self, on: bool) {
        self.fail.store(on, Ordering::SeqCst);
    }

    pub(crate) fn delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    async fn apply(&self, what: &str) -> Result<(), StoreError> {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable(format!("injected {what} failure")));
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
pub(crate) struct StoreFaults {
    pub(crate) append: Fault,
    pub(crate) read: Fault,
    pub(crate) position: Fault,
    pub(crate) ping: Fault,
}

/// An in-memory store whose operations can be made to fail or to be slow.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultyStore {
    pub(crate) inner: InMemoryEventStore,
    pub(crate) faults: Arc<StoreFaults>,
}

impl FaultyStore {
    pub(crate) fn events(&self, tenant_id: Uuid) -> Vec<StoredEvent> {
        self.inner.events(tenant_id)
    }

    pub(crate) fn ids(&self, tenant_id: Uuid) -> Vec<Uuid> {
        self.events(tenant_id)
            .into_iter()
            .map(|e| e.event.id)
            .collect()
    }
}

impl EventStore for FaultyStore {
    fn append(
        &self,
        tenant_id: Uuid,
        expected: Option<u64>,
        events: &[Event],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let (faults, inner, events) = (self.faults.clone(), self.inner.clone(), events.to_vec());
        async move {
            faults.append.apply("append").await?;
            inner.append(tenant_id, expected, &events).await
        }
    }

    fn read(
        &self,
        tenant_id: Uuid,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredEvent>, StoreError>> + Send {
        let (faults, inner) = (self.faults.clone(), self.inner.clone());
        async move {
            faults.read.apply("read").await?;
            inner.read(tenant_id, after, limit).await
        }
    }

    fn position(&self, tenant_id: Uuid) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let (faults, inner) = (self.faults.clone(), self.inner.clone());
        async move {
            faults.position.apply("position").await?;
            inner.position(tenant_id).await
        }
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        let faults = self.faults.clone();
        async move { faults.ping.apply("ping").await }
    }
}

/// An in-memory routing table that records every write and can refuse writes of one
/// state.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultyRouting {
    pub(crate) inner: InMemoryRoutingRepository,
    fail_puts_of: Arc<Mutex<Option<RoutingState>>>,
    pub(crate) puts: Arc<Mutex<Vec<TenantRoute>>>,
    /// Written right after the next read's answer was taken, as a write that lands
    /// between a reader's read and its own write would be.
    after_next_get: Arc<Mutex<Option<TenantRoute>>>,
}

impl FaultyRouting {
    pub(crate) fn fail_puts_of(&self, state: Option<RoutingState>) {
        *self.fail_puts_of.lock().unwrap() = state;
    }

    /// Writes `route` right after the next `get` has read the route as it was.
    pub(crate) fn after_next_get(&self, route: TenantRoute) {
        *self.after_next_get.lock().unwrap() = Some(route);
    }

    pub(crate) fn puts_of(&self, state: RoutingState) -> usize {
        self.puts
            .lock()
            .unwrap()
            .iter()
            .filter(|route| route.state == state)
            .count()
    }
}

impl RoutingRepository for FaultyRouting {
    fn get(
        &self,
        tenant_id: Uuid,
    ) -> impl Future<Output = Result<Option<TenantRoute>, RepositoryError>> + Send {
        let inner = self.inner.clone();
        let then = self.after_next_get.lock().unwrap().take();
        async move {
            let read = inner.get(tenant_id).await;
            if let Some(route) = then {
                inner.put(route).await?;
            }
            read
        }
    }

    fn put(&self, route: TenantRoute) -> impl Future<Output = Result<(), RepositoryError>> + Send {
        let refused = *self.fail_puts_of.lock().unwrap() == Some(route.state);
        let inner = self.inner.clone();
        let puts = self.puts.clone();
        async move {
            if refused {
                return Err(RepositoryError::new(
                    "routing update",
                    format!("injected failure writing state {}", route.state),
                ));
            }
            puts.lock().unwrap().push(route.clone());
            inner.put(route).await
        }
    }

    /// Refused like [`put`](Self::put) for the refused state; recorded as a put when it
    /// replaced the route.
    fn compare_and_set(
        &self,
        expected: &TenantRoute,
        next: TenantRoute,
    ) -> impl Future<Output = Result<bool, RepositoryError>> + Send {
        let refused = *self.fail_puts_of.lock().unwrap() == Some(next.state);
        let inner = self.inner.clone();
        let puts = self.puts.clone();
        let expected = expected.clone();
        async move {
            if refused {
                return Err(RepositoryError::new(
                    "routing update",
                    format!("injected failure writing state {}", next.state),
                ));
            }
            let replaced = inner.compare_and_set(&expected, next.clone()).await?;
            if replaced {
                puts.lock().unwrap().push(next);
            }
            Ok(replaced)
        }
    }
}

pub(crate) type Coordinator = WorldCoordinator<InMemoryLockManager, FaultyStore, FaultyRouting>;

pub(crate) const SOURCE: &str = "source";
pub(crate) const TARGET: &str = "target";

/// The shared world ([`World`]) on fault-injecting stores and routing, its tenant routed
/// to `source` (a write the routing table does not record), and one lock table that every
/// coordinator of the harness shares (like instances sharing one database).
pub(crate) struct Harness {
    world: World<FaultyStore, FaultyRouting>,
    pub(crate) table: InMemoryLockTable,
}

impl std::ops::Deref for Harness {
    type Target = World<FaultyStore, FaultyRouting>;

    fn deref(&self) -> &Self::Target {
        &self.world
    }
}

impl Harness {
    pub(crate) async fn new() -> Self {
        let world = World::new(
            (SOURCE, FaultyStore::default()),
            (TARGET, FaultyStore::default()),
            FaultyRouting::default(),
        );
        world
            .routing
            .inner
            .put(TenantRoute::normal(world.tenant, SOURCE))
            .await
            .unwrap();
        Self {
            world,
            table: InMemoryLockTable::new(),
        }
    }

    /// A coordinator (one "instance") on the shared lock table.
    pub(crate) fn coordinator(&self, config: MigrationConfig) -> Coordinator {
        self.world.coordinator(self.table.manager(), config)
    }

    pub(crate) fn route(&self) -> TenantRoute {
        self.routing
            .inner
            .route(self.tenant)
            .expect("the tenant has a route")
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.ports.pause().is_paused(self.tenant)
    }

    /// Waits (up to 5 s) until the tenant's writes are paused.
    pub(crate) async fn until_paused(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !self.is_paused() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the cutover never paused writes"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

pub(crate) fn config() -> MigrationConfig {
    MigrationConfig::new()
}
