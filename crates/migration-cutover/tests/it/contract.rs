//! The routing table's and the migration records' contracts on the in-memory ones: the
//! refusals of the PostgreSQL ones (`migration-cutover-postgres` runs the same cases on
//! them).

use migration_cutover::testing::{migration_contract, routing_contract};
use migration_cutover::{InMemoryMigrationRepository, InMemoryRoutingRepository};

#[tokio::test]
async fn the_in_memory_routing_table_keeps_the_routing_contract() {
    routing_contract(&InMemoryRoutingRepository::new()).await;
}

#[tokio::test]
async fn the_in_memory_migration_records_keep_the_migration_contract() {
    migration_contract(&InMemoryMigrationRepository::new()).await;
}
