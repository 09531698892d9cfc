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

/// Every 250 ms, checks out as many connections of each pool as it takes to have
/// `count` in all, those in use counted (each returned as soon as it is had): the idle
/// ones are checked (a closed one is dropped), and the missing ones opened.
pub(crate) async fn keep_warm(pools: [Pool; 2], count: usize) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for pool in &pools {
            let status = pool.status();
            let in_use = status.size.saturating_sub(status.available);
            let idle_wanted = count.saturating_sub(in_use);
            let checking = (0..idle_wanted).map(|_| async { drop(pool.get().await) });
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                futures_util::future::join_all(checking),
            )
            .await;
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
