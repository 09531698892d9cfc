//! Scenario `cutover-append`: a routed append of `migration-cutover-postgres` with the
//! fleet's shared write lock and without it, alternated: the lock's own cost.

use migration_cutover::TenantRoute;
use migration_cutover::uuid::Uuid;
use migration_cutover::{Event, MigrationConfig, MigrationPorts, RoutingRepository, Stores};
use migration_cutover_postgres::{
    PostgresEventStore, PostgresMigrationRepository, PostgresRoutingRepository, PostgresWritePause,
    PostgresWriteRouter, TableName, install_fleet, install_store,
};
use serde_json::json;

use crate::db::Database;
use crate::harness::{self, Cell, Outcome, row};
use crate::stats::{Latencies, fmt_ratio, ratio};
use crate::{Plan, Result};

const SCHEMA: &str = "lock_bench_cutover";
const APP: &str = "lock-bench-cutover-append";

fn table(name: &str) -> Result<TableName> {
    Ok(TableName::new(&format!("{SCHEMA}.{name}"))?)
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome> {
    let (rounds, batch) = plan.pick((10, 200), (30, 1000));
    let pool = db.pool(4, APP);
    install_store(&pool, &table("events")?).await?;
    install_fleet(&pool, &table("routes")?, &table("migrations")?).await?;
    let store = PostgresEventStore::new(pool.clone(), table("events")?);
    let stores = Stores::new().with_store("bench", store);
    let routing = PostgresRoutingRepository::new(pool.clone(), table("routes")?);
    let pause = PostgresWritePause::new(&stores, &routing);
    let migrations = PostgresMigrationRepository::new(pool.clone(), table("migrations")?);
    let ports = MigrationPorts::new(stores, routing.clone(), pause, migrations);
    let locked = PostgresWriteRouter::new(&ports, &MigrationConfig::new());
    let routers = [locked.clone(), locked.without_write_lock()];
    let tenant = Uuid::new_v4();
    routing.put(TenantRoute::normal(tenant, "bench")).await?;
    // Warm the pool and the prepared statements of both paths.
    for router in &routers {
        for _ in 0..20 {
            router.append(tenant, &[Event::new("Warm", "")]).await?;
        }
    }
    let sides = harness::alternate(rounds, async |_, side| {
        // The events are made before the clock starts: only the appends are timed.
        let events: Vec<Event> = (0..batch).map(|_| Event::new("Bench", "payload")).collect();
        let append = async |n: usize| routers[side].append(tenant, &events[n..=n]).await;
        Ok(Latencies::timed(0..batch, append).await?)
    })
    .await?;
    let sides = sides.each_ref().map(Latencies::merged);
    let cleanup = format!("DROP SCHEMA {SCHEMA} CASCADE");
    db.connect(APP).await?.batch_execute(&cleanup).await?;

    let [with, without] = &sides;
    let p50 = ratio(with.p50() as f64, without.p50() as f64);
    let p99 = ratio(with.p99() as f64, without.p99() as f64);
    let title = "Cutover write path: routed append with and without the shared write lock";
    let mut out = Outcome::new("cutover_append", title);
    out.note(format!(
        "`PostgresWriteRouter::append` of one event to one tenant ({rounds} \
         alternating rounds of {batch}); each append reads the route, opens a \
         transaction on the store, reads the route again, inserts and commits. \
         With the lock the `BEGIN` batch also sets `lock_timeout` and takes \
         `pg_advisory_xact_lock_shared` (no extra round trip)."
    ));
    let [p50_ratio, p99_ratio] = [p50, p99].map(fmt_ratio);
    out.note(format!("With / without: p50 {p50_ratio}, p99 {p99_ratio}."));
    let names = ["with the shared write lock", "without it"];
    for (name, l) in names.iter().zip(&sides) {
        let (p50, p99) = (Cell::ns(l.p50()), Cell::ns(l.p99()));
        out.row(row!["append" => *name, "samples" => l.count(), "p50" => p50, "p99" => p99]);
    }
    Ok(out.with(json!({ "p50_ratio": p50, "p99_ratio": p99 })))
}
