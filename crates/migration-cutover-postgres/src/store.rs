//! An event store on a plain PostgreSQL table.

use std::fmt;
use std::sync::Arc;

use deadpool_postgres::Pool;
use locks_port::uuid::Uuid;
use locks_port::{LockMode, lock_id};
use locks_postgres::TransactionLocks;
use migration_cutover::{Event, EventStore, StoreError, StoredEvent};

use tokio::sync::OnceCell;

use crate::TableName;
use crate::db::{DbFailure, InFlight, Transaction, commit_failure, identity};

/// An [`EventStore`] on one table (see [`install_store`](crate::install_store) for its
/// shape): one row per event, keyed by `(tenant_id, position)`.
///
/// Source and target are two `PostgresEventStore`s: different databases (two pools),
/// different schemas or just different tables of one database all work.
///
/// Appends to one tenant's stream are serialised by a transaction-scoped advisory lock on
/// `append:{table}:{tenant}` taken before the head is read, so the positions stay gap-free
/// and a conditional append (`expected = Some(p)`) is checked atomically. Event ids are
/// unique per tenant (a unique index, see [`install_store`](crate::install_store)): an
/// unconditional append whose events are all stored already appends nothing and answers
/// with their position, so retrying an append that failed with
/// [`CommitUncertain`](migration_cutover::StoreError::CommitUncertain) lands it once. This lock is not
/// the fleet's write pause: the port's `append` (used by the copy, the catch-ups and the
/// final sync of the cutover) does not take the shared write lock, only the
/// [`PostgresWriteRouter`](crate::PostgresWriteRouter)'s writes do.
#[derive(Clone)]
pub struct PostgresEventStore {
    pool: Pool,
    table: TableName,
    sql: Sql,
    /// Which database the pool reaches, asked once (see [`identity`](Self::identity)).
    identity: Arc<OnceCell<String>>,
}

#[derive(Debug, Clone)]
struct Sql {
    insert: String,
    read: String,
    position: String,
    ping: String,
}

impl fmt::Debug for PostgresEventStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresEventStore")
            .field("table", &self.table.to_string())
            .finish_non_exhaustive()
    }
}

fn unavailable(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    move |error| StoreError::unavailable(DbFailure::driver(what, error))
}

fn position_of(value: i64) -> u64 {
    // Positions are checked `> 0` by the table; a negative value cannot come back.
    u64::try_from(value).unwrap_or(0)
}

impl PostgresEventStore {
    /// A store on `table` through `pool`. Does no I/O; the table must exist
    /// ([`install_store`](crate::install_store)).
    #[must_use]
    pub fn new(pool: Pool, table: TableName) -> Self {
        let t = table.quoted();
        let sql = Sql {
            // The head is read in this statement's snapshot, taken after the append lock
            // was granted by the previous statement, so it sees every earlier append.
            // Events already stored (by id) are not appended again: a batch all of
            // whose events are there appends nothing (a retry after an uncertain
            // commit), and one that is partly there appends nothing either.
            insert: format!(
                "WITH head AS (
                     SELECT coalesce(max(position), 0) AS h FROM {t}
                     WHERE tenant_id = $1::text::uuid
                 ), stored AS (
                     SELECT count(*) AS n, coalesce(max(position), 0) AS p FROM {t}
                     WHERE tenant_id = $1::text::uuid AND event_id = ANY($3::text[]::uuid[])
                 ), ins AS (
                     INSERT INTO {t} (tenant_id, position, event_id, kind, payload)
                     SELECT $1::text::uuid, head.h + e.ord, e.id::uuid, e.kind, e.payload
                     FROM head, stored, unnest($3::text[], $4::text[], $5::bytea[])
                         WITH ORDINALITY AS e(id, kind, payload, ord)
                     WHERE ($2::bigint IS NULL OR head.h = $2::bigint) AND stored.n = 0
                     RETURNING 1
                 )
                 SELECT head.h, (SELECT count(*) FROM ins), stored.n, stored.p FROM head, stored"
            ),
            read: format!(
                "SELECT position, event_id::text, kind, payload FROM {t}
                 WHERE tenant_id = $1::text::uuid AND position > $2
                 ORDER BY position LIMIT $3"
            ),
            position: format!(
                "SELECT coalesce(max(position), 0) FROM {t} WHERE tenant_id = $1::text::uuid"
            ),
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
        };
        Self {
            pool,
            table,
            sql,
            identity: Arc::new(OnceCell::new()),
        }
    }

    /// Which database this store's pool reaches (asked once, then remembered): stores
    /// with the same identity are in one database, where one lock covers both.
    pub(crate) async fn identity(&self) -> Result<&str, DbFailure> {
        identity(&self.identity, &self.pool).await
    }

    /// The pool the store uses.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The table.
    #[must_use]
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The statement that takes the append lock of `tenant_id` (transaction-scoped).
    pub(crate) fn append_lock(&self, tenant_id: Uuid) -> String {
        let id = lock_id(&format!("append:{}:{}", self.table, tenant_id.hyphenated()));
        // Bounded by the transaction's `lock_timeout` (a write lock taken before it in
        // the same batch sets it).
        TransactionLocks::statements(id, LockMode::Exclusive, None)
    }

    /// Appends inside `transaction`, which holds the append lock of `tenant_id` already
    /// (see [`append_lock`](Self::append_lock)) and which the caller commits. Returns
    /// the new head.
    pub(crate) async fn insert_in(
        &self,
        transaction: &Transaction,
        tenant_id: Uuid,
        expected: Option<u64>,
        events: &[Event],
    ) -> Result<u64, StoreError> {
        let client = transaction.client();
        let insert = client
            .prepare_cached(&self.sql.insert)
            .await
            .map_err(unavailable("prepare the append"))?;
        let tenant = tenant_id.hyphenated().to_string();
        // A position beyond i64 cannot be the head: the check below reports the conflict.
        let expected_sql = expected.map(|p| i64::try_from(p).unwrap_or(i64::MAX));
        let ids: Vec<String> = events
            .iter()
            .map(|e| e.id.hyphenated().to_string())
            .collect();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        let payloads: Vec<&[u8]> = events.iter().map(|e| e.payload.as_slice()).collect();
        let row = client
            .query_one(&insert, &[&tenant, &expected_sql, &ids, &kinds, &payloads])
            .await
            .map_err(unavailable("append"))?;
        let head = position_of(row.get(0));
        let inserted = position_of(row.get(1));
        let (stored, last_stored) = (position_of(row.get(2)), position_of(row.get(3)));
        let of = u64::try_from(events.len()).unwrap_or(u64::MAX);
        match expected {
            Some(expected) if expected != head => Err(StoreError::Conflict {
                expected,
                actual: head,
            }),
            None if stored == of && of > 0 => Ok(last_stored),
            _ if stored > 0 => Err(StoreError::PartlyStored { stored, of }),
            _ => Ok(head + inserted),
        }
    }

    /// A connection for reads: one dropped before its answer (a cutover step cut short by
    /// its pause budget) is cancelled and closed ([`InFlight`]), not left busy in the pool.
    async fn client(&self, what: &'static str) -> Result<InFlight, StoreError> {
        InFlight::checkout(&self.pool)
            .await
            .map_err(|error| StoreError::unavailable(DbFailure::pool(what, error)))
    }
}

impl EventStore for PostgresEventStore {
    async fn append(
        &self,
        tenant_id: Uuid,
        expected: Option<u64>,
        events: &[Event],
    ) -> Result<u64, StoreError> {
        let transaction = Transaction::begin(&self.pool, "append", &self.append_lock(tenant_id))
            .await
            .map_err(StoreError::unavailable)?;
        let head = self
            .insert_in(&transaction, tenant_id, expected, events)
            .await;
        match head {
            Ok(head) => {
                transaction
                    .commit("commit the append")
                    .await
                    .map_err(commit_failure)?;
                Ok(head)
            }
            Err(error) => {
                transaction.rollback().await;
                Err(error)
            }
        }
    }

    async fn read(
        &self,
        tenant_id: Uuid,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let in_flight = self.client("read").await?;
        let tenant = tenant_id.hyphenated().to_string();
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = async {
            let client = in_flight.client();
            let statement = (client.prepare_cached(&self.sql.read).await)
                .map_err(unavailable("prepare the read"))?;
            (client.query(&statement, &[&tenant, &after, &limit]).await)
                .map_err(unavailable("read"))
        }
        .await;
        in_flight.answered();
        let rows = rows?;
        rows.iter()
            .map(|row| {
                let id: &str = row.get(1);
                let id = Uuid::parse_str(id).map_err(|error| {
                    StoreError::unavailable(format!("stored event id {id:?}: {error}"))
                })?;
                Ok(StoredEvent {
                    position: position_of(row.get(0)),
                    event: Event {
                        id,
                        kind: row.get(2),
                        payload: row.get(3),
                    },
                })
            })
            .collect()
    }

    async fn position(&self, tenant_id: Uuid) -> Result<u64, StoreError> {
        let in_flight = self.client("read the head position").await?;
        let tenant = tenant_id.hyphenated().to_string();
        let row = async {
            let client = in_flight.client();
            let statement = (client.prepare_cached(&self.sql.position).await)
                .map_err(unavailable("prepare the head position"))?;
            (client.query_one(&statement, &[&tenant]).await)
                .map_err(unavailable("read the head position"))
        }
        .await;
        in_flight.answered();
        Ok(position_of(row?.get(0)))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let in_flight = self.client("health check").await?;
        let answer = in_flight.client().query(&self.sql.ping, &[]).await;
        in_flight.answered();
        answer.map(drop).map_err(unavailable("health check"))
    }
}
