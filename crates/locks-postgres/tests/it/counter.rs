//! The lost-update fixture: tasks increment one counter row with a read, a pause and a
//! write under a lock. Run on one key the lock must lose no update; run with a key of
//! its own per task (a lock that excludes nothing) updates are lost, so the check can
//! fail.

use std::time::Duration;

use locks_port::{DistributedLock, LockGuard, LockRegistry, ReleaseOutcome};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::Client;

use crate::support::{admin, unique_key};

/// A counter table of one test.
pub(crate) struct Counter {
    admin: Client,
    table: String,
}

/// How one run ended.
pub(crate) struct Run {
    /// The counter's final value.
    pub(crate) value: i32,
    /// The key the tasks used (with `:<task>` appended when not excluding).
    pub(crate) key: String,
    /// How many releases answered `InBackground`.
    pub(crate) backgrounded: usize,
}

impl Counter {
    /// A table named after `name` and this process, created if missing.
    pub(crate) async fn new(name: &str) -> Self {
        let admin = admin().await;
        let table = format!("it_{name}_{}", std::process::id());
        admin
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, n int NOT NULL)"
            ))
            .await
            .expect("counter table");
        Self { admin, table }
    }

    /// One task per manager of `managers` (a manager may appear more than once: its
    /// tasks then share it) increments the counter, reset to 0, `each` times; all on one
    /// key if `excluding`, else each on a key of its own.
    pub(crate) async fn run(
        &self,
        managers: &[PostgresLockManager],
        each: i32,
        excluding: bool,
    ) -> Run {
        let table = &self.table;
        self.admin
            .batch_execute(&format!(
                "DELETE FROM {table}; INSERT INTO {table} VALUES (1, 0)"
            ))
            .await
            .expect("reset the counter");
        let key = unique_key("counter");
        let held_before: Vec<usize> = managers.iter().map(LockRegistry::held_lock_count).collect();
        let mut tasks = Vec::new();
        for (task, manager) in managers.iter().enumerate() {
            let manager = manager.clone();
            let data = admin().await;
            let key = if excluding {
                key.clone()
            } else {
                format!("{key}:{task}")
            };
            let table = table.clone();
            tasks.push(tokio::spawn(async move {
                let mut backgrounded = 0;
                for _ in 0..each {
                    let guard = manager
                        .acquire(&key, Duration::from_secs(30))
                        .await
                        .expect("acquire");
                    let n: i32 = data
                        .query_one(&format!("SELECT n FROM {table} WHERE id = 1"), &[])
                        .await
                        .expect("read")
                        .get(0);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    data.execute(
                        &format!("UPDATE {table} SET n = $1 WHERE id = 1"),
                        &[&(n + 1)],
                    )
                    .await
                    .expect("write");
                    if guard.release().await == ReleaseOutcome::InBackground {
                        backgrounded += 1;
                    }
                }
                backgrounded
            }));
        }
        let mut backgrounded = 0;
        for task in tasks {
            backgrounded += task.await.expect("a counter task");
        }
        let value = self
            .admin
            .query_one(&format!("SELECT n FROM {table} WHERE id = 1"), &[])
            .await
            .expect("read the counter")
            .get(0);
        let held_after: Vec<usize> = managers.iter().map(LockRegistry::held_lock_count).collect();
        assert_eq!(
            held_after, held_before,
            "every counter lock released, the others kept (counter at {value})"
        );
        Run {
            value,
            key,
            backgrounded,
        }
    }

    pub(crate) fn admin(&self) -> &Client {
        &self.admin
    }

    /// Drops the table.
    pub(crate) async fn remove(self) {
        self.admin
            .batch_execute(&format!("DROP TABLE {}", self.table))
            .await
            .expect("drop the counter table");
    }
}
