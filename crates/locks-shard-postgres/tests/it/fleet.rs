//! Several members in one process, each on its own manager and pool, dividing 24 shards
//! on the test server. Every task writes its progress through `guard_write` every few
//! milliseconds and records each write with the server's `clock_timestamp()`; the
//! records say whether two owners of a shard ever wrote in between each other.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_shard::locks_port::LostSignal;
use locks_shard::{Owned, ShardMember, Shards};
use locks_shard_postgres::guard_write;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::record::{SHARDS, Watcher, group, progress};
use crate::support::{admin, manager_at, unique};

const SETTLE: Duration = Duration::from_secs(20);
/// The members' tick.
pub(crate) const TICK: Duration = Duration::from_millis(50);
/// The members' back-off before joining again after a failed join.
pub(crate) const BACKOFF: Duration = Duration::from_millis(200);

/// One task's life in this process: its member, shard and token, and whether its
/// future was dropped (or returned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Life {
    pub(crate) member: String,
    pub(crate) shard: String,
    pub(crate) token: i64,
    pub(crate) stopped: bool,
    /// When the task was started and when its future was dropped (or returned).
    pub(crate) from: Instant,
    pub(crate) until: Option<Instant>,
}

/// Marks a life stopped when the task's future is dropped.
struct Alive {
    lives: Arc<Mutex<Vec<Life>>>,
    index: usize,
}

impl Drop for Alive {
    fn drop(&mut self) {
        let life = &mut self.lives.lock().unwrap_or_else(PoisonError::into_inner)[self.index];
        life.stopped = true;
        life.until = Some(Instant::now());
    }
}

pub(crate) struct Fleet {
    pub(crate) watcher: Watcher,
    /// The latest term each member's tasks were handed, by holder.
    handed: Arc<Mutex<BTreeMap<String, Owned>>>,
    /// Every task started, in start order.
    lives: Arc<Mutex<Vec<Life>>>,
    members: BTreeMap<String, (oneshot::Sender<()>, JoinHandle<()>)>,
    /// The renewal expiry of members joined from now on.
    pub(crate) renewal: Option<Duration>,
}

impl Fleet {
    pub(crate) async fn new() -> Self {
        Self::watched(Watcher::new(group(&unique("fleet"))).await)
    }

    /// A fleet on the server at `url` (a cluster of the test's own, its term tables
    /// installed) instead of the test server.
    pub(crate) async fn on(url: &str) -> Self {
        Self::watched(Watcher::on(group(&unique("fleet")), url).await)
    }

    fn watched(watcher: Watcher) -> Self {
        Self {
            watcher,
            handed: Arc::default(),
            lives: Arc::default(),
            members: BTreeMap::new(),
            renewal: Some(locks_shard::DEFAULT_RENEWAL_EXPIRY),
        }
    }

    /// Every task started so far, in start order.
    pub(crate) fn lives(&self) -> Vec<Life> {
        self.lives
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn join(&mut self, name: &str) {
        let member = ShardMember::new(
            manager_at(&self.watcher.url, name, SHARDS + 4),
            self.watcher.terms.clone(),
            self.watcher.group.clone(),
        )
        .tick(TICK)
        .backoff(BACKOFF)
        .renewal(self.renewal);
        let writes = self.watcher.writes.clone();
        let handed = Arc::clone(&self.handed);
        let lives = Arc::clone(&self.lives);
        let holder = name.to_owned();
        let (leave, left) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            let task = move |owned: Owned, stop: LostSignal| {
                handed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(holder.clone(), owned.clone());
                let alive = {
                    let mut all = lives.lock().unwrap_or_else(PoisonError::into_inner);
                    all.push(Life {
                        member: holder.clone(),
                        shard: owned.shard.to_string(),
                        token: owned.token,
                        stopped: false,
                        from: Instant::now(),
                        until: None,
                    });
                    Alive {
                        lives: Arc::clone(&lives),
                        index: all.len() - 1,
                    }
                };
                let work = progress(writes.clone(), holder.clone(), owned, stop);
                async move {
                    let _alive = alive;
                    work.await;
                }
            };
            let shutdown = async {
                let _ = left.await;
            };
            member
                .run_until(task, shutdown)
                .await
                .expect("the member ran");
        });
        self.members.insert(name.to_owned(), (leave, handle));
    }

    pub(crate) async fn leave(&mut self, name: &str) {
        let (leave, handle) = self.members.remove(name).expect("a member");
        let _ = leave.send(());
        handle.await.expect("the member left");
    }

    pub(crate) async fn leave_all(&mut self) {
        let names: Vec<String> = self.members.keys().cloned().collect();
        for name in names {
            self.leave(&name).await;
        }
    }

    pub(crate) async fn settled(&self, members: usize, from: Instant) -> (Shards, Duration) {
        self.watcher.settled(members, from, SETTLE).await
    }
}

pub(crate) fn holders(owners: &Shards) -> BTreeMap<String, Option<String>> {
    owners
        .shards
        .iter()
        .map(|(shard, owner)| {
            (
                shard.clone(),
                owner.as_ref().and_then(|o| o.holder_id.clone()),
            )
        })
        .collect()
}

/// The token of each shard `holder` owns in `owners`.
pub(crate) fn terms_of(owners: &Shards, holder: &str) -> BTreeMap<String, i64> {
    owners
        .shards
        .iter()
        .filter_map(|(shard, owner)| {
            let owner = owner.as_ref()?;
            (owner.holder_id.as_deref() == Some(holder)).then(|| (shard.clone(), owner.token))
        })
        .collect()
}

fn moved(before: &Shards, after: &Shards) -> usize {
    let (before, after) = (holders(before), holders(after));
    after
        .iter()
        .filter(|(shard, holder)| before.get(*shard) != Some(holder))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_go_1_3_5_2_4_balanced_sticky_and_no_two_owners_write_in_between() {
    let mut fleet = Fleet::new().await;
    let started = Instant::now();
    fleet.join("m1");
    let (mut owners, took) = fleet.settled(1, started).await;
    eprintln!("m1 alone: all 24 running after {took:?}");
    let mut count = 1;
    let changes = [
        ("m2", true),
        ("m3", true),
        ("m4", true),
        ("m5", true),
        ("m3", false),
        ("m4", false),
        ("m5", false),
    ];
    for (name, joins) in changes {
        let from = Instant::now();
        let leaver_had = holders(&owners)
            .values()
            .filter(|h| h.as_deref() == Some(name))
            .count();
        if joins {
            fleet.join(name);
            count += 1;
        } else {
            fleet.leave(name).await;
            count -= 1;
        }
        let (after, took) = fleet.settled(count, from).await;
        let moves = moved(&owners, &after);
        let counts: Vec<usize> = after.counts().into_iter().map(|(_, n)| n).collect();
        eprintln!(
            "{} {name}: {count} members {counts:?}, {moves} moved, settled after {took:?}",
            if joins { "join" } else { "leave" }
        );
        if joins {
            let share = holders(&after)
                .values()
                .filter(|h| h.as_deref() == Some(name))
                .count();
            assert!(
                moves <= share,
                "the join of {name} moved {moves}, its share is {share}"
            );
        } else {
            assert_eq!(
                moves, leaver_had,
                "a clean leave moves only the leaver's shards"
            );
        }
        owners = after;
    }

    // m2's every session terminated by the server: its shards move (it rejoins), each to
    // a term begun after the termination. (Settled alone could be read before m2 was
    // told: the same two members, each shard's latest write under its term.)
    let m2_terms = terms_of(&owners, "m2");
    let stale = fleet
        .handed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get("m2")
        .cloned()
        .expect("m2 ran a task");
    let from = Instant::now();
    let terminated: i64 = admin()
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'locks:m2'",
            &[],
        )
        .await
        .expect("terminate")
        .get(0);
    assert!(terminated > 0, "m2 had sessions");
    let (after, took) = fleet.watcher.settled_past(2, from, SETTLE, &m2_terms).await;
    eprintln!(
        "terminate m2 ({terminated} sessions): every shard running again after {took:?}, {:?}",
        after.counts()
    );
    // The old owner's write, were it to wake now, is refused by the token.
    let mut client = fleet.watcher.writes.get().await.expect("a connection");
    let tx = client.transaction().await.expect("begin");
    assert!(
        !guard_write(&tx, &stale).await.expect("guard"),
        "a stale owner's write was accepted"
    );
    tx.rollback().await.expect("rollback");
    owners = after;

    for name in ["m6", "m7"] {
        let from = Instant::now();
        fleet.join(name);
        count += 1;
        let (after, took) = fleet.settled(count, from).await;
        let moves = moved(&owners, &after);
        let share = holders(&after)
            .values()
            .filter(|h| h.as_deref() == Some(name))
            .count();
        eprintln!("join {name}: {count} members, {moves} moved, settled after {took:?}");
        assert!(
            moves <= share,
            "the join of {name} moved {moves}, its share is {share}"
        );
        owners = after;
    }
    fleet.leave_all().await;
    let (interleaved, refused) = fleet.watcher.interleaved_and_refused(&["m2"]).await;
    eprintln!("{interleaved} interleaved writes, {refused} refused outside m2's termination");
    assert_eq!(
        interleaved, 0,
        "two owners of a shard wrote in between each other"
    );
    assert_eq!(
        refused, 0,
        "a task wrote after its shard's next term began: it was not stopped first"
    );
    let nobody = fleet.watcher.owners().await;
    assert!(nobody.shards.iter().all(|(_, owner)| owner.is_none()));
    assert!(nobody.members.is_empty());
}
