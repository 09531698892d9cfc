//! The routing table, shared by every instance, with the state machine checked in SQL.

use std::fmt;

use deadpool_postgres::Pool;
use locks_port::uuid::Uuid;
use migration_cutover::{RepositoryError, RoutingRepository, RoutingState, StoreId, TenantRoute};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::TableName;
use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::db::{DbFailure, Transaction, identity, repository_query};

/// A [`RoutingRepository`] on the fleet's `routes` table (see
/// [`install_fleet`](crate::install_fleet)), shared by every instance.
///
/// Every write is checked by the server as well as by the coordinator:
///
/// - [`put`](RoutingRepository::put) is an upsert whose `UPDATE` runs only
///   `WHERE state = ANY(states that may be followed by the new one)` (the
///   [`RoutingState`] machine, plus staying in the same state), so a stale instance
///   cannot, for example, move a `migrated` route back to `cutover_paused`; and a route
///   marked with one migration cannot be taken over by another unless it is `migrated`
///   or carries no migration, so two instances starting a migration of one tenant at once
///   cannot both mark it.
/// - [`transition`](Self::transition) is a compare-and-set (`UPDATE … WHERE state =
///   expected`): of two instances moving a state forward at once, exactly one does.
///
/// A refused write is a [`RepositoryError`] naming the stored state.
#[derive(Clone)]
pub struct PostgresRoutingRepository {
    pool: Pool,
    identity: Arc<OnceCell<String>>,
    table: TableName,
    get: String,
    put: String,
    transition: String,
    compare_and_set: String,
}

impl fmt::Debug for PostgresRoutingRepository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresRoutingRepository")
            .field("table", &self.table.to_string())
            .finish_non_exhaustive()
    }
}

fn routing_state(text: &str) -> Result<RoutingState, RepositoryError> {
    RoutingState::ALL
        .into_iter()
        .find(|state| state.as_str() == text)
        .ok_or_else(|| RepositoryError::new("routing read", format!("unknown state {text:?}")))
}

fn uuid(text: &str) -> Result<Uuid, RepositoryError> {
    Uuid::parse_str(text)
        .map_err(|error| RepositoryError::new("routing read", format!("id {text:?}: {error}")))
}

/// The states `next` may be written over ([`RoutingState::may_replace`]): itself and
/// every state that may be followed by it.
pub(crate) fn routing_predecessors(next: RoutingState) -> Vec<&'static str> {
    RoutingState::ALL
        .into_iter()
        .filter(|stored| next.may_replace(*stored))
        .map(RoutingState::as_str)
        .collect()
}

impl PostgresRoutingRepository {
    /// The repository on `table` through `pool` (no I/O).
    #[must_use]
    pub fn new(pool: Pool, table: TableName) -> Self {
        let t = table.quoted();
        let columns = "store_id, state, migration_id::text, target_store_id, tenant_id::text";
        Self {
            get: format!("SELECT {columns} FROM {t} WHERE tenant_id = $1::text::uuid"),
            put: format!(
                "INSERT INTO {t} AS r (tenant_id, store_id, state, migration_id, target_store_id)
                 VALUES ($1::text::uuid, $2, $3, $4::text::uuid, $5)
                 ON CONFLICT (tenant_id) DO UPDATE SET
                     store_id = EXCLUDED.store_id, state = EXCLUDED.state,
                     migration_id = EXCLUDED.migration_id,
                     target_store_id = EXCLUDED.target_store_id, updated_at = now()
                 WHERE r.state = ANY($6::text[])
                   AND (EXCLUDED.migration_id IS NULL OR r.migration_id IS NULL
                        OR r.migration_id = EXCLUDED.migration_id OR r.state = 'migrated')
                 RETURNING 1"
            ),
            transition: format!(
                "UPDATE {t} SET store_id = $2, state = $3, migration_id = $4::text::uuid,
                     target_store_id = $5, updated_at = now()
                 WHERE tenant_id = $1::text::uuid AND state = $6
                 RETURNING 1"
            ),
            compare_and_set: format!(
                "UPDATE {t} SET store_id = $2, state = $3, migration_id = $4::text::uuid,
                     target_store_id = $5, updated_at = now()
                 WHERE tenant_id = $1::text::uuid AND store_id = $6 AND state = $7
                   AND migration_id IS NOT DISTINCT FROM $8::text::uuid
                   AND target_store_id IS NOT DISTINCT FROM $9
                 RETURNING 1"
            ),
            pool,
            identity: Arc::new(OnceCell::new()),
            table,
        }
    }

    /// Which database the repository's pool reaches (see the store's).
    pub(crate) async fn identity(&self) -> Result<&str, DbFailure> {
        identity(&self.identity, &self.pool).await
    }

    /// The tenant's route, read inside `transaction` (on the same database), in a
    /// statement of its own so its snapshot is taken now.
    pub(crate) async fn get_in(
        &self,
        transaction: &Transaction,
        tenant_id: Uuid,
    ) -> Result<Option<TenantRoute>, RepositoryError> {
        const WHAT: &str = "routing read";
        let failed = |error| RepositoryError::new(WHAT, DbFailure::driver("", error));
        let client = transaction.client();
        let statement = client.prepare_cached(&self.get).await.map_err(failed)?;
        let tenant = tenant_id.hyphenated().to_string();
        let rows = client.query(&statement, &[&tenant]).await.map_err(failed)?;
        rows.first().map(Self::route).transpose()
    }

    /// [`compare_and_set`](RoutingRepository::compare_and_set) inside `transaction`
    /// (on the same database), which the caller commits: a write that finds an abandoned
    /// `cutover_paused` rolls it back in the transaction that appends, while it holds the
    /// shared write lock.
    pub(crate) async fn compare_and_set_in(
        &self,
        transaction: &Transaction,
        expected: &TenantRoute,
        next: &TenantRoute,
    ) -> Result<bool, RepositoryError> {
        let failed = |error| RepositoryError::new(CAS, DbFailure::driver("", error));
        TenantRoute::check_compare_and_set(expected, next)?;
        let client = transaction.client();
        let statement = client
            .prepare_cached(&self.compare_and_set)
            .await
            .map_err(failed)?;
        let values = CasValues::new(expected, next);
        let rows = client
            .query(&statement, &values.params())
            .await
            .map_err(failed)?;
        Ok(!rows.is_empty())
    }

    /// The table.
    #[must_use]
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Writes `next` only if the stored route is in state `from` now (and `from → next`
    /// is a transition of the state machine, or `from == next.state`). Returns whether
    /// it was written: `false` means another instance moved the route first (or the
    /// tenant has no route).
    ///
    /// # Errors
    /// [`RepositoryError`] when `from → next.state` is not a transition, or on a backend
    /// failure.
    pub async fn transition(
        &self,
        from: RoutingState,
        next: &TenantRoute,
    ) -> Result<bool, RepositoryError> {
        const WHAT: &str = "routing transition";
        if from != next.state {
            from.transition_to(next.state)
                .map_err(|error| RepositoryError::new(WHAT, error))?;
        }
        let (tenant, migration) = (
            next.tenant_id.hyphenated().to_string(),
            next.migration_id.map(|id| id.hyphenated().to_string()),
        );
        let target = next.target_store_id.as_ref().map(StoreId::as_str);
        let params: [&(dyn ToSql + Sync); 6] = [
            &tenant,
            &next.store_id.as_str(),
            &next.state.as_str(),
            &migration,
            &target,
            &from.as_str(),
        ];
        let rows = repository_query(&self.pool, WHAT, &self.transition, &params).await?;
        Ok(!rows.is_empty())
    }

    fn route(row: &Row) -> Result<TenantRoute, RepositoryError> {
        let migration: Option<&str> = row.get(2);
        let target: Option<String> = row.get(3);
        let tenant: &str = row.get(4);
        Ok(TenantRoute {
            tenant_id: uuid(tenant)?,
            store_id: StoreId::new(row.get::<_, String>(0)),
            state: routing_state(row.get(1))?,
            migration_id: migration.map(uuid).transpose()?,
            target_store_id: target.map(StoreId::from),
        })
    }
}

/// What a compare-and-set failure names.
const CAS: &str = "routing compare-and-set";

/// The parameters of the compare-and-set statement: the next route, then the expected.
struct CasValues<'a> {
    tenant: String,
    routes: [(&'a str, &'static str, Option<String>, Option<&'a str>); 2],
}

impl<'a> CasValues<'a> {
    fn new(expected: &'a TenantRoute, next: &'a TenantRoute) -> Self {
        let values = |route: &'a TenantRoute| {
            (
                route.store_id.as_str(),
                route.state.as_str(),
                route.migration_id.map(|id| id.hyphenated().to_string()),
                route.target_store_id.as_ref().map(StoreId::as_str),
            )
        };
        Self {
            tenant: next.tenant_id.hyphenated().to_string(),
            routes: [values(next), values(expected)],
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 9] {
        let [next, expected] = &self.routes;
        [
            &self.tenant,
            &next.0,
            &next.1,
            &next.2,
            &next.3,
            &expected.0,
            &expected.1,
            &expected.2,
            &expected.3,
        ]
    }
}

impl RoutingRepository for PostgresRoutingRepository {
    async fn get(&self, tenant_id: Uuid) -> Result<Option<TenantRoute>, RepositoryError> {
        const WHAT: &str = "routing read";
        let tenant = tenant_id.hyphenated().to_string();
        let rows = repository_query(&self.pool, WHAT, &self.get, &[&tenant]).await?;
        rows.first().map(Self::route).transpose()
    }

    async fn put(&self, route: TenantRoute) -> Result<(), RepositoryError> {
        const WHAT: &str = "routing update";
        let tenant = route.tenant_id.hyphenated().to_string();
        let migration = route.migration_id.map(|id| id.hyphenated().to_string());
        let target = route.target_store_id.as_ref().map(StoreId::as_str);
        let allowed = routing_predecessors(route.state);
        let params: [&(dyn ToSql + Sync); 6] = [
            &tenant,
            &route.store_id.as_str(),
            &route.state.as_str(),
            &migration,
            &target,
            &allowed,
        ];
        let rows = repository_query(&self.pool, WHAT, &self.put, &params).await?;
        if !rows.is_empty() {
            return Ok(());
        }
        let stored = self.get(route.tenant_id).await?;
        let words = match stored {
            Some(stored) => format!(
                "refused by the database: tenant {}'s route is `{}` (migration {:?}); \
                 `{}` for migration {:?} cannot be written over it",
                route.tenant_id, stored.state, stored.migration_id, route.state, route.migration_id
            ),
            None => format!(
                "refused by the database: tenant {} has no route",
                route.tenant_id
            ),
        };
        Err(RepositoryError::new(WHAT, DbFailure::refused("", words)))
    }

    /// One `UPDATE … WHERE` every column of the route is as expected (the state machine
    /// is checked first: `expected.state → next.state` must be a transition or keep the
    /// state).
    async fn compare_and_set(
        &self,
        expected: &TenantRoute,
        next: TenantRoute,
    ) -> Result<bool, RepositoryError> {
        TenantRoute::check_compare_and_set(expected, &next)?;
        let values = CasValues::new(expected, &next);
        let rows =
            repository_query(&self.pool, CAS, &self.compare_and_set, &values.params()).await?;
        Ok(!rows.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predecessors_follow_the_state_machine() {
        assert_eq!(
            routing_predecessors(RoutingState::CutoverPaused),
            ["dual_write", "cutover_paused"]
        );
        let migrated = routing_predecessors(RoutingState::Migrated);
        assert!(migrated.contains(&"cutover_paused") && migrated.contains(&"migrated"));
        assert!(!migrated.contains(&"dual_write"));
    }
}
