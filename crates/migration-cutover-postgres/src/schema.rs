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
         CREATE UNIQUE INDEX IF NOT EXISTS \"{index}_event_id\" ON {table} (tenant_id, event_id);",
        schema = create_schema(table),
        table = table.quoted(),
        index = table.table(),
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
