//! Scenario `cutover-append`: the write path of `migration-cutover-postgres`, one routed
//! append with the fleet's shared write lock and one without it, alternated in the same
//! run, so the figures are the lock's own cost (a batched `set_config` +
//! `pg_advisory_xact_lock_shared` in the append's transaction).

use std::time::Instant;

use migration_cutover::uuid::Uuid;
use migration_cutover::{
    Event, MigrationConfig, MigrationPorts, RoutingRepository, Stores, TenantRoute,
};
use migration_cutover_postgres::{
    PostgresEventStore, PostgresMigrationRepository, PostgresRoutingRepository, PostgresWritePause,
    PostgresWriteRouter, TableName, install_fleet, install_store,
};
use serde_json::json;

use crate::db::Database;
use crate::harness::{self, Cell, Outcome, cells};
use crate::stats::{Latencies, as_f64, fmt_ratio, ratio};
use crate::{BoxError, Plan};

const SCHEMA: &str = "lock_bench_cutover";

fn table(name: &str) -> Result<TableName, BoxError> {
    Ok(TableName::new(&format!("{SCHEMA}.{name}"))?)
}

/// Runs `rounds` rounds of `batch` appends with the lock and `batch` without, alternating
/// which goes first, each append one event to one tenant.
pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let (rounds, batch) = if plan.quick { (10, 200) } else { (30, 1000) };
    let pool = db.pool(4, "lock-bench-cutover-append");
    install_store(&pool, &table("events")?).await?;
    install_fleet(&pool, &table("routes")?, &table("migrations")?).await?;
    let store = PostgresEventStore::new(pool.clone(), table("events")?);
    let stores = Stores::new().with_store("bench", store);
    let routing = PostgresRoutingRepository::new(pool.clone(), table("routes")?);
    let pause = PostgresWritePause::new(&stores, &routing);
    let migrations = PostgresMigrationRepository::new(pool.clone(), table("migrations")?);
    let ports = MigrationPorts::new(stores, routing.clone(), pause, migrations);
    let locked = PostgresWriteRouter::new(&ports, &MigrationConfig::new());
    let unlocked = locked.clone().without_write_lock();
    let tenant = Uuid::new_v4();
    routing.put(TenantRoute::normal(tenant, "bench")).await?;

    // Warm the pool and the prepared statements of both paths.
    for router in [&locked, &unlocked] {
        for _ in 0..20 {
            router.append(tenant, &[Event::new("Warm", "")]).await?;
        }
    }
    let (mut with_lock, mut without_lock) = (Latencies::new(), Latencies::new());
    harness::rounds(rounds, 2, async |_, side| {
        let (router, latencies) = match side {
            0 => (&locked, &mut with_lock),
            _ => (&unlocked, &mut without_lock),
        };
        for _ in 0..batch {
            // The event is made before the clock starts: only the append is timed.
            let event = Event::new("Bench", "payload");
            let started = Instant::now();
            router.append(tenant, &[event]).await?;
            latencies.record(started.elapsed());
        }
        Ok(())
    })
    .await?;
    let cleanup = db.connect("lock-bench-cutover-append").await?;
    cleanup
        .batch_execute(&format!("DROP SCHEMA {SCHEMA} CASCADE"))
        .await?;

    let p50 = ratio(as_f64(with_lock.p50()), as_f64(without_lock.p50()));
    let p99 = ratio(as_f64(with_lock.p99()), as_f64(without_lock.p99()));
    let title = "Cutover write path: routed append with and without the shared write lock";
    let mut out = Outcome::new(
        "cutover_append",
        title,
        &["append", "samples", "p50", "p99"],
    );
    out.note(format!(
        "`PostgresWriteRouter::append` of one event to one tenant ({rounds} \
         alternating rounds of {batch}); each append reads the route, opens a \
         transaction on the store, reads the route again, inserts and commits. \
         With the lock the `BEGIN` batch also sets `lock_timeout` and takes \
         `pg_advisory_xact_lock_shared` (no extra round trip)."
    ));
    out.note(format!(
        "With / without: p50 {}, p99 {}.",
        fmt_ratio(p50),
        fmt_ratio(p99)
    ));
    for (name, l) in [
        ("with the shared write lock", &with_lock),
        ("without it", &without_lock),
    ] {
        out.row(cells![
            name,
            l.count(),
            Cell::ns(l.p50()),
            Cell::ns(l.p99())
        ]);
    }
    Ok(out.with(json!({ "p50_ratio": p50, "p99_ratio": p99 })))
}
