//! Migrates one tenant between two real PostgreSQL stores (two databases) while writers
//! keep appending, then checks that every acknowledged event is in the target once.
//!
//! ```text
//! cargo run -p migration-cutover-postgres --example fleet
//! ```
//!
//! Uses the server of `LOCKS_DATABASE_URL`, or starts a throwaway PostgreSQL from the local
//! binaries when it is not set.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use locks_postgres::PostgresLockManager;
use migration_cutover::uuid::Uuid;
use migration_cutover::{
    Event, EventStore, MigrationConfig, MigrationCoordinator, MigrationPorts, RoutingRepository,
    Stores, TenantRoute,
};
use migration_cutover_postgres::tokio_postgres::{self, NoTls};
use migration_cutover_postgres::{
    PostgresEventStore, PostgresMigrationRepository, PostgresRoutingRepository, PostgresWritePause,
    PostgresWriteRouter, TableName, install_fleet, install_store,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn pool(url: &str, database: &str) -> Result<locks_postgres::deadpool_postgres::Pool, Error> {
    let mut config = tokio_postgres::Config::from_str(url)?;
    config.dbname(database);
    Ok(locks_postgres::plain_pool_with_config(config, 8)?)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = throwaway_pg::database_url()?;
    let suffix = std::process::id();
    let (shared_db, dedicated_db) = (
        format!("demo_shared_{suffix}"),
        format!("demo_dedicated_{suffix}"),
    );
    let (admin, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(connection);
    for database in [&shared_db, &dedicated_db] {
        admin
            .batch_execute(&format!("CREATE DATABASE \"{database}\""))
            .await?;
    }

    // The schema step, once per deployment.
    let (shared, dedicated) = (pool(&url, &shared_db)?, pool(&url, &dedicated_db)?);
    install_store(&shared, &TableName::new("shared.events")?).await?;
    install_store(&dedicated, &TableName::new("dedicated.events")?).await?;
    install_fleet(
        &shared,
        &TableName::new("fleet.routes")?,
        &TableName::new("fleet.migrations")?,
    )
    .await?;

    // One instance of the fleet (every instance builds the same thing).
    let source = PostgresEventStore::new(shared.clone(), TableName::new("shared.events")?);
    let target = PostgresEventStore::new(dedicated, TableName::new("dedicated.events")?);
    let stores = Stores::new()
        .with_store("shared", source.clone())
        .with_store("dedicated", target.clone());
    let routing = PostgresRoutingRepository::new(shared.clone(), TableName::new("fleet.routes")?);
    let pause = PostgresWritePause::new(&stores, &routing);
    let migrations =
        PostgresMigrationRepository::new(shared.clone(), TableName::new("fleet.migrations")?);
    let ports = MigrationPorts::new(stores, routing.clone(), pause, migrations);
    let config = MigrationConfig::new();
    let coordinator =
        MigrationCoordinator::new(ports, PostgresLockManager::new(shared)).with_config(config);
    let router = PostgresWriteRouter::new(coordinator.ports(), &config);

    let tenant = Uuid::new_v4();
    routing.put(TenantRoute::normal(tenant, "shared")).await?;

    // Writers append continuously while the tenant moves.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..3 {
        let (router, stop) = (router.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let mut longest_wait = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let event = Event::new("OrderPlaced", format!("writer {writer}"));
                let id = event.id;
                if let Ok(receipt) = router.append(tenant, &[event]).await {
                    acknowledged.push(id);
                    longest_wait = longest_wait.max(receipt.lock_wait);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (acknowledged, longest_wait)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let migration = coordinator
        .start_migration(tenant, "shared", "dedicated")
        .await?;
    let copy = coordinator.bulk_copy(migration.id).await?;
    println!(
        "bulk copy: {} events in {} rounds",
        copy.events_copied, copy.rounds
    );
    coordinator.enable_dual_write(migration.id).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let result = coordinator.cutover(migration.id).await?;
    println!(
        "cutover: {} in {:?}, {} events synced while paused",
        result.message(),
        result.duration(),
        result.events_synced()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);

    let in_target: Vec<Uuid> = target
        .read(tenant, 0, usize::MAX)
        .await?
        .into_iter()
        .map(|stored| stored.event.id)
        .collect();
    let mut acknowledged = 0;
    for writer in writers {
        let (ids, longest_wait) = writer.await?;
        acknowledged += ids.len();
        for id in &ids {
            let copies = in_target.iter().filter(|stored| *stored == id).count();
            assert_eq!(copies, 1, "event {id} is in the target {copies} times");
        }
        println!(
            "writer: {} events acknowledged, longest wait for the write lock {longest_wait:?}",
            ids.len()
        );
    }
    println!(
        "{acknowledged} acknowledged events, all in the target exactly once ({} there, {} left in the source)",
        in_target.len(),
        source.position(tenant).await?
    );
    assert!(result.success());

    for database in [&shared_db, &dedicated_db] {
        admin
            .batch_execute(&format!("DROP DATABASE \"{database}\" WITH (FORCE)"))
            .await?;
    }
    Ok(())
}
