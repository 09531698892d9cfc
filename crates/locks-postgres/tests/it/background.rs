//! `release_in_background`: the unlock leaves the caller's path, exclusion stays.

use std::time::Duration;

use locks_port::{DistributedLock, LockGuard, LockRegistry, ReleaseOutcome};
use locks_postgres::PostgresLockManager;

use crate::support::{admin, holders, pool, unique_key};

/// Four managers increment one counter 40 times each with a read, a pause and a write
/// under the lock, releasing in the background: no update is lost. The same run with
/// a key of its own per task (a lock that excludes nothing) loses updates, so the
/// check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_releases_lose_no_update() {
    let admin = admin().await;
    let table = format!("it_background_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, n int NOT NULL)"
        ))
        .await
        .unwrap();
    for excluding in [true, false] {
        admin
            .batch_execute(&format!(
                "DELETE FROM {table}; INSERT INTO {table} VALUES (1, 0)"
            ))
            .await
            .unwrap();
        let key = unique_key("background");
        let mut tasks = Vec::new();
        for task in 0..4 {
            let manager = PostgresLockManager::builder(pool(2))
                .release_in_background(true)
                .build();
            let data = crate::support::admin().await;
            let key = if excluding {
                key.clone()
            } else {
                format!("{key}:{task}")
            };
            let table = table.clone();
            tasks.push(tokio::spawn(async move {
                let mut backgrounded = 0;
                for _ in 0..40 {
                    let guard = manager
                        .acquire(&key, Duration::from_secs(30))
                        .await
                        .expect("acquire");
                    let n: i32 = data
                        .query_one(&format!("SELECT n FROM {table} WHERE id = 1"), &[])
                        .await
                        .unwrap()
                        .get(0);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    data.execute(
                        &format!("UPDATE {table} SET n = $1 WHERE id = 1"),
                        &[&(n + 1)],
                    )
                    .await
                    .unwrap();
                    if guard.release().await == ReleaseOutcome::InBackground {
                        backgrounded += 1;
                    }
                }
                assert_eq!(manager.held_lock_count(), 0);
                backgrounded
            }));
        }
        let mut backgrounded = 0;
        for task in tasks {
            backgrounded += task.await.unwrap();
        }
        let n: i32 = admin
            .query_one(&format!("SELECT n FROM {table} WHERE id = 1"), &[])
            .await
            .unwrap()
            .get(0);
        if excluding {
            assert_eq!(n, 160, "no lost update under the lock");
            assert!(backgrounded > 0, "the releases went to the background");
            crate::faults::wait_for("the last unlock to be read", || async {
                holders(&admin, locks_port::lock_id(&key)).await == 0
            })
            .await;
        } else {
            assert!(
                n < 160,
                "a lock that excludes nothing must lose updates (got {n})"
            );
        }
    }
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}
