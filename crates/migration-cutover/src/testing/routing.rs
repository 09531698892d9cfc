//! The routing table's contract, one case that every [`RoutingRepository`] runs: the
//! in-memory table in this crate's tests, the PostgreSQL one in
//! `migration-cutover-postgres`'s. A test on the in-memory table sees the refusals
//! production makes.

use std::error::Error as _;

use uuid::Uuid;

use super::contract::{Broken, Case, Expect, describe};
use crate::{RepositoryError, RoutingRepository, RoutingState, TenantRoute, TransitionError};

/// A route of `tenant` in `state` on the store `shared`, marked by `migration` (whose
/// target is `dedicated`).
fn route(tenant: Uuid, state: RoutingState, migration: Option<Uuid>) -> TenantRoute {
    TenantRoute {
        state,
        migration_id: migration,
        target_store_id: migration.map(|_| "dedicated".into()),
        ..TenantRoute::normal(tenant, "shared")
    }
}

/// A state and the migration that marks a route in it.
type Marked = (RoutingState, Option<Uuid>);

impl Case<TenantRoute> {
    /// A new tenant whose route is `from`, to be written over by `to`.
    fn new(name: String, (from, by): Marked, (to, next_by): Marked, expect: Expect) -> Self {
        let tenant = Uuid::new_v4();
        Self {
            name,
            stored: route(tenant, from, by),
            next: route(tenant, to, next_by),
            expect,
        }
    }

    /// Stores the route `stored` with `put` (a tenant with no route takes a route in any
    /// state).
    async fn store<R: RoutingRepository>(&self, routing: &R) {
        let stored = &self.stored;
        routing
            .put(stored.clone())
            .await
            .unwrap_or_else(|error| panic!("a new tenant's route {stored:?}: {error}"));
    }

    /// `put` of `next` over `stored`.
    async fn put<R: RoutingRepository>(&self, routing: &R, broken: &mut Broken) {
        self.store(routing).await;
        let answer = routing.put(self.next.clone()).await.map(|()| true);
        let from = self.stored.state;
        let refused = |error: &RepositoryError| {
            error.what() == "routing update" && error.to_string().contains(&format!("`{from}`"))
        };
        let now = self.now(routing).await;
        self.answered(broken, answer, now, refused);
    }

    /// `compare_and_set` to `next` from `stored` as if it were in state `expected`.
    async fn compare_and_set<R: RoutingRepository>(
        &self,
        routing: &R,
        broken: &mut Broken,
        expected: RoutingState,
    ) {
        self.store(routing).await;
        let from = TenantRoute {
            state: expected,
            ..self.stored.clone()
        };
        let answer = routing.compare_and_set(&from, self.next.clone()).await;
        let to = self.next.state;
        let refused = |error: &RepositoryError| {
            let transition = error.source().and_then(|source| source.downcast_ref());
            error.what() == "routing compare-and-set"
                && transition == Some(&TransitionError::Routing { from: expected, to })
        };
        let now = self.now(routing).await;
        self.answered(broken, answer, now, refused);
    }

    /// What the write left: the tenant's route now.
    async fn now<R: RoutingRepository>(&self, routing: &R) -> Option<TenantRoute> {
        routing
            .get(self.next.tenant_id)
            .await
            .expect("routing read")
    }
}

/// The routing table's contract on `routing` (fresh tenants, so a shared table serves):
///
/// - a tenant with no route takes a route in any state;
/// - [`put`](RoutingRepository::put) writes a route over the stored one only if it keeps
///   the state or the [`RoutingState`] machine lets it follow, and only if it does not
///   take a route marked by another migration (unless that route is `migrated`); else a
///   [`RepositoryError`] of `"routing update"` naming the stored state, route unchanged;
/// - [`compare_and_set`](RoutingRepository::compare_and_set) from `expected` to `next`
///   of another state than the machine lets follow, or of two tenants, is a
///   [`RepositoryError`] of `"routing compare-and-set"` (its source the
///   [`TransitionError`]), whatever the stored route, route unchanged; a legal one
///   answers whether the stored route was `expected`.
///
/// # Panics
/// Listing every case that broke.
pub async fn routing_contract<R: RoutingRepository>(routing: &R) {
    let mut broken = Broken::default();
    for from in RoutingState::ALL {
        for to in RoutingState::ALL {
            let migration = Some(Uuid::new_v4());
            let expect = if from == to || from.can_transition_to(to) {
                Expect::Written
            } else {
                Expect::Refused
            };
            let put = format!("put `{to}` over `{from}`");
            let case = Case::new(put, (from, migration), (to, migration), expect);
            case.put(routing, &mut broken).await;
            let set = format!("compare-and-set `{from}` -> `{to}`");
            let case = Case::new(set, (from, migration), (to, migration), expect);
            case.compare_and_set(routing, &mut broken, from).await;
        }
    }
    for case in migration_cases() {
        case.put(routing, &mut broken).await;
    }
    compare_and_set_checks_before_it_reads(routing, &mut broken).await;
    broken.assert_none("routing");
}

/// `put` over a route marked by a migration, or by none.
fn migration_cases() -> Vec<Case<TenantRoute>> {
    use RoutingState::{BulkCopy, DualWrite, Migrated, Normal};
    let (a, b) = (Some(Uuid::new_v4()), Some(Uuid::new_v4()));
    let (written, refused) = (Expect::Written, Expect::Refused);
    [
        (
            "another migration takes a marked route",
            (DualWrite, a),
            (Normal, b),
            refused,
        ),
        (
            "another migration takes a marked one",
            (Normal, a),
            (Normal, b),
            refused,
        ),
        (
            "the mark is cleared",
            (DualWrite, a),
            (Normal, None),
            written,
        ),
        (
            "an unmarked route is marked",
            (Normal, None),
            (BulkCopy, b),
            written,
        ),
        (
            "the next migration marks a migrated one",
            (Migrated, a),
            (Normal, b),
            written,
        ),
        (
            "the marking migration moves on",
            (Normal, a),
            (BulkCopy, a),
            written,
        ),
    ]
    .into_iter()
    .map(|(what, from, to, expect)| Case::new(format!("put: {what}"), from, to, expect))
    .collect()
}

/// `compare_and_set` refuses what is not a transition (or spans two tenants) whatever
/// the stored route, and answers `false` for a transition from a route not stored.
async fn compare_and_set_checks_before_it_reads<R: RoutingRepository>(
    routing: &R,
    broken: &mut Broken,
) {
    use RoutingState::{CutoverPaused, DualWrite, Migrated, Normal};
    let migration = Some(Uuid::new_v4());
    let (normal, paused) = ((Normal, migration), (CutoverPaused, migration));
    let name = "compare-and-set `migrated` -> `cutover_paused` over a `normal` route";
    let case = Case::new(name.to_owned(), normal, paused, Expect::Refused);
    case.compare_and_set(routing, broken, Migrated).await;
    let name = "compare-and-set `dual_write` -> `cutover_paused` over a `normal` route";
    let case = Case::new(name.to_owned(), normal, paused, Expect::Unchanged);
    case.compare_and_set(routing, broken, DualWrite).await;

    let name = "compare-and-set from another tenant's route";
    let case = Case::new(name.to_owned(), normal, normal, Expect::Refused);
    case.store(routing).await;
    let other = route(Uuid::new_v4(), Normal, migration);
    let answer = routing.compare_and_set(&other, case.next.clone()).await;
    let refused = |error: &RepositoryError| error.what() == "routing compare-and-set";
    let now = case.now(routing).await;
    case.answered(broken, answer, now, refused);

    let nobody = Uuid::new_v4();
    let (expected, next) = (
        route(nobody, DualWrite, migration),
        route(nobody, CutoverPaused, migration),
    );
    let answer = routing.compare_and_set(&expected, next).await;
    broken.check(matches!(answer, Ok(false)), || {
        let answer = describe(&answer);
        format!("compare-and-set of a tenant with no route: answered {answer}")
    });
}
