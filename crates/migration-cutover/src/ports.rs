//! What the migration touches, as small traits: event stores, the routing table, the
//! migration records, and the per-tenant write pause.

use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use locks_port::BoxError;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::{Phase, RoutingState};

/// The name under which a store is registered (`"shared-eu-1"`, `"dedicated-acme"`).
///
/// Any text but a NUL byte: the routing and migration repositories refuse a route or
/// record naming a store whose id holds one (PostgreSQL's `text` cannot hold it, and the
/// in-memory repositories refuse it the same way), with a [`RepositoryError`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreId(String);

impl StoreId {
    /// The id `name`.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// The id as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StoreId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for StoreId {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl From<String> for StoreId {
    fn from(name: String) -> Self {
        Self(name)
    }
}

impl Borrow<str> for StoreId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// An event to append: an id that stays the same in every store it is copied to, a
/// type name and an opaque payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Event {
    /// The event's identity, kept by copies.
    pub id: Uuid,
    /// The event type (`"OrderPlaced"`). Any text but a NUL byte: an append of a kind
    /// holding one is refused ([`StoreError::Unavailable`], nothing appended) by every
    /// store of this workspace, as PostgreSQL's `text` cannot hold it. The payload is
    /// bytes and may hold anything.
    pub kind: String,
    /// The serialized body.
    pub payload: Vec<u8>,
}

impl Event {
    /// A new event with a random id.
    #[must_use]
    pub fn new(kind: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            id: Uuid::new_v4(),
            kind: kind.into(),
            payload: payload.into(),
        }
    }
}

/// An event as a store holds it: its position in the tenant's stream (1 for the
/// first event) and the event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoredEvent {
    /// The position in the tenant's stream in this store, from 1.
    pub position: u64,
    /// The event.
    pub event: Event,
}

/// A store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A conditional append found the stream somewhere else: someone appended first.
    /// Re-read the position and decide again.
    #[error("expected the tenant's stream at position {expected}, found it at {actual}")]
    Conflict {
        /// The position the append expected.
        expected: u64,
        /// The position the stream was at.
        actual: u64,
    },
    /// The store did not answer or refused the operation. Retry later, unless it
    /// refused the input itself (an event kind holding a NUL byte, an event id twice in
    /// one batch): such an append fails every time.
    #[error("store unavailable: {source}")]
    Unavailable {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The append was sent and its commit asked for, but the answer never came (the
    /// connection broke): the events **may or may not** be stored. Retry the append with
    /// the same events (the same ids): an unconditional append of events that are all
    /// stored already is a no-op that answers with their position, so the retry lands
    /// them exactly once.
    #[error(
        "the outcome of the commit is uncertain (the events may or may not be stored): {source}"
    )]
    CommitUncertain {
        /// The backend's error (the broken connection).
        #[source]
        source: BoxError,
    },
    /// Some, not all, of the events of an append are stored already: the batch overlaps
    /// another batch. Nothing was appended; append only the events that are missing.
    #[error("{stored} of the {of} events are stored already; nothing was appended")]
    PartlyStored {
        /// How many of the events are stored already.
        stored: u64,
        /// How many events the append carried.
        of: u64,
    },
}

impl StoreError {
    /// An [`Unavailable`](StoreError::Unavailable) error caused by `source`.
    #[must_use]
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            source: source.into(),
        }
    }
}

/// An event store, seen per tenant: each tenant has one ordered stream of events
/// whose positions start at 1 and have no gaps.
///
/// The migration copies a tenant's stream position for position, so source and
/// target agree on positions and the lag is the difference of the two heads.
pub trait EventStore: Send + Sync {
    /// Appends `events` to the tenant's stream and returns the new head position.
    ///
    /// With `expected = Some(p)`, appends only if the head is `p` now, atomically;
    /// otherwise fails with [`StoreError::Conflict`] and appends nothing.
    ///
    /// Event ids are unique in a tenant's stream. An unconditional append (`expected =
    /// None`) whose events are *all* stored already appends nothing and returns the
    /// position of the last of them: retrying an append whose outcome was uncertain
    /// lands its events exactly once.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] as above; [`StoreError::PartlyStored`] when only some of
    /// the events are stored already (or, for a conditional append, any of them);
    /// [`StoreError::CommitUncertain`] when the answer to the commit was lost;
    /// [`StoreError::Unavailable`] on another backend failure.
    fn append(
        &self,
        tenant_id: Uuid,
        expected: Option<u64>,
        events: &[Event],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Up to `limit` events of the tenant's stream after position `after`, in order.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] on a backend failure.
    fn read(
        &self,
        tenant_id: Uuid,
        after: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredEvent>, StoreError>> + Send;

    /// The head position of the tenant's stream (0 when it is empty).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] on a backend failure.
    fn position(&self, tenant_id: Uuid) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Whether the store answers (the cutover's target health check).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when it does not.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A repository (routing table, migration records, write pause) failed. Retry later.
#[derive(Debug, thiserror::Error)]
#[error("{what} failed: {source}")]
pub struct RepositoryError {
    what: String,
    #[source]
    source: BoxError,
}

impl RepositoryError {
    /// `what` (the operation, `"routing update"`) failed because of `source`.
    #[must_use]
    pub fn new(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            what: what.into(),
            source: source.into(),
        }
    }

    /// The operation that failed.
    #[must_use]
    pub fn what(&self) -> &str {
        &self.what
    }
}

/// Where a tenant's writes go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantRoute {
    /// The tenant.
    pub tenant_id: Uuid,
    /// The store that holds the tenant's stream: the source until the cutover, the
    /// target after it.
    pub store_id: StoreId,
    /// How writes are routed.
    pub state: RoutingState,
    /// The migration under way, if any.
    pub migration_id: Option<Uuid>,
    /// The store writes are mirrored to in [`RoutingState::DualWrite`].
    pub target_store_id: Option<StoreId>,
}

impl TenantRoute {
    /// A tenant served by `store_id`, no migration.
    #[must_use]
    pub fn normal(tenant_id: Uuid, store_id: impl Into<StoreId>) -> Self {
        Self {
            tenant_id,
            store_id: store_id.into(),
            state: RoutingState::Normal,
            migration_id: None,
            target_store_id: None,
        }
    }
}

impl TenantRoute {
    /// The route a writer restores when it finds this route `cutover_paused` while it
    /// holds a write permit of a [`WritePause`] that covers every instance (so no live
    /// cutover holds the pause: the cutover that wrote `cutover_paused` died, or was
    /// dropped): `dual_write` on the same source store, for the same migration and
    /// target. Write it with [`RoutingRepository::compare_and_set`] from `self`.
    ///
    /// `None` unless this route is `cutover_paused` on its source (a route that names a
    /// target other than its store). A `cutover_paused` route already on the target is
    /// half-written (a flip in two writes, which this crate never makes): only
    /// `cutover` resolves it, by completing the flip.
    ///
    /// ```
    /// use migration_cutover::{RoutingState, StoreId, TenantRoute};
    /// use migration_cutover::uuid::Uuid;
    ///
    /// let paused = TenantRoute {
    ///     state: RoutingState::CutoverPaused,
    ///     migration_id: Some(Uuid::nil()),
    ///     target_store_id: Some(StoreId::new("dedicated")),
    ///     ..TenantRoute::normal(Uuid::nil(), "shared")
    /// };
    /// let resumed = paused.abandoned_pause_rollback().unwrap();
    /// assert_eq!((resumed.store_id.as_str(), resumed.state), ("shared", RoutingState::DualWrite));
    /// let half_flipped = TenantRoute { store_id: StoreId::new("dedicated"), ..paused };
    /// assert!(half_flipped.abandoned_pause_rollback().is_none());
    /// ```
    #[must_use]
    pub fn abandoned_pause_rollback(&self) -> Option<TenantRoute> {
        let target = self.target_store_id.as_ref()?;
        if self.state != RoutingState::CutoverPaused || *target == self.store_id {
            return None;
        }
        Some(TenantRoute {
            state: RoutingState::DualWrite,
            ..self.clone()
        })
    }

    /// Whether [`RoutingRepository::put`] writes `self` over `stored`, the tenant's route
    /// now: `self` keeps `stored`'s state or may follow it ([`RoutingState`]'s machine),
    /// and does not take a route marked by another migration (unless that route is
    /// `migrated`, or either carries no migration).
    pub(crate) fn may_replace(&self, stored: &TenantRoute) -> bool {
        let state = self.state.may_replace(stored.state);
        let migration = match (stored.migration_id, self.migration_id) {
            (Some(marked), Some(by)) => marked == by || stored.state == RoutingState::Migrated,
            _ => true,
        };
        state && migration
    }

    /// The checks of [`RoutingRepository::compare_and_set`] from `expected` to `next`
    /// that come before the stored route is read, which every routing repository of this
    /// workspace makes: both routes are of one tenant, and `next` keeps `expected`'s
    /// state or may follow it ([`RoutingState`]'s machine).
    ///
    /// ```
    /// use migration_cutover::{RoutingState, TenantRoute, TransitionError};
    /// use migration_cutover::uuid::Uuid;
    ///
    /// let normal = TenantRoute::normal(Uuid::nil(), "shared");
    /// let migrated = TenantRoute { state: RoutingState::Migrated, ..normal.clone() };
    /// assert!(TenantRoute::check_compare_and_set(&migrated, &normal).is_ok());
    /// let error = TenantRoute::check_compare_and_set(&normal, &migrated).unwrap_err();
    /// assert_eq!(error.what(), "routing compare-and-set");
    /// let source = std::error::Error::source(&error).unwrap();
    /// assert_eq!(
    ///     source.downcast_ref::<TransitionError>(),
    ///     Some(&TransitionError::Routing { from: RoutingState::Normal, to: RoutingState::Migrated })
    /// );
    /// ```
    ///
    /// # Errors
    /// A [`RepositoryError`] of `"routing compare-and-set"` when a check fails: its
    /// source is the [`TransitionError`](crate::TransitionError) for a move the machine
    /// does not allow.
    pub fn check_compare_and_set(
        expected: &TenantRoute,
        next: &TenantRoute,
    ) -> Result<(), RepositoryError> {
        const WHAT: &str = "routing compare-and-set";
        if expected.tenant_id != next.tenant_id {
            return Err(RepositoryError::new(
                WHAT,
                "the expected and the next route are of different tenants",
            ));
        }
        if expected.state != next.state {
            expected
                .state
                .transition_to(next.state)
                .map_err(|error| RepositoryError::new(WHAT, error))?;
        }
        Ok(())
    }
}

/// The routing table: tenant → store and routing state. Whole-record reads and writes.
///
/// Every write follows [`RoutingState`]'s machine, on every implementation of this
/// workspace alike (the in-memory table refuses what the PostgreSQL one does, with the
/// same errors; `migration_cutover::testing::routing_contract`, feature `testing`,
/// checks a table against it).
pub trait RoutingRepository: Send + Sync {
    /// The tenant's route, `None` when it has none.
    ///
    /// # Errors
    /// [`RepositoryError`] on a backend failure.
    fn get(
        &self,
        tenant_id: Uuid,
    ) -> impl Future<Output = Result<Option<TenantRoute>, RepositoryError>> + Send;

    /// Stores `route`: inserts it (in any state) when the tenant has no route, else
    /// replaces the tenant's route if `route` keeps its state or may follow it, and does
    /// not take a route marked by another migration (unless that route is `migrated`, or
    /// either carries no migration). So a stale instance cannot move a `migrated` route
    /// back to `cutover_paused`, and two migrations of one tenant cannot both mark it.
    ///
    /// # Errors
    /// A [`RepositoryError`] of `"routing update"` naming the stored state when the route
    /// may not be replaced so, or on a backend failure; the route is then unchanged.
    fn put(&self, route: TenantRoute) -> impl Future<Output = Result<(), RepositoryError>> + Send;

    /// Replaces the tenant's route by `next` only if it is exactly `expected` now, in
    /// one atomic step (a compare-and-set on the whole route). Returns whether it was
    /// replaced: `false` means the route is something else now (another instance moved
    /// it first); read it again and decide.
    ///
    /// Every routing transition of the cutover (`cutover_paused`, the flip, the
    /// rollback) and a writer's recovery of an abandoned pause go through this, so two
    /// instances that race cannot both move the route, and no transition is half-written.
    ///
    /// `next` must keep `expected`'s state or may follow it, and be of the same tenant:
    /// that is checked first ([`TenantRoute::check_compare_and_set`]), whatever the
    /// stored route.
    ///
    /// # Errors
    /// A [`RepositoryError`] of `"routing compare-and-set"` when `expected → next` fails
    /// those checks (its source the [`TransitionError`](crate::TransitionError) for a move
    /// the machine does not allow), or on a backend failure; the route is then unchanged
    /// (or, if the answer was lost, either unchanged or `next`: read it again).
    fn compare_and_set(
        &self,
        expected: &TenantRoute,
        next: TenantRoute,
    ) -> impl Future<Output = Result<bool, RepositoryError>> + Send;
}

/// The record of one migration of one tenant from a source store to a target store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Migration {
    /// The migration's id.
    pub id: Uuid,
    /// The tenant being moved.
    pub tenant_id: Uuid,
    /// Where the tenant's events are now.
    pub source_store_id: StoreId,
    /// Where they go.
    pub target_store_id: StoreId,
    /// How far it got.
    pub phase: Phase,
    /// Events this migration copied to the target (bulk copy, catch-ups, final sync).
    pub events_copied: u64,
    /// When it was started (UTC). Not before 4714-11-24 00:00 UTC BC: a repository
    /// refuses a record that names an earlier time, as PostgreSQL's `timestamptz` does.
    pub created_at: OffsetDateTime,
    /// When it last changed (UTC); not before 4714-11-24 BC either.
    pub updated_at: OffsetDateTime,
    /// The last failure, as text, if any (without a NUL byte, as the store ids: a
    /// repository refuses a record holding one).
    pub last_error: Option<String>,
}

impl Migration {
    /// This record as every [`MigrationRepository`] of this workspace keeps it, and
    /// [`get`](MigrationRepository::get) reads it back: the times in UTC and to the
    /// microsecond (PostgreSQL's `timestamptz`, as [`locks_port::stored_time`] says),
    /// `events_copied` at most `i64::MAX` (a `bigint`). So a test that saves a
    /// record stamped with `OffsetDateTime::now_utc()` compares what it reads back with
    /// this, on the in-memory records as on PostgreSQL.
    ///
    /// ```
    /// use migration_cutover::time::{Date, Month, Time, UtcOffset};
    /// # use migration_cutover::{Migration, Phase, uuid::Uuid};
    ///
    /// let day = Date::from_calendar_date(2026, Month::December, 7).unwrap();
    /// let at = |nano| day.with_time(Time::from_hms_nano(20, 0, 0, nano).unwrap());
    /// let plus_two = UtcOffset::from_hms(2, 0, 0).unwrap();
    /// # let record = |at, events_copied| Migration {
    /// #     id: Uuid::nil(), tenant_id: Uuid::nil(), source_store_id: "shared".into(),
    /// #     target_store_id: "own".into(), phase: Phase::Pending, events_copied,
    /// #     created_at: at, updated_at: at, last_error: None,
    /// # };
    /// let saved = record(at(123_456_789).assume_offset(plus_two), u64::MAX);
    /// let stored = saved.as_stored();
    /// assert_eq!(stored.created_at, at(123_456_000).assume_offset(plus_two));
    /// assert_eq!(stored.created_at.offset(), UtcOffset::UTC);
    /// assert_eq!(stored.events_copied, i64::MAX.unsigned_abs());
    /// ```
    #[must_use]
    pub fn as_stored(&self) -> Self {
        let stored = locks_port::stored_time;
        Self {
            events_copied: self.events_copied.min(i64::MAX.unsigned_abs()),
            created_at: stored(self.created_at),
            updated_at: stored(self.updated_at),
            ..self.clone()
        }
    }
}

/// Where migration records are kept, shared by every coordinator instance.
///
/// Every save follows [`Phase`]'s machine, on every implementation of this workspace
/// alike (the in-memory records refuse what the PostgreSQL ones do, with the same errors;
/// `migration_cutover::testing::migration_contract`, feature `testing`, checks a
/// repository against it).
pub trait MigrationRepository: Send + Sync {
    /// The migration `id`, `None` when there is no such record.
    ///
    /// # Errors
    /// [`RepositoryError`] on a backend failure.
    fn get(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<Option<Migration>, RepositoryError>> + Send;

    /// Stores `migration`: inserts it (in any phase) when no record has its id, else
    /// replaces the record if `migration` keeps its phase or may follow it
    /// ([`Phase::may_replace`]). So a stale instance cannot move a `completed`, `aborted`
    /// or `failed` migration anywhere, nor a `cutover` one back to `bulk_copy`.
    ///
    /// Nothing else of a stored record is checked: a save may change its tenant, store
    /// ids or creation time, and two records may move one tenant at once (the coordinator
    /// refuses that through the route's mark:
    /// [`MigrationError::TenantBusy`](crate::MigrationError::TenantBusy)).
    ///
    /// # Errors
    /// A [`RepositoryError`] of `"migration save"`, and the record unchanged (nothing
    /// inserted):
    /// - naming the stored phase when `migration`'s phase may not replace it;
    /// - when a store id or the last error holds a NUL byte (the words hold `0x00`), or
    ///   `created_at` or `updated_at` falls before 4714-11-24 00:00 UTC BC, where
    ///   PostgreSQL's `timestamptz` begins (`timestamp out of range`);
    /// - on a backend failure.
    fn save(
        &self,
        migration: &Migration,
    ) -> impl Future<Output = Result<(), RepositoryError>> + Send;
}

/// A write gave up waiting for its tenant's writes to be resumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "writes to tenant {tenant_id} are paused for a cutover; gave up after {} ms",
    .waited.as_millis()
)]
pub struct WritesPaused {
    /// The tenant.
    pub tenant_id: Uuid,
    /// How long the write waited.
    pub waited: Duration,
}

/// Holds a tenant's writes back for the few hundred milliseconds of a cutover.
///
/// Writers ask for a permit before writing and hold it for the whole write; a pause
/// stops new permits and can wait for the permits already out to come back, so that
/// once it has drained no write is half-done.
///
/// The pause must cover every instance that writes to or cuts over the tenant, and end
/// with the cutover that holds it (a dropped guard, a dead process): a writer holding a
/// permit takes that as proof that no cutover is in its paused window, and rolls back a
/// `cutover_paused` route it finds (see [`TenantRoute::abandoned_pause_rollback`]).
pub trait WritePause: Send + Sync {
    /// Marks one admitted write; the write is finished when it is dropped.
    type Permit: Send;
    /// A pause in force; resumes writes when dropped.
    type Guard: PauseGuard;

    /// Pauses the tenant's writes: from now on [`admit`](WritePause::admit) waits.
    /// Pauses nest: writes resume when every guard is gone.
    ///
    /// # Errors
    /// [`RepositoryError`] when the pause could not be put in force (nothing changed).
    ///
    /// # Cancel safety
    /// The pause is in force only once the guard is returned; dropping the future
    /// earlier leaves writes running.
    fn pause(
        &self,
        tenant_id: Uuid,
    ) -> impl Future<Output = Result<Self::Guard, RepositoryError>> + Send;

    /// Admits one write to the tenant, waiting while its writes are paused, up to
    /// `timeout` (a zero timeout admits only if not paused now).
    ///
    /// # Errors
    /// [`WritesPaused`] when the pause outlasted `timeout`.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait admits nothing.
    fn admit(
        &self,
        tenant_id: Uuid,
        timeout: Duration,
    ) -> impl Future<Output = Result<Self::Permit, WritesPaused>> + Send;

    /// Whether the tenant's writes are paused now.
    fn is_paused(&self, tenant_id: Uuid) -> bool;
}

/// A pause in force for one tenant. Dropping it resumes writes (synchronously, for
/// the in-memory pause); [`resume`](PauseGuard::resume) does so explicitly.
pub trait PauseGuard: Send + Sync {
    /// The paused tenant.
    fn tenant_id(&self) -> Uuid;

    /// Completes once no write admitted before the pause is still running.
    ///
    /// # Cancel safety
    /// Cancel safe: only waits.
    fn drained(&self) -> impl Future<Output = ()> + Send;

    /// Ends this pause.
    ///
    /// # Cancel safety
    /// The pause ends even if the future is dropped (the guard is dropped with it).
    fn resume(self) -> impl Future<Output = ()> + Send;
}
