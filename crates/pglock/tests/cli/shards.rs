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
    assert!(text.contains(&format!("1 member of '{name}' (")), "{text}");
    running.abort();
    // With nobody left in the group, no shard is said to be moving.
    let left = tokio::time::Instant::now();
    loop {
        let table = output(pglock().args(["shards", &name])).await;
        let text = String::from_utf8_lossy(&table.stdout).into_owned();
        if text.ends_with(&format!("no member of '{name}' now\n")) {
            assert_eq!(text.matches("(no member)").count(), 3, "{text}");
            assert!(!text.contains("(moving)"), "{text}");
            break;
        }
        assert!(left.elapsed() < SOON, "the member never left: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The lines of the events file, split in words.
fn events(path: &std::path::Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// Per shard, a start and a stop alternate: a command started only once the one before
/// it had stopped; and tokens grow with each start.
fn alternate(events: &[Vec<String>]) {
    for shard in ["0", "1", "2", "3"] {
        let mine: Vec<&Vec<String>> = events.iter().filter(|line| line[1] == shard).collect();
        let mut last_token = 0;
        for (i, line) in mine.iter().enumerate() {
            let expected = if i % 2 == 0 { "start" } else { "stop" };
            assert_eq!(line[0], expected, "shard {shard}: {mine:?}");
            if expected == "start" {
                let token: i64 = line[2].parse().expect("a token");
                assert!(token > last_token, "shard {shard}: {mine:?}");
                last_token = token;
            }
        }
    }
}

fn count(events: &[Vec<String>], word: &str) -> usize {
    events.iter().filter(|line| line[0] == word).count()
}

/// On a database where no shard group and no scheduled job has run (no term table, no
/// ledger), `shards` and `jobs` say so and succeed, as for a group or a ledger with no
/// rows: they do not fail on the missing tables.
#[tokio::test]
async fn reads_on_a_database_where_nothing_has_run_are_empty_answers() {
    let (url, database) = throwaway_pg::testing::own_database("pglock_nothing_ran").await;
    let run = async |args: &[&str]| output(pglock().args(["--url", &url]).args(args)).await;
    let (text, json) = (
        run(&["shards", "g"]).await,
        run(&["shards", "--json", "g"]).await,
    );
    let (jobs, jobs_json) = (run(&["jobs"]).await, run(&["jobs", "--json"]).await);
    throwaway_pg::testing::drop_database(&database).await;
    for done in [&text, &json, &jobs, &jobs_json] {
        assert!(done.status.success(), "{done:?}");
    }
    assert_eq!(
        String::from_utf8_lossy(&text.stdout),
        "no shard of 'g' has run yet\n"
    );
    let document: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(document["shards"], serde_json::json!([]), "{document}");
    let runs: serde_json::Value = serde_json::from_slice(&jobs_json.stdout).expect("JSON");
    assert_eq!(runs, serde_json::json!([]));
    assert!(
        String::from_utf8_lossy(&jobs.stdout).starts_with("JOB"),
        "the table's header alone: {jobs:?}"
    );
}

#[tokio::test]
async fn run_shards_runs_a_command_per_owned_shard_and_stops_it_before_it_moves() {
    let (key, dir) = crate::unique("run-shards");
    let log = dir.path().join("events");
    // A command that takes 0.3 s to drain after SIGTERM: its shard's next command must
    // still start after its stop line.
    let script = format!(
        "echo start {{shard}} $PGLOCK_SHARD_TOKEN >> {log}; \
         trap 'sleep 0.3; echo stop {{shard}} >> {log}; exit 0' TERM; \
         while :; do sleep 0.05; done",
        log = log.display()
    );
    let spawn = || {
        pglock()
            .args(["run", "--shards", "4", &key, "-c", &script])
            .spawn()
            .expect("pglock run --shards")
    };
    let first = spawn();
    crate::eventually("the first member's 4 commands", || async {
        count(&events(&log), "start") == 4
    })
    .await;
    let second = spawn();
    crate::eventually("2 shards moved to the second member", || async {
        let events = events(&log);
        count(&events, "stop") == 2 && count(&events, "start") == 6
    })
    .await;
    alternate(&events(&log));
    let shown = output(pglock().args(["shards", &key, "--json"])).await;
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    assert_eq!(json["members"].as_array().map(Vec::len), Some(2), "{json}");
    crate::signal(&first, nix::sys::signal::Signal::SIGTERM);
    let left = crate::finish(first).await;
    assert_eq!(crate::code(&left), 143, "{}", crate::stderr(&left));
    crate::eventually("the first member's 2 shards moved on its leave", || async {
        let events = events(&log);
        count(&events, "stop") == 4 && count(&events, "start") == 8
    })
    .await;
    crate::signal(&second, nix::sys::signal::Signal::SIGTERM);
    let left = crate::finish(second).await;
    assert_eq!(crate::code(&left), 143, "{}", crate::stderr(&left));
    let events = events(&log);
    assert_eq!(
        count(&events, "stop"),
        8,
        "every command was stopped: {events:?}"
    );
    alternate(&events);
}

/// A database whose shard tables an earlier version made (without the columns added
/// since: the loss notice and the member's whole holder id): `run --shards` upgrades
/// them and runs, where it used to find them present, leave them, and never enter the
/// group (each entry refused for the missing column, said nowhere).
#[tokio::test]
async fn run_shards_upgrades_tables_an_earlier_version_made() {
    let (url, database) = throwaway_pg::testing::own_database("pglock_old_tables").await;
    let client = throwaway_pg::testing::connect(&url).await;
    install_shard_terms(&client).await.expect("the tables");
    let old = "ALTER TABLE locks_shard_terms DROP COLUMN loss_notice_ms, \
               DROP COLUMN loss_notice_token; \
               ALTER TABLE locks_shard_members DROP COLUMN holder_id";
    client.batch_execute(old).await.expect("the earlier tables");
    let (key, dir) = crate::unique("old-tables");
    let log = dir.path().join("events");
    let script = format!(
        "echo start {{shard}} >> {log}; while :; do sleep 0.05; done",
        log = log.display()
    );
    let member = pglock()
        .args([
            "--url", &url, "run", "-v", "--shards", "2", &key, "-c", &script,
        ])
        .spawn()
        .expect("pglock run --shards");
    crate::eventually("both shards' commands", || async {
        count(&events(&log), "start") == 2
    })
    .await;
    crate::signal(&member, nix::sys::signal::Signal::SIGTERM);
    let left = crate::finish(member).await;
    drop(client);
    throwaway_pg::testing::drop_database(&database).await;
    assert_eq!(crate::code(&left), 143, "{}", crate::stderr(&left));
    assert!(
        crate::stderr(&left).contains("upgrading the shard group's tables"),
        "{}",
        crate::stderr(&left)
    );
}
