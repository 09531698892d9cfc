//! A shard member's pools in the soak (`soak --shards`): opened before it joins for the
//! share it may come to hold, and kept so; and, with `SOAK_SHARD_TRACE`, each change of
//! the lock pool's size logged (a take that opens a connection is a slow one).

use std::time::Duration;

use locks_shard_postgres::deadpool_postgres::Pool;

/// Opens up to `count` connections in each pool (returned to it at once), at most a
/// couple of seconds' worth: a pool that cannot is warmed as far as it got.
pub(crate) async fn warm(pools: &[&Pool], count: usize) {
    let opening = pools
        .iter()
        .flat_map(|pool| (0..count).map(|_| pool.get()))
        .collect::<Vec<_>>();
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        futures_util::future::join_all(opening),
    )
    .await;
}

/// How many connections of a pool [`keep_warm`] checks out at most in a round: a
/// gentle refill (8 a second), not a burst of every member's connections at once when
/// the server is back from a restart, while its members retake their shards.
const REFILL_AT_ONCE: usize = 2;

/// Every 250 ms, checks out up to [`REFILL_AT_ONCE`] connections more than are idle, of
/// each pool that has fewer than `count` in all, those in use counted, and returns them
/// together: a closed idle one is dropped, a missing one opened.
pub(crate) async fn keep_warm(pools: [Pool; 2], count: usize) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for pool in &pools {
            let status = pool.status();
            let in_use = status.size.saturating_sub(status.available);
            let idle_wanted = count.saturating_sub(in_use);
            let refill = if status.size < count {
                idle_wanted.min(REFILL_AT_ONCE + status.available)
            } else {
                0
            };
            // Held together, returned together: a checkout returned as soon as it is had
            // lets the next take the same idle connection, and the pool never grew past
            // what was in use plus the idle ones (11 of 14 for a member of 8 shards).
            let checking = (0..refill).map(|_| pool.get());
            let held = tokio::time::timeout(
                Duration::from_secs(2),
                futures_util::future::join_all(checking),
            )
            .await;
            drop(held);
        }
    }
}

/// Logs each change of `pool`'s size (`SOAK_SHARD_TRACE`), with the member's holder id.
pub(crate) async fn trace_pool_size(pool: Pool, member: String) {
    let mut last = 0;
    loop {
        let status = pool.status();
        if status.size != last {
            tracing::warn!(%member, size = status.size, available = status.available,
                "lock pool size");
            last = status.size;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
