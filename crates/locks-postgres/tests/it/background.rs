//! `release_in_background`: the unlock leaves the caller's path, exclusion stays.

use locks_postgres::PostgresLockManager;

use crate::counter::Counter;
use crate::support::{holders, pool};

/// Four managers increment one counter 40 times each with a read, a pause and a write
/// under the lock, releasing in the background: no update is lost. The same run with
/// a key of its own per task (a lock that excludes nothing) loses updates, so the
/// check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_releases_lose_no_update() {
    let counter = Counter::new("background").await;
    for excluding in [true, false] {
        let managers: Vec<PostgresLockManager> = (0..4)
            .map(|_| {
                PostgresLockManager::builder(pool(2))
                    .release_in_background(true)
                    .build()
            })
            .collect();
        let run = counter.run(&managers, 40, excluding).await;
        let n = run.value;
        if excluding {
            assert_eq!(n, 160, "no lost update under the lock");
            assert!(run.backgrounded > 0, "the releases went to the background");
            crate::faults::wait_for("the last unlock to be read", || async {
                holders(counter.admin(), locks_port::lock_id(&run.key)).await == 0
            })
            .await;
        } else {
            assert!(
                n < 160,
                "a lock that excludes nothing must lose updates (got {n})"
            );
        }
    }
    counter.remove().await;
}
