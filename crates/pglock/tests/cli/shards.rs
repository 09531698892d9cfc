//! `pglock shards GROUP [--json]`: who owns which shard of a `locks-shard` group.

use std::time::Duration;

use locks_postgres::PostgresLockManager;
use locks_shard::{ShardGroup, ShardMember};
use locks_shard_postgres::{PostgresShardTerms, install_shard_terms};
use throwaway_pg::testing::{admin, database_url, unique};

use crate::{SOON, output, pglock};

#[tokio::test]
async fn shards_shows_each_owner_with_its_token_and_the_members() {
    install_shard_terms(&admin().await)
        .await
        .expect("the term table");
    let name = unique("pglock-shards");
    let empty = output(pglock().args(["shards", &name])).await;
    assert!(empty.status.success(), "{empty:?}");
    assert_eq!(
        String::from_utf8_lossy(&empty.stdout),
        format!("no shard of '{name}' has run yet\n")
    );

    let url = database_url();
    let pool = |size| locks_postgres::plain_pool(&url, size).expect("a pool");
    let member = ShardMember::new(
        PostgresLockManager::builder(pool(6))
            .holder_id("shard-cli")
            .build(),
        PostgresShardTerms::new(pool(2)),
        ShardGroup::new(&name, ["a", "b", "c"]).expect("a group"),
    )
    .tick(Duration::from_millis(20));
    let running = tokio::spawn(async move {
        let _ = member
            .run(|_owned, _stop| std::future::pending::<()>())
            .await;
    });
    let started = tokio::time::Instant::now();
    let shown = loop {
        let shown = output(pglock().args(["shards", &name, "--json"])).await;
        assert!(shown.status.success(), "{shown:?}");
        let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
        let shards = json["shards"].as_array().expect("shards").clone();
        if shards.len() == 3 && shards.iter().all(|shard| !shard["owner"].is_null()) {
            break json;
        }
        assert!(started.elapsed() < SOON, "not every shard owned: {json}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(shown["group"], name.as_str());
    assert_eq!(shown["members"].as_array().map(Vec::len), Some(1));
    let names: Vec<&str> = shown["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|shard| shard["shard"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    for shard in shown["shards"].as_array().expect("shards") {
        let owner = &shard["owner"];
        assert_eq!(owner["holder_id"], "shard-cli");
        assert_eq!(owner["token"], 1);
        assert!(
            owner["since"].as_str().is_some_and(|s| s.ends_with('Z')),
            "{owner}"
        );
    }
    let table = output(pglock().args(["shards", &name])).await;
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("SHARD"), "{text}");
    assert_eq!(text.matches("shard-cli").count(), 3, "{text}");
    assert!(text.contains(&format!("1 members of '{name}'")), "{text}");
    running.abort();
}
