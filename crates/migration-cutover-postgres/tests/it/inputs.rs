//! Inputs at the edges: long table names, a batch that carries an id twice, and text
//! with a NUL byte.

use std::time::Duration;

use migration_cutover::uuid::Uuid;
use migration_cutover::{
    Event, EventStore, Migration, MigrationRepository, Phase, RoutingRepository, RoutingState,
    StoreError, TenantRoute,
};
use migration_cutover_postgres::{PostgresEventStore, install_store};

use crate::support::{Fleet, SOURCE, TARGET, connect, pool, table, test_config};

/// What both sides say of a NUL byte in text: the server's words end with `0x00`, and
/// the in-memory ports (`migration_cutover::InMemory*`) say the same.
const NUL_WORDS: &str = "0x00";

/// PostgreSQL `text` cannot hold a NUL byte: the server refuses such an event kind, store
/// id or error text (`invalid byte sequence for encoding "UTF8": 0x00`), and nothing is
/// written. The in-memory ports refuse the same inputs with the same kind of error (their
/// unit tests), so a test on memory does not pass with inputs production refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_with_a_nul_byte_is_refused_by_every_adapter_and_writes_nothing() {
    let fleet = Fleet::create("nul").await;
    let instance = fleet.instance(test_config(), Duration::from_millis(250));
    let tenant = Uuid::new_v4();

    let error = instance
        .source
        .append(tenant, None, &[Event::new("Order\0Placed", "")])
        .await
        .unwrap_err();
    assert!(
        matches!(error, StoreError::Unavailable { .. }) && error.to_string().contains(NUL_WORDS),
        "{error}"
    );
    assert_eq!(instance.source.position(tenant).await.unwrap(), 0);
    // The payload is bytes: a NUL byte there is fine.
    let fine = Event::new("OrderPlaced", b"a\0b".to_vec());
    assert_eq!(
        instance
            .source
            .append(tenant, None, std::slice::from_ref(&fine))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        instance.source.read(tenant, 0, 9).await.unwrap()[0].event,
        fine
    );

    let routing = &instance.routing;
    let error = routing
        .put(TenantRoute::normal(tenant, "sha\0red"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains(NUL_WORDS), "{error}");
    assert_eq!(routing.get(tenant).await.unwrap(), None);
    let normal = TenantRoute::normal(tenant, SOURCE);
    routing.put(normal.clone()).await.unwrap();
    let error = routing
        .compare_and_set(&normal, TenantRoute::normal(tenant, "dedi\0cated"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains(NUL_WORDS), "{error}");
    let error = routing
        .compare_and_set(&TenantRoute::normal(tenant, "sha\0red"), normal.clone())
        .await
        .unwrap_err();
    assert!(error.to_string().contains(NUL_WORDS), "{error}");
    assert_eq!(routing.get(tenant).await.unwrap(), Some(normal.clone()));
    assert_eq!(normal.state, RoutingState::Normal);

    let now = migration_cutover::time::OffsetDateTime::now_utc();
    let record = Migration {
        id: Uuid::new_v4(),
        tenant_id: tenant,
        source_store_id: SOURCE.into(),
        target_store_id: "dedi\0cated".into(),
        phase: Phase::Pending,
        events_copied: 0,
        created_at: now,
        updated_at: now,
        last_error: None,
    };
    let migrations = &instance.migrations;
    let error = migrations.save(&record).await.unwrap_err();
    assert!(error.to_string().contains(NUL_WORDS), "{error}");
    let with_error = Migration {
        target_store_id: TARGET.into(),
        last_error: Some("bad\0words".into()),
        ..record.clone()
    };
    let error = migrations.save(&with_error).await.unwrap_err();
    assert!(error.to_string().contains(NUL_WORDS), "{error}");
    assert_eq!(migrations.get(record.id).await.unwrap(), None);
    fleet.drop_databases().await;
}

/// The in-memory store refuses such a batch the same way: nothing appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_carrying_one_event_id_twice_is_refused_and_appends_nothing() {
    let fleet = Fleet::create("dupbatch").await;
    let store = PostgresEventStore::new(pool(&fleet.a, 2), table("shared.events"));
    let tenant = Uuid::new_v4();
    let a = Event::new("A", "");
    let twice = [a.clone(), a.clone()];
    assert!(store.append(tenant, None, &twice).await.is_err());
    assert!(store.append(tenant, Some(0), &twice).await.is_err());
    assert_eq!(store.position(tenant).await.unwrap(), 0);
    assert_eq!(store.append(tenant, None, &[a]).await.unwrap(), 1);
    fleet.drop_databases().await;
}

/// `TableName` accepts parts of up to 63 bytes; the store's unique index on
/// `(tenant_id, event_id)` (which `install_store` documents) must exist for every one of
/// them, and for two long names in one schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_table_gets_its_unique_event_id_index_whatever_its_name_length() {
    let fleet = Fleet::create("longname").await;
    let stem = "e".repeat(62);
    let names = [format!("{stem}1"), format!("{stem}2"), "e".repeat(55)];
    for name in &names {
        install_store(&pool(&fleet.a, 1), &table(&format!("long.{name}")))
            .await
            .expect("install");
    }
    let client = connect(Some(&fleet.a)).await;
    for name in &names {
        let rows = client
            .query(
                "SELECT i.indexrelid::regclass::text FROM pg_index i
                 JOIN pg_class t ON t.oid = i.indrelid
                 JOIN pg_namespace n ON n.oid = t.relnamespace
                 WHERE n.nspname = 'long' AND t.relname = $1 AND i.indisunique
                   AND NOT i.indisprimary",
                &[name],
            )
            .await
            .unwrap();
        assert_eq!(
            rows.len(),
            1,
            "table long.{name} ({} bytes) has no unique index on (tenant_id, event_id)",
            name.len()
        );
    }
    drop(client);
    fleet.drop_databases().await;
}
