//! What the fleet tests record and read: each task's guarded progress writes, stamped
//! with the server's `clock_timestamp()`, and who owns which shard.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_shard::locks_port::LostSignal;
use locks_shard::{Owned, ShardGroup, Shards};
use locks_shard_postgres::deadpool_postgres::Pool;
use locks_shard_postgres::{PostgresShardTerms, guard_write};
use tokio::sync::OnceCell;

use crate::support::{
    admin, connect, manager, manager_at, pool_at, terms, writes_pool, writes_pool_at,
};

pub(crate) const SHARDS: usize = 24;
/// How long a task goes on writing after it was told to stop.
const DRAIN: Duration = Duration::from_millis(50);
const WRITES: &str = "CREATE TABLE IF NOT EXISTS shard_test_writes (\
     group_name text NOT NULL, shard text NOT NULL, token bigint NOT NULL, \
     holder text NOT NULL, at timestamptz NOT NULL, accepted boolean NOT NULL)";

/// The group of the fleet tests: 24 tenants.
pub(crate) fn group(name: &str) -> ShardGroup {
    ShardGroup::new(name, (0..SHARDS).map(|i| format!("tenant-{i}"))).expect("a group")
}

/// Reads owners and writes of one group, as an observer that is not a member.
pub(crate) struct Watcher {
    /// The server the group runs on.
    pub(crate) url: String,
    pub(crate) group: ShardGroup,
    pub(crate) terms: PostgresShardTerms,
    pub(crate) writes: Pool,
    pub(crate) observer: PostgresLockManager,
}

impl Watcher {
    pub(crate) async fn new(group: ShardGroup) -> Self {
        // Once per process: two concurrent CREATE TABLE IF NOT EXISTS can fail on the catalog.
        static CREATED: OnceCell<()> = OnceCell::const_new();
        CREATED
            .get_or_init(|| async {
                admin()
                    .await
                    .batch_execute(WRITES)
                    .await
                    .expect("the writes table");
            })
            .await;
        Self {
            url: crate::support::database_url(),
            group,
            terms: terms().await,
            writes: writes_pool(SHARDS + 4),
            observer: manager("observer", 2),
        }
    }

    /// A watcher of `group` on the server at `url` (a cluster of the test's own, its term
    /// tables installed), where it creates the writes' table.
    pub(crate) async fn on(group: ShardGroup, url: &str) -> Self {
        connect(url)
            .await
            .batch_execute(WRITES)
            .await
            .expect("the writes table");
        Self {
            url: url.to_owned(),
            group,
            terms: PostgresShardTerms::new(pool_at(url, 8)),
            writes: writes_pool_at(url, SHARDS + 4),
            observer: manager_at(url, "observer", 2),
        }
    }

    pub(crate) async fn owners(&self) -> Shards {
        locks_shard::owners(&self.observer, &self.terms, &self.group)
            .await
            .expect("owners")
    }

    /// Waits until the shards are balanced over `members` members and each shard's
    /// owner's task has written; returns the owners and the time since `from`.
    pub(crate) async fn settled(
        &self,
        members: usize,
        from: Instant,
        within: Duration,
    ) -> (Shards, Duration) {
        self.settled_past(members, from, within, &BTreeMap::new())
            .await
    }

    /// As [`settled`](Self::settled), each shard under a token greater than its token in
    /// `past`: a term begun since then. Panics if a read on the way names a shard under
    /// its token in `past` or an older one (after a server restart: a member that joined
    /// again, its slot and holder the same, named with a term that no longer runs).
    pub(crate) async fn settled_past(
        &self,
        members: usize,
        from: Instant,
        within: Duration,
        past: &BTreeMap<String, i64>,
    ) -> (Shards, Duration) {
        loop {
            let owners = self.owners().await;
            let stale: Vec<(&String, i64)> = owners
                .shards
                .iter()
                .filter_map(|(shard, owner)| Some((shard, owner.as_ref()?.token)))
                .filter(|(shard, token)| past.get(*shard).is_some_and(|old| token <= old))
                .collect();
            assert!(
                stale.is_empty(),
                "named {:?} after {:?} under terms that no longer run: {stale:?}",
                owners.counts(),
                from.elapsed()
            );
            if owners.is_balanced() && owners.members.len() == members {
                let written = self.latest_written().await;
                let all_run = owners.shards.iter().all(|(shard, owner)| {
                    owner.as_ref().is_some_and(|o| {
                        written.get(shard) == Some(&o.token)
                            && past.get(shard).is_none_or(|&token| o.token > token)
                    })
                });
                if all_run {
                    return (owners, from.elapsed());
                }
            }
            assert!(
                from.elapsed() < within,
                "not settled on {members} members within {within:?}: {:?}",
                owners.counts()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The token of each shard's latest accepted write.
    async fn latest_written(&self) -> BTreeMap<String, i64> {
        let client = self.writes.get().await.expect("a connection");
        client
            .query(
                "SELECT shard, max(token) FROM shard_test_writes \
                 WHERE group_name = $1 AND accepted GROUP BY shard",
                &[&self.group.name()],
            )
            .await
            .expect("the writes")
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    }

    /// Accepted writes of one shard that came after a write with a newer token (two
    /// owners' tasks writing in between each other), and the refused writes of members
    /// other than `excused` (whose tasks may write until they hear that their sessions
    /// ended, and the guard must refuse those).
    pub(crate) async fn interleaved_and_refused(&self, excused: &[&str]) -> (i64, i64) {
        let excused: Vec<String> = excused.iter().map(|s| (*s).to_owned()).collect();
        let client = self.writes.get().await.expect("a connection");
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE accepted AND token < newest_before), \
                        count(*) FILTER (WHERE NOT accepted AND holder <> ALL($2)) \
                 FROM (SELECT token, accepted, holder, max(token) FILTER (WHERE accepted) OVER \
                         (PARTITION BY shard ORDER BY at ROWS BETWEEN UNBOUNDED PRECEDING \
                          AND 1 PRECEDING) AS newest_before \
                       FROM shard_test_writes WHERE group_name = $1) AS w",
                &[&self.group.name(), &excused],
            )
            .await
            .expect("the overlap query");
        (row.get(0), row.get(1))
    }

    /// Refused writes of `holder`.
    pub(crate) async fn refused_of(&self, holder: &str) -> i64 {
        let client = self.writes.get().await.expect("a connection");
        client
            .query_one(
                "SELECT count(*) FROM shard_test_writes \
                 WHERE group_name = $1 AND holder = $2 AND NOT accepted",
                &[&self.group.name(), &holder],
            )
            .await
            .expect("the refused writes")
            .get(0)
    }
}

/// A projection: a guarded progress write every 10 ms, each recorded with the server's
/// clock and whether the guard accepted it. Told to stop, it drains for 50 ms (it keeps
/// writing, as a projection applying its backlog would), then returns.
pub(crate) async fn progress(writes: Pool, holder: String, owned: Owned, stop: LostSignal) {
    let mut drained_at: Option<Instant> = None;
    loop {
        if let Ok(mut client) = writes.get().await
            && let Ok(tx) = client.transaction().await
        {
            let accepted = guard_write(&tx, &owned).await.unwrap_or(false);
            let record =
                "INSERT INTO shard_test_writes VALUES ($1, $2, $3, $4, clock_timestamp(), $5)";
            let params: [&(dyn locks_shard_postgres::tokio_postgres::types::ToSql + Sync); 5] = [
                &&*owned.group,
                &&*owned.shard,
                &owned.token,
                &holder,
                &accepted,
            ];
            // A refused write is recorded too (only the record, no progress).
            if tx.execute(record, &params).await.is_ok() {
                let _ = tx.commit().await;
            }
        }
        if stop.is_lost() {
            let until = *drained_at.get_or_insert_with(|| Instant::now() + DRAIN);
            if Instant::now() >= until {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
