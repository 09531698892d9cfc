//! Inputs at the edges: long table names, and a batch that carries an id twice.

use migration_cutover::uuid::Uuid;
use migration_cutover::{Event, EventStore};
use migration_cutover_postgres::{PostgresEventStore, install_store};

use crate::support::{Fleet, connect, pool, table};

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
