//! `pglock capacity`: the plan without a database, and the server's settings against it.

use super::*;

#[tokio::test]
async fn capacity_plans_without_a_database_and_judges_the_server() {
    // No database: `--url` is left out and nothing is contacted.
    let offline = output(
        Command::new(env!("CARGO_BIN_EXE_pglock"))
            .env_remove("DATABASE_URL")
            .args(["capacity", "--locks", "1000000", "--connections", "100"]),
    )
    .await;
    assert_eq!(code(&offline), 0, "{}", stderr(&offline));
    let text = String::from_utf8_lossy(&offline.stdout).into_owned();
    assert!(
        text.contains("max_locks_per_transaction  12544 (lock table 1254400 entries)"),
        "{text}"
    );
    assert!(!text.contains("this server"), "{text}");

    // The test server: max_locks_per_transaction × (max_connections + prepared).
    let admin = admin().await;
    let setting = async |name: &str| -> u64 {
        let row = admin.query_one(&format!("SHOW {name}"), &[]).await.unwrap();
        row.get::<_, String>(0).parse().unwrap()
    };
    let capacity = setting("max_locks_per_transaction").await
        * (setting("max_connections").await + setting("max_prepared_transactions").await);
    // 4/5 of it needs 4/5 × 1.25 = the whole table: enough; twice it is not.
    let fits = (capacity * 4 / 5).to_string();
    let enough = output(pglock().args(["capacity", "--locks", &fits, "--json"])).await;
    assert_eq!(code(&enough), 0, "{}", stderr(&enough));
    let document: serde_json::Value = serde_json::from_slice(&enough.stdout).unwrap();
    assert_eq!(document["server"]["capacity"], capacity);
    assert_eq!(document["server"]["enough"], true);
    // `shared_memory_size` is a setting since PostgreSQL 15: null before.
    let version = setting("server_version_num").await;
    assert_eq!(
        document["server"]["shared_memory_size"].is_string(),
        version >= 150_000,
        "server_version_num {version}: {document}"
    );

    let twice = (capacity * 2).to_string();
    let short = output(pglock().args(["capacity", "--locks", &twice])).await;
    assert_eq!(code(&short), 1, "{}", stderr(&short));
    let text = String::from_utf8_lossy(&short.stdout).into_owned();
    assert!(
        text.contains(&format!(
            "{capacity} entries: too small: set max_locks_per_transaction"
        )),
        "{text}"
    );
}
