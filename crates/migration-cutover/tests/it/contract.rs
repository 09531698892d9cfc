//! The routing table's contract on the in-memory table: the refusals of the PostgreSQL
//! one (`migration-cutover-postgres` runs the same case on it).

use migration_cutover::InMemoryRoutingRepository;
use migration_cutover::testing::routing_contract;

#[tokio::test]
async fn the_in_memory_routing_table_keeps_the_routing_contract() {
    routing_contract(&InMemoryRoutingRepository::new()).await;
}
