//! On PostgreSQL, the waits a member keeps between its ticks: a joiner queued on the
//! shards the owner sheds to it, and a survivor woken by the end of a watched member's
//! presence lock. The survivor ticks every 600 s: only those waits can move the shards
//! within the test.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_shard::{ShardGroup, ShardMember};
use tokio::task::JoinHandle;

use crate::support::{admin, manager, terms, unique};

const SHARDS: usize = 8;
const WITHIN: Duration = Duration::from_secs(10);

/// The member running each shard's task now.
type Running = Arc<Mutex<BTreeMap<usize, String>>>;

struct Alive(Running, usize);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.1);
    }
}

fn start(
    holder: &str,
    group: &ShardGroup,
    terms: &locks_shard_postgres::PostgresShardTerms,
    tick: Duration,
    running: &Running,
) -> JoinHandle<()> {
    // A long back-off: a member whose sessions were ended does not join again in the test.
    let member = ShardMember::new(manager(holder, SHARDS + 6), terms.clone(), group.clone())
        .tick(tick)
        .backoff(Duration::from_secs(600));
    let (who, running) = (holder.to_owned(), Arc::clone(running));
    tokio::spawn(async move {
        let _ = member
            .run(move |owned, stop| {
                running
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(owned.index, who.clone());
                let alive = Alive(Arc::clone(&running), owned.index);
                async move {
                    let _alive = alive;
                    stop.await;
                }
            })
            .await;
    })
}

async fn until_runs(running: &Running, holder: &str, count: usize, what: &str) -> Duration {
    let from = Instant::now();
    loop {
        let now: BTreeMap<usize, String> = running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if now.values().filter(|m| *m == holder).count() == count {
            return from.elapsed();
        }
        assert!(from.elapsed() < WITHIN, "{what}: running {now:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_gets_its_share_from_its_claims_and_a_survivor_wakes_at_a_death() {
    let name = unique("wake");
    let group = ShardGroup::new(&name, (0..SHARDS).map(|i| format!("t{i}"))).expect("a group");
    let terms = terms().await;
    let running: Running = Arc::default();
    let (b, a) = (unique("wake-b"), unique("wake-a"));
    let run_b = start(&b, &group, &terms, Duration::from_millis(20), &running);
    until_runs(&running, &b, SHARDS, "b alone took every shard").await;

    // a's first tick finds every shard busy (b drains the ones it sheds): only its
    // claims, granted as b releases, bring it its share before its next tick (600 s).
    let run_a = start(&a, &group, &terms, Duration::from_secs(600), &running);
    let took = until_runs(&running, &a, SHARDS / 2, "a waited for its next tick").await;
    eprintln!("a joined: its share ran after {took:?}");

    // b's every session ended by the server, as at a crash: a is granted b's presence
    // lock, ticks, and takes b's shards (after b's recorded loss notice, 100 ms).
    let from = Instant::now();
    let terminated: i64 = admin()
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&format!("locks:{b}")],
        )
        .await
        .expect("terminate")
        .get(0);
    assert!(terminated > 0, "b had sessions");
    until_runs(&running, &a, SHARDS, "a waited for its next tick").await;
    let took = from.elapsed();
    eprintln!("b's {terminated} sessions ended: a ran every shard after {took:?}");
    run_a.abort();
    run_b.abort();
    let _ = (run_a.await, run_b.await);
}
