//! The explicit schema step: the tables the adapters need, created on purpose, once.

use deadpool_postgres::Pool;
use locks_port::{LockMode, lock_id};
use locks_postgres::TransactionLocks;

use crate::TableName;
use crate::db::{DbFailure, Transaction};

/// The schema step failed; the text carries the server's words.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SchemaError(#[from] DbFailure);

/// Runs `ddl` in one transaction, serialised across processes by a transaction-scoped
/// advisory lock (concurrent `CREATE … IF NOT EXISTS` can otherwise collide in the
/// catalog).
async fn install(pool: &Pool, what: &'static str, ddl: &str) -> Result<(), SchemaError> {
    let guard = lock_id("migration-cutover-postgres:install");
    let lock = TransactionLocks::statements(guard, LockMode::Exclusive, None);
    let mut transaction = Transaction::begin(pool, what, &lock).await?;
    transaction.batch(what, ddl).await?;
    transaction.commit(what).await?;
    Ok(())
}

fn create_schema(table: &TableName) -> String {
    table
        .schema()
        .map(|schema| format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";"))
        .unwrap_or_default()
}

/// The name of the store table's unique index on `(tenant_id, event_id)`:
/// `{table}_event_id`, or, when that is longer than PostgreSQL's 63-byte identifiers
/// (which the server would truncate silently, for a 63-byte table name to the table's
/// own name, so that `IF NOT EXISTS` skipped the index), the table name's start, a hash
/// of the whole name and `_event_id`, 63 bytes.
fn event_id_index(table: &TableName) -> String {
    const SUFFIX: &str = "_event_id";
    let name = table.table();
    if name.len() + SUFFIX.len() <= 63 {
        return format!("{name}{SUFFIX}");
    }
    // ASCII (checked by `TableName`), so any byte index is a char boundary.
    let keep = 63 - SUFFIX.len() - 17;
    format!("{}_{:016x}{SUFFIX}", &name[..keep], lock_id(name))
}

/// Creates one event store's table (and its schema, when the name is qualified) if it
/// does not exist. Idempotent; run it once per store before using
/// [`PostgresEventStore`](crate::PostgresEventStore), as a deployment step (the adapters
/// never create tables behind your back).
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS {table} (
///     tenant_id   uuid        NOT NULL,
///     position    bigint      NOT NULL CHECK (position > 0),
///     event_id    uuid        NOT NULL,
///     kind        text        NOT NULL,
///     payload     bytea       NOT NULL,
///     recorded_at timestamptz NOT NULL DEFAULT now(),
///     PRIMARY KEY (tenant_id, position)
/// );
/// CREATE UNIQUE INDEX IF NOT EXISTS "{table}_event_id" ON {table} (tenant_id, event_id);
/// -- (a table name over 54 bytes: its start, a hash of it and `_event_id`, 63 bytes)
/// ```
///
/// The unique index makes an event id land once per tenant, whatever a caller retries
/// (the append also checks it, to answer a retry with the event's position). On a table
/// created by an earlier version it is added by running this again; that fails, naming
/// the duplicate, if the table already holds an event twice.
///
/// # Errors
/// [`SchemaError`] with the server's words (no privilege, database unreachable).
pub async fn install_store(pool: &Pool, table: &TableName) -> Result<(), SchemaError> {
    let ddl = format!(
        "{schema}
         CREATE TABLE IF NOT EXISTS {table} (
             tenant_id   uuid        NOT NULL,
             position    bigint      NOT NULL CHECK (position > 0),
             event_id    uuid        NOT NULL,
             kind        text        NOT NULL,
             payload     bytea       NOT NULL,
             recorded_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (tenant_id, position)
         );
         CREATE UNIQUE INDEX IF NOT EXISTS \"{index}\" ON {table} (tenant_id, event_id);",
        schema = create_schema(table),
        table = table.quoted(),
        index = event_id_index(table),
    );
    install(pool, "install the event store table", &ddl).await
}

/// Creates the fleet's shared tables, the routing table `routes` and the migration
/// records `migrations`, if they do not exist. Idempotent; every instance of the fleet
/// points its [`PostgresRoutingRepository`](crate::PostgresRoutingRepository) and
/// [`PostgresMigrationRepository`](crate::PostgresMigrationRepository) at them.
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS {routes} (
///     tenant_id       uuid PRIMARY KEY,
///     store_id        text NOT NULL,
///     state           text NOT NULL CHECK (state IN ('normal', 'bulk_copy', 'dual_write',
///                                                    'cutover_paused', 'migrated')),
///     migration_id    uuid,
///     target_store_id text,
///     updated_at      timestamptz NOT NULL DEFAULT now()
/// );
/// CREATE TABLE IF NOT EXISTS {migrations} (
///     id              uuid PRIMARY KEY,
///     tenant_id       uuid   NOT NULL,
///     source_store_id text   NOT NULL,
///     target_store_id text   NOT NULL,
///     phase           text   NOT NULL CHECK (phase IN ('pending', 'bulk_copy', 'dual_write',
///                                    'cutover', 'completed', 'aborted', 'failed')),
///     events_copied   bigint NOT NULL,
///     created_at      timestamptz NOT NULL,
///     updated_at      timestamptz NOT NULL,
///     last_error      text
/// );
/// ```
///
/// # Errors
/// [`SchemaError`] with the server's words.
pub async fn install_fleet(
    pool: &Pool,
    routes: &TableName,
    migrations: &TableName,
) -> Result<(), SchemaError> {
    let ddl = format!(
        "{routes_schema}{migrations_schema}
         CREATE TABLE IF NOT EXISTS {routes} (
             tenant_id       uuid PRIMARY KEY,
             store_id        text NOT NULL,
             state           text NOT NULL CHECK (state IN ('normal', 'bulk_copy', 'dual_write',
                                                            'cutover_paused', 'migrated')),
             migration_id    uuid,
             target_store_id text,
             updated_at      timestamptz NOT NULL DEFAULT now()
         );
         CREATE TABLE IF NOT EXISTS {migrations} (
             id              uuid PRIMARY KEY,
             tenant_id       uuid   NOT NULL,
             source_store_id text   NOT NULL,
             target_store_id text   NOT NULL,
             phase           text   NOT NULL CHECK (phase IN ('pending', 'bulk_copy', 'dual_write',
                                            'cutover', 'completed', 'aborted', 'failed')),
             events_copied   bigint NOT NULL,
             created_at      timestamptz NOT NULL,
             updated_at      timestamptz NOT NULL,
             last_error      text
         );",
        routes_schema = create_schema(routes),
        migrations_schema = create_schema(migrations),
        routes = routes.quoted(),
        migrations = migrations.quoted(),
    );
    install(pool, "install the fleet tables", &ddl).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_names_fit_in_an_identifier_and_differ_per_table() {
        let short = TableName::new("s.events").unwrap();
        assert_eq!(event_id_index(&short), "events_event_id");
        let a = event_id_index(&TableName::new(&format!("{}1", "e".repeat(62))).unwrap());
        let b = event_id_index(&TableName::new(&format!("{}2", "e".repeat(62))).unwrap());
        assert_eq!((a.len(), b.len()), (63, 63));
        assert_ne!(a, b);
        assert_eq!(
            event_id_index(&TableName::new(&"e".repeat(54)).unwrap()).len(),
            63
        );
    }
}
