//! In-memory implementations of every port, good enough for a real single-process run
//! and for tests. Each is a cheap `Clone` handle: clones share the same data.

mod pause;

use std::collections::{HashMap, HashSet};
use std::future::{Future, ready};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use time::OffsetDateTime;
use uuid::Uuid;

pub use pause::{InMemoryPauseGuard, InMemoryWritePause, InMemoryWritePermit};

use crate::ports::{
    Event, EventStore, Migration, MigrationRepository, RepositoryError, RoutingRepository,
    StoreError, StoredEvent, TenantRoute,
};

/// Locks a mutex, carrying on with the data if a panicking thread poisoned it: every
/// critical section of the in-memory ports leaves its data consistent at each statement.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An event store in memory: one `Vec` of events per tenant.
///
/// ```
/// use migration_cutover::{Event, EventStore, InMemoryEventStore};
/// use uuid::Uuid;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = InMemoryEventStore::new();
/// let tenant = Uuid::new_v4();
/// assert_eq!(store.append(tenant, None, &[Event::new("A", "1")]).await.unwrap(), 1);
/// assert_eq!(store.append(tenant, Some(1), &[Event::new("B", "2")]).await.unwrap(), 2);
/// assert!(store.append(tenant, Some(1), &[Event::new("C", "3")]).await.is_err());
/// assert_eq!(store.events(tenant).len(), 2);
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct InMemoryEventStore {
    streams: Arc<Mutex<HashMap<Uuid, Vec<Event>>>>,
}

impl InMemoryEventStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A snapshot of the tenant's whole stream.
    #[must_use]
    pub fn events(&self, tenant_id: Uuid) -> Vec<StoredEvent> {
        lock(&self.streams)
            .get(&tenant_id)
            .map(|stream| stored(stream, 0, usize::MAX))
            .unwrap_or_default()
    }
}

/// The refusal of text holding a NUL byte, in the words of the PostgreSQL adapters (whose
/// server refuses it in a `text` column: `invalid byte sequence for encoding "UTF8":
/// 0x00`), so a test on memory fails where production would. `None` for text without one.
fn nul_refusal<'a>(fields: impl IntoIterator<Item = (&'static str, &'a str)>) -> Option<String> {
    fields
        .into_iter()
        .find(|(_, text)| text.contains('\0'))
        .map(|(field, text)| {
            format!(
                "invalid byte sequence for encoding \"UTF8\": 0x00 ({field} {text:?} holds a NUL \
                 byte, which a store's text cannot hold)"
            )
        })
}

/// The first instant PostgreSQL's `timestamptz` holds, 4714-11-24 00:00:00 UTC BC, in
/// nanoseconds since the Unix epoch.
const EARLIEST_NANOS: i128 = -210_866_803_200_000_000_000;

/// The refusal of a time before [`EARLIEST_NANOS`], in the words of the PostgreSQL
/// adapters (whose server refuses it: `timestamp out of range`). `None` when every time
/// is in range.
fn time_refusal(
    fields: impl IntoIterator<Item = (&'static str, OffsetDateTime)>,
) -> Option<String> {
    fields
        .into_iter()
        .find(|(_, at)| at.unix_timestamp_nanos() < EARLIEST_NANOS)
        .map(|(field, at)| {
            format!(
                "timestamp out of range ({field} {at} is before 4714-11-24 00:00:00 UTC BC, the \
                 first instant a store's timestamp holds)"
            )
        })
}

/// The text fields of a route, for [`nul_refusal`].
fn route_text(route: &TenantRoute) -> impl Iterator<Item = (&'static str, &str)> {
    std::iter::once(("store id", route.store_id.as_str())).chain(
        route
            .target_store_id
            .as_ref()
            .map(|id| ("target store id", id.as_str())),
    )
}

fn stored(stream: &[Event], after: u64, limit: usize) -> Vec<StoredEvent> {
    let start = usize::try_from(after)
        .unwrap_or(usize::MAX)
        .min(stream.len());
    stream[start..]
        .iter()
        .take(limit)
        .zip(after + 1..)
        .map(|(event, position)| StoredEvent {
            position,
            event: event.clone(),
        })
        .collect()
}

fn head(stream: &[Event]) -> u64 {
    head_of(stream.len())
}

fn head_of(count: usize) -> u64 {
    u64::try_from(count).unwrap_or(u64::MAX)
}

impl EventStore for InMemoryEventStore {
    fn append(
        &self,
        tenant_id: Uuid,
        expected: Option<u64>,
        events: &[Event],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let kinds = events
            .iter()
            .map(|event| ("event kind", event.kind.as_str()));
        if let Some(words) = nul_refusal(kinds) {
            return ready(Err(StoreError::unavailable(format!("append: {words}"))));
        }
        let mut streams = lock(&self.streams);
        let stream = streams.entry(tenant_id).or_default();
        let actual = head(stream);
        let ids: HashSet<Uuid> = events.iter().map(|event| event.id).collect();
        let stored: Vec<u64> = (1..)
            .zip(stream.iter())
            .filter(|(_, event)| ids.contains(&event.id))
            .map(|(position, _)| position)
            .collect();
        let (stored_count, of) = (head_of(stored.len()), head_of(events.len()));
        let result = match expected {
            Some(expected) if expected != actual => Err(StoreError::Conflict { expected, actual }),
            None if stored_count == of && of > 0 => Ok(stored.last().copied().unwrap_or(actual)),
            _ if stored_count > 0 => Err(StoreError::PartlyStored {
                stored: stored_count,
                of,
            }),
            // One id twice in the batch: appending it would store the id twice (the
            // PostgreSQL store's unique index refuses it the same way).
            _ if ids.len() != events.len() => Err(StoreError::unavailable(
                "the batch carries an event id more than once; event ids are unique in a \
                 tenant's stream",
            )),
            _ => {
                stream.extend_from_slice(events);
                Ok(head(stream))
            }
        };
        ready(result)
    }

    fn read(
        &self,
        tenant_id: Uuid,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredEvent>, StoreError>> + Send {
        let streams = lock(&self.streams);
        let events = streams
            .get(&tenant_id)
            .map(|stream| stored(stream, after, limit))
            .unwrap_or_default();
        ready(Ok(events))
    }

    fn position(&self, tenant_id: Uuid) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let position = lock(&self.streams)
            .get(&tenant_id)
            .map_or(0, |stream| head(stream));
        ready(Ok(position))
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(Ok(()))
    }
}

/// A routing table in memory. It refuses the writes the PostgreSQL table refuses, with
/// the same errors (see [`RoutingRepository`]): a `put` the state machine does not allow
/// over the stored route, or one taking another migration's route, and a
/// `compare_and_set` that is not a transition.
#[derive(Debug, Clone, Default)]
pub struct InMemoryRoutingRepository {
    routes: Arc<Mutex<HashMap<Uuid, TenantRoute>>>,
}

impl InMemoryRoutingRepository {
    /// An empty table.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The tenant's route now (a synchronous read for tests and examples).
    #[must_use]
    pub fn route(&self, tenant_id: Uuid) -> Option<TenantRoute> {
        lock(&self.routes).get(&tenant_id).cloned()
    }
}

impl RoutingRepository for InMemoryRoutingRepository {
    fn get(
        &self,
        tenant_id: Uuid,
    ) -> impl Future<Output = Result<Option<TenantRoute>, RepositoryError>> + Send {
        ready(Ok(self.route(tenant_id)))
    }

    fn put(&self, route: TenantRoute) -> impl Future<Output = Result<(), RepositoryError>> + Send {
        const WHAT: &str = "routing update";
        if let Some(words) = nul_refusal(route_text(&route)) {
            return ready(Err(RepositoryError::new(WHAT, words)));
        }
        let mut routes = lock(&self.routes);
        if let Some(stored) = routes.get(&route.tenant_id)
            && !route.may_replace(stored)
        {
            // In the PostgreSQL table's words.
            let words = format!(
                "refused by the database: tenant {}'s route is `{}` (migration {:?}); \
                 `{}` for migration {:?} cannot be written over it",
                route.tenant_id, stored.state, stored.migration_id, route.state, route.migration_id
            );
            return ready(Err(RepositoryError::new(WHAT, words)));
        }
        routes.insert(route.tenant_id, route);
        ready(Ok(()))
    }

    fn compare_and_set(
        &self,
        expected: &TenantRoute,
        next: TenantRoute,
    ) -> impl Future<Output = Result<bool, RepositoryError>> + Send {
        if let Err(refused) = TenantRoute::check_compare_and_set(expected, &next) {
            return ready(Err(refused));
        }
        if let Some(words) = nul_refusal(route_text(&next).chain(route_text(expected))) {
            return ready(Err(RepositoryError::new("routing compare-and-set", words)));
        }
        let mut routes = lock(&self.routes);
        let replaced = match routes.get_mut(&next.tenant_id) {
            Some(stored) if stored == expected => {
                *stored = next;
                true
            }
            _ => false,
        };
        ready(Ok(replaced))
    }
}

/// Migration records in memory. They refuse the saves the PostgreSQL records refuse, with
/// the same errors (see [`MigrationRepository`]): a record that leaves its stored phase
/// other than by a transition of [`Phase`](crate::Phase)'s machine, text holding a NUL
/// byte, a time before PostgreSQL's `timestamptz` begins.
#[derive(Debug, Clone, Default)]
pub struct InMemoryMigrationRepository {
    migrations: Arc<Mutex<HashMap<Uuid, Migration>>>,
}

impl InMemoryMigrationRepository {
    /// No records.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl MigrationRepository for InMemoryMigrationRepository {
    fn get(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<Option<Migration>, RepositoryError>> + Send {
        ready(Ok(lock(&self.migrations).get(&id).cloned()))
    }

    fn save(
        &self,
        migration: &Migration,
    ) -> impl Future<Output = Result<(), RepositoryError>> + Send {
        const WHAT: &str = "migration save";
        let text = [
            ("source store id", migration.source_store_id.as_str()),
            ("target store id", migration.target_store_id.as_str()),
            ("last error", migration.last_error.as_deref().unwrap_or("")),
        ];
        let times = [
            ("created_at", migration.created_at),
            ("updated_at", migration.updated_at),
        ];
        if let Some(words) = nul_refusal(text).or_else(|| time_refusal(times)) {
            return ready(Err(RepositoryError::new(WHAT, words)));
        }
        let mut migrations = lock(&self.migrations);
        if let Some(stored) = migrations.get(&migration.id)
            && !migration.phase.may_replace(stored.phase)
        {
            // In the PostgreSQL records' words.
            let words = format!(
                "refused by the database: migration {} is `{}`; `{}` cannot follow it",
                migration.id, stored.phase, migration.phase
            );
            return ready(Err(RepositoryError::new(WHAT, words)));
        }
        migrations.insert(migration.id, migration.as_stored());
        ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_are_windows_of_the_stream_with_positions() {
        let store = InMemoryEventStore::new();
        let tenant = Uuid::new_v4();
        let events: Vec<_> = (0..5).map(|i| Event::new("E", vec![i])).collect();
        assert_eq!(store.append(tenant, Some(0), &events).await.unwrap(), 5);
        let window = store.read(tenant, 1, 2).await.unwrap();
        let positions: Vec<_> = window.iter().map(|e| e.position).collect();
        assert_eq!(positions, [2, 3]);
        assert_eq!(window[0].event, events[1]);
        assert!(store.read(tenant, 5, 10).await.unwrap().is_empty());
        assert!(store.read(tenant, 99, 10).await.unwrap().is_empty());
        assert!(store.read(Uuid::new_v4(), 0, 10).await.unwrap().is_empty());
        assert_eq!(store.position(Uuid::new_v4()).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_conditional_append_at_the_wrong_head_appends_nothing() {
        let store = InMemoryEventStore::new();
        let tenant = Uuid::new_v4();
        store
            .append(tenant, None, &[Event::new("A", "")])
            .await
            .unwrap();
        let error = store
            .append(tenant, Some(0), &[Event::new("B", "")])
            .await
            .unwrap_err();
        assert!(matches!(
            error,
            StoreError::Conflict {
                expected: 0,
                actual: 1
            }
        ));
        assert_eq!(store.events(tenant).len(), 1);
    }

    #[tokio::test]
    async fn appending_events_already_stored_lands_them_once() {
        let store = InMemoryEventStore::new();
        let tenant = Uuid::new_v4();
        let (a, b) = (Event::new("A", ""), Event::new("B", ""));
        let both = [a.clone(), b.clone()];
        assert_eq!(store.append(tenant, None, &both).await.unwrap(), 2);
        store
            .append(tenant, None, &[Event::new("C", "")])
            .await
            .unwrap();
        // A retry of the whole batch: nothing appended, the batch's position answered.
        assert_eq!(store.append(tenant, None, &both).await.unwrap(), 2);
        let partly = store
            .append(tenant, None, &[b, Event::new("D", "")])
            .await
            .unwrap_err();
        assert!(matches!(
            partly,
            StoreError::PartlyStored { stored: 1, of: 2 }
        ));
        let conditional = store.append(tenant, Some(3), &[a]).await.unwrap_err();
        assert!(matches!(
            conditional,
            StoreError::PartlyStored { stored: 1, of: 1 }
        ));
        assert_eq!(store.events(tenant).len(), 3);
    }

    /// Event ids are unique in a tenant's stream (the port says so, and the PostgreSQL
    /// store's unique index refuses it): a batch that carries one id twice is refused
    /// and appends nothing.
    #[tokio::test]
    async fn a_batch_carrying_one_event_id_twice_is_refused() {
        let store = InMemoryEventStore::new();
        let tenant = Uuid::new_v4();
        let a = Event::new("A", "");
        let twice = [a.clone(), a.clone()];
        assert!(store.append(tenant, None, &twice).await.is_err());
        assert!(store.append(tenant, Some(0), &twice).await.is_err());
        assert!(store.events(tenant).is_empty());
        assert_eq!(store.append(tenant, None, &[a]).await.unwrap(), 1);
    }

    /// The PostgreSQL adapters cannot store text holding a NUL byte (the server refuses
    /// it), so the in-memory ports refuse it too, with the same kind of error, and
    /// write nothing: a test on memory must not pass with inputs production refuses.
    #[tokio::test]
    async fn text_with_a_nul_byte_is_refused_as_postgresql_refuses_it() {
        let nul = "0x00";
        let store = InMemoryEventStore::new();
        let tenant = Uuid::new_v4();
        let error = store
            .append(tenant, None, &[Event::new("Order\0Placed", "")])
            .await
            .unwrap_err();
        assert!(
            matches!(error, StoreError::Unavailable { .. }) && error.to_string().contains(nul),
            "{error}"
        );
        assert!(store.events(tenant).is_empty());
        // The payload is bytes: a NUL byte there is fine.
        let fine = Event::new("OrderPlaced", b"a\0b".to_vec());
        assert_eq!(store.append(tenant, None, &[fine]).await.unwrap(), 1);

        let routing = InMemoryRoutingRepository::new();
        let error = routing
            .put(TenantRoute::normal(tenant, "sha\0red"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains(nul), "{error}");
        assert_eq!(routing.route(tenant), None);
        let normal = TenantRoute::normal(tenant, "shared");
        routing.put(normal.clone()).await.unwrap();
        let error = routing
            .compare_and_set(&normal, TenantRoute::normal(tenant, "dedi\0cated"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains(nul), "{error}");
        let error = routing
            .compare_and_set(&TenantRoute::normal(tenant, "sha\0red"), normal.clone())
            .await
            .unwrap_err();
        assert!(error.to_string().contains(nul), "{error}");
        assert_eq!(routing.route(tenant), Some(normal));

        let migrations = InMemoryMigrationRepository::new();
        let now = time::OffsetDateTime::now_utc();
        let record = Migration {
            id: Uuid::new_v4(),
            tenant_id: tenant,
            source_store_id: "shared".into(),
            target_store_id: "dedi\0cated".into(),
            phase: crate::Phase::Pending,
            events_copied: 0,
            created_at: now,
            updated_at: now,
            last_error: None,
        };
        let error = migrations.save(&record).await.unwrap_err();
        assert!(error.to_string().contains(nul), "{error}");
        let with_error = Migration {
            target_store_id: "dedicated".into(),
            last_error: Some("bad\0words".into()),
            ..record.clone()
        };
        let error = migrations.save(&with_error).await.unwrap_err();
        assert!(error.to_string().contains(nul), "{error}");
        assert_eq!(migrations.get(record.id).await.unwrap(), None);
    }
}
