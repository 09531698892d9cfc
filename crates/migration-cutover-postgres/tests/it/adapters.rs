//! Each adapter on its own, in one process, against the real server.

use std::time::Duration;

use migration_cutover::testing::{migration_contract, routing_contract};
use migration_cutover::uuid::Uuid;
use migration_cutover::{
    Event, EventStore, Migration, MigrationRepository, PauseGuard, Phase, RoutingRepository,
    RoutingState, StoreError, TenantRoute, WritePause,
};
use migration_cutover_postgres::{
    PostgresEventStore, PostgresMigrationRepository, PostgresRoutingRepository, write_lock_id,
};

use crate::support::{Fleet, SOURCE, TARGET, connect, pool, table, test_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_store_appends_at_an_expected_position_and_reads_in_order() {
    let fleet = Fleet::create("store").await;
    let store = PostgresEventStore::new(pool(&fleet.a, 4), table("shared.events"));
    let tenant = Uuid::new_v4();
    assert_eq!(store.position(tenant).await.unwrap(), 0);
    let first = [Event::new("A", "1"), Event::new("B", vec![0u8, 255])];
    assert_eq!(store.append(tenant, Some(0), &first).await.unwrap(), 2);
    assert_eq!(
        store
            .append(tenant, None, &[Event::new("C", "")])
            .await
            .unwrap(),
        3
    );
    let error = store
        .append(tenant, Some(2), &[Event::new("D", "")])
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Conflict {
                expected: 2,
                actual: 3
            }
        ),
        "{error}"
    );
    assert_eq!(store.position(tenant).await.unwrap(), 3);
    assert_eq!(store.position(Uuid::new_v4()).await.unwrap(), 0);
    let events = store.read(tenant, 1, 10).await.unwrap();
    assert_eq!(
        events.iter().map(|e| e.position).collect::<Vec<_>>(),
        [2, 3]
    );
    assert_eq!(events[0].event, first[1]);
    assert_eq!(store.read(tenant, 0, 1).await.unwrap()[0].event, first[0]);
    store.ping().await.unwrap();

    // Concurrent unconditional appends get gap-free positions.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                store
                    .append(tenant, None, &[Event::new("E", "")])
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let all = store.read(tenant, 0, 1000).await.unwrap();
    assert_eq!(all.len(), 83);
    assert!(all.iter().zip(1..).all(|(e, p)| e.position == p));

    // A missing table: the server's words, not "db error".
    let missing = PostgresEventStore::new(pool(&fleet.a, 1), table("nowhere.events"));
    let error = missing.ping().await.unwrap_err();
    let text = format!(
        "{error}: {}",
        std::error::Error::source(&error)
            .map(ToString::to_string)
            .unwrap_or_default()
    );
    assert!(
        text.contains("does not exist") && text.contains("42P01"),
        "{text}"
    );
    fleet.drop_databases().await;
}

fn route(tenant: Uuid, state: RoutingState, migration: Option<Uuid>) -> TenantRoute {
    TenantRoute {
        tenant_id: tenant,
        store_id: SOURCE.into(),
        state,
        migration_id: migration,
        target_store_id: migration.map(|_| TARGET.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_transitions_are_checked_by_the_database() {
    let fleet = Fleet::create("routing").await;
    let instance = fleet.instance(test_config(), Duration::from_millis(250));
    let other = fleet.instance(test_config(), Duration::from_millis(250));
    let (routing, tenant, migration) = (&instance.routing, Uuid::new_v4(), Uuid::new_v4());
    routing
        .put(route(tenant, RoutingState::Normal, None))
        .await
        .unwrap();
    routing
        .put(route(tenant, RoutingState::Normal, Some(migration)))
        .await
        .unwrap();
    // Another migration cannot take over the marked route.
    let error = routing
        .put(route(tenant, RoutingState::Normal, Some(Uuid::new_v4())))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("refused by the database"),
        "{error}"
    );
    for state in [RoutingState::BulkCopy, RoutingState::DualWrite] {
        routing
            .put(route(tenant, state, Some(migration)))
            .await
            .unwrap();
    }

    // Two instances moving dual_write -> cutover_paused at once: exactly one does.
    let paused = route(tenant, RoutingState::CutoverPaused, Some(migration));
    let (first, second) = tokio::join!(
        routing.transition(RoutingState::DualWrite, &paused),
        other.routing.transition(RoutingState::DualWrite, &paused),
    );
    assert_eq!(
        [first.unwrap(), second.unwrap()]
            .iter()
            .filter(|moved| **moved)
            .count(),
        1
    );
    let mut migrated = route(tenant, RoutingState::Migrated, Some(migration));
    migrated.store_id = TARGET.into();
    migrated.target_store_id = None;
    routing.put(migrated.clone()).await.unwrap();
    // A stale instance cannot move a migrated route back to cutover_paused.
    let error = routing.put(paused.clone()).await.unwrap_err();
    assert!(error.to_string().contains("`migrated`"), "{error}");
    assert_eq!(routing.get(tenant).await.unwrap(), Some(migrated));
    // Not a transition of the machine at all: refused before the database.
    assert!(
        routing
            .transition(RoutingState::Normal, &paused)
            .await
            .is_err()
    );
    fleet.drop_databases().await;
}

/// The contract the in-memory routing table keeps too (`migration-cutover`'s tests run
/// the same case on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routing_table_keeps_the_routing_contract() {
    let fleet = Fleet::create("contract").await;
    let routing = PostgresRoutingRepository::new(pool(&fleet.a, 2), table("fleet.routes"));
    routing_contract(&routing).await;
    fleet.drop_databases().await;
}

/// The contract the in-memory migration records keep too (`migration-cutover`'s tests
/// run the same case on them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migration_records_keep_the_migration_contract() {
    let fleet = Fleet::create("records").await;
    let migrations = PostgresMigrationRepository::new(pool(&fleet.a, 2), table("fleet.migrations"));
    migration_contract(&migrations).await;
    fleet.drop_databases().await;
}

/// `locks_port::stored_time`, what the in-memory stores keep of a time, is what a
/// `timestamptz` bound by the driver keeps: UTC, the earlier microsecond since 2000, the
/// later one before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_bound_by_the_driver_reads_back_as_stored_time_says() {
    let client = connect(None).await;
    let east = migration_cutover::time::UtcOffset::from_hms(5, 30, 0).expect("offset");
    for nanos in [
        1_765_000_000_123_456_789_i128,
        946_684_800_000_000_999,
        946_684_799_999_999_500,
        -999,
        -1_000,
        0,
    ] {
        let at = migration_cutover::time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
            .expect("time")
            .to_offset(east);
        let kept: migration_cutover::time::OffsetDateTime = client
            .query_one("SELECT $1::timestamptz", &[&at])
            .await
            .expect("round trip")
            .get(0);
        assert_eq!(kept, locks_port::stored_time(at), "{at} ({nanos} ns)");
    }
}

/// A record's times read back to the microsecond (what the server keeps) across the
/// range `time` can hold, far years too: the microseconds of a time after 2255, or of
/// 9999-12-31T23:59:59.999999, are not lost or rounded on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_keeps_its_times_to_the_microsecond_in_any_year() {
    use migration_cutover::time::{Date, Month, PrimitiveDateTime, Time};

    let fleet = Fleet::create("times").await;
    let migrations = PostgresMigrationRepository::new(pool(&fleet.a, 2), table("fleet.migrations"));
    let at = |year, month, day, (h, m, s, micro)| {
        let date = Date::from_calendar_date(year, month, day).unwrap();
        PrimitiveDateTime::new(date, Time::from_hms_micro(h, m, s, micro).unwrap()).assume_utc()
    };
    let times = [
        (
            at(2026, Month::December, 7, (18, 0, 0, 993)),
            at(2300, Month::June, 1, (12, 0, 0, 993)),
        ),
        (
            at(1969, Month::July, 20, (20, 17, 40, 1)),
            at(9999, Month::December, 31, (23, 59, 59, 999_999)),
        ),
        (
            at(-4713, Month::November, 24, (0, 0, 0, 1)),
            at(1600, Month::March, 1, (0, 0, 0, 7)),
        ),
    ];
    for (created_at, updated_at) in times {
        let record = Migration {
            id: Uuid::new_v4(),
            tenant_id: Uuid::new_v4(),
            source_store_id: SOURCE.into(),
            target_store_id: TARGET.into(),
            phase: Phase::Pending,
            events_copied: 0,
            created_at,
            updated_at,
            last_error: None,
        };
        migrations.save(&record).await.unwrap();
        let stored = migrations.get(record.id).await;
        let stored = stored.unwrap_or_else(|error| panic!("{updated_at}: {error}"));
        let stored = stored.unwrap();
        assert_eq!(
            (stored.created_at, stored.updated_at),
            (created_at, updated_at),
            "read back as saved"
        );
    }
    fleet.drop_databases().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_phases_are_checked_by_the_database() {
    let fleet = Fleet::create("phases").await;
    let instance = fleet.instance(test_config(), Duration::from_millis(250));
    let other = fleet.instance(test_config(), Duration::from_millis(250));
    let migrations = &instance.migrations;
    let now = migration_cutover::time::OffsetDateTime::now_utc();
    let mut record = Migration {
        id: Uuid::new_v4(),
        tenant_id: Uuid::new_v4(),
        source_store_id: SOURCE.into(),
        target_store_id: TARGET.into(),
        phase: Phase::Pending,
        events_copied: 0,
        created_at: now,
        updated_at: now,
        last_error: None,
    };
    migrations.save(&record).await.unwrap();
    let stored = migrations.get(record.id).await.unwrap().unwrap();
    assert_eq!(stored.phase, Phase::Pending);
    assert_eq!(stored.created_at.unix_timestamp(), now.unix_timestamp());
    for phase in [Phase::BulkCopy, Phase::DualWrite] {
        record.phase = phase;
        migrations.save(&record).await.unwrap();
    }
    record.phase = Phase::Cutover;
    let (first, second) = tokio::join!(
        migrations.transition(Phase::DualWrite, &record),
        other.migrations.transition(Phase::DualWrite, &record),
    );
    assert_eq!(
        [first.unwrap(), second.unwrap()]
            .iter()
            .filter(|moved| **moved)
            .count(),
        1
    );
    record.phase = Phase::Completed;
    record.events_copied = 42;
    record.last_error = Some("none".into());
    migrations.save(&record).await.unwrap();
    assert_eq!(
        migrations.get(record.id).await.unwrap().unwrap(),
        Migration {
            updated_at: migrations.get(record.id).await.unwrap().unwrap().updated_at,
            created_at: migrations.get(record.id).await.unwrap().unwrap().created_at,
            ..record.clone()
        }
    );
    // A stale instance cannot move a completed migration back.
    record.phase = Phase::Cutover;
    let error = migrations.save(&record).await.unwrap_err();
    assert!(error.to_string().contains("`completed`"), "{error}");
    assert!(migrations.get(Uuid::new_v4()).await.unwrap().is_none());
    fleet.drop_databases().await;
}

/// Granted holders of the advisory lock `lock_id` in `mode` (`ShareLock`, `ExclusiveLock`).
pub(crate) async fn advisory(
    client: &migration_cutover_postgres::tokio_postgres::Client,
    lock_id: i64,
    mode: &str,
    granted: bool,
) -> i64 {
    let rows = throwaway_pg::testing::advisory_lock(client, lock_id).await;
    let count = rows
        .iter()
        .filter(|row| row.here && row.mode == mode && row.granted == granted)
        .count();
    i64::try_from(count).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_writers_on_the_server_until_it_resumes_and_is_bounded() {
    let fleet = Fleet::create("pause").await;
    let instance = fleet.instance(test_config(), Duration::from_millis(300));
    let tenant = Uuid::new_v4();
    instance
        .routing
        .put(TenantRoute::normal(tenant, SOURCE))
        .await
        .unwrap();
    let admin = connect(Some(&fleet.a)).await;
    let id = write_lock_id(tenant);

    let guard = instance.pause.pause(tenant).await.unwrap();
    assert!(instance.pause.is_paused(tenant));
    assert_eq!(advisory(&admin, id, "ExclusiveLock", true).await, 1);
    let writer = tokio::spawn({
        let router = instance.router.clone();
        async move { router.append(tenant, &[Event::new("W", "")]).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !writer.is_finished(),
        "the writer waits while the pause holds"
    );
    assert_eq!(advisory(&admin, id, "ShareLock", false).await, 1);
    guard.resume().await;
    let receipt = writer.await.unwrap().unwrap();
    assert!(
        receipt.lock_wait >= Duration::from_millis(150),
        "{receipt:?}"
    );
    assert_eq!(receipt.position, 1);
    assert!(!instance.pause.is_paused(tenant));
    assert_eq!(instance.pause.history().len(), 1);

    // A writer with a short timeout gives up with `Paused`, on the server's lock_timeout.
    let guard = instance.pause.pause(tenant).await.unwrap();
    let error = instance
        .router
        .clone()
        .with_timeout(Duration::from_millis(100))
        .append(tenant, &[Event::new("W", "")])
        .await
        .unwrap_err();
    assert!(
        matches!(error, migration_cutover::WriteError::Paused(_)),
        "{error}"
    );
    guard.drained().await;
    drop(guard); // drop without resume: the connections close, the lock goes with them
    instance
        .router
        .append(tenant, &[Event::new("W", "")])
        .await
        .unwrap();

    // The generic router of migration-cutover is held back too, through `admit`.
    let guard = instance.pause.pause(tenant).await.unwrap();
    let generic = tokio::spawn({
        let router = instance.coordinator.router();
        async move { router.append(tenant, &[Event::new("G", "")]).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        !generic.is_finished(),
        "the generic router waits while the pause holds"
    );
    guard.resume().await;
    let receipt = generic.await.unwrap().unwrap();
    assert_eq!((receipt.store_id.as_str(), receipt.position), (SOURCE, 3));

    // A write holding the shared lock makes a pause wait, up to its acquire timeout.
    let holder = connect(Some(&fleet.a)).await;
    holder
        .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock_shared({id})"))
        .await
        .unwrap();
    let error = instance.pause.pause(tenant).await.unwrap_err();
    assert!(
        error.to_string().contains("did not finish in time"),
        "{error}"
    );
    assert!(error.to_string().contains("55P03"), "{error}");
    holder.batch_execute("COMMIT").await.unwrap();
    instance.pause.pause(tenant).await.unwrap().resume().await;
    fleet.drop_databases().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_write_does_not_wait_long_for_a_target_that_does_not_answer() {
    let fleet = Fleet::create("mirror").await;
    let instance = fleet.instance(test_config(), Duration::from_millis(250));
    let (tenant, migration) = (Uuid::new_v4(), Uuid::new_v4());
    for state in [
        RoutingState::Normal,
        RoutingState::BulkCopy,
        RoutingState::DualWrite,
    ] {
        instance
            .routing
            .put(route(tenant, state, Some(migration)))
            .await
            .unwrap();
    }
    let receipt = instance
        .router
        .append(tenant, &[Event::new("A", "")])
        .await
        .unwrap();
    assert_eq!(
        receipt.mirrored_to.as_ref().map(|id| id.as_str()),
        Some(TARGET)
    );

    // The target's append lock held elsewhere: the mirror cannot open there.
    let target = connect(Some(&fleet.b)).await;
    target
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({})",
            locks_port::lock_id(&format!("append:dedicated.events:{tenant}"))
        ))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let receipt = instance
        .router
        .append(tenant, &[Event::new("B", "")])
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!((receipt.store_id.as_str(), receipt.position), (SOURCE, 2));
    assert_eq!(receipt.mirrored_to, None);
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(
        took < Duration::from_secs(4),
        "the mirror's wait is bounded (1 s): {took:?}"
    );
    target.batch_execute("COMMIT").await.unwrap();

    // The next dual write copies the gap.
    let receipt = instance
        .router
        .append(tenant, &[Event::new("C", "")])
        .await
        .unwrap();
    assert_eq!(
        receipt.mirrored_to.as_ref().map(|id| id.as_str()),
        Some(TARGET)
    );
    assert_eq!(instance.target.position(tenant).await.unwrap(), 3);
    fleet.drop_databases().await;
}
