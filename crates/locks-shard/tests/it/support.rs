//! A fleet of members on one in-memory table, and a recorder of each task's start and
//! stop on one sequence, from which overlaps are read.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_memory::{InMemoryLockManager, InMemoryLockTable};
use locks_port::LostSignal;
use locks_shard::{MemoryTerms, Owned, ShardGroup, ShardMember, Shards};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub(crate) const TICK: Duration = Duration::from_millis(5);

/// One task's life: `[start, stop)` on the recorder's sequence, and its start's instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Life {
    pub(crate) shard: usize,
    pub(crate) member: String,
    pub(crate) token: i64,
    pub(crate) start: u64,
    pub(crate) stop: Option<u64>,
    /// When the task started, by this process's clock.
    pub(crate) started_at: Instant,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Recorder {
    sequence: Arc<AtomicU64>,
    lives: Arc<Mutex<Vec<Life>>>,
}

/// Records the stop of a life when the task's future is dropped.
pub(crate) struct Alive {
    recorder: Recorder,
    index: usize,
}

impl Drop for Alive {
    fn drop(&mut self) {
        let at = self.recorder.sequence.fetch_add(1, Ordering::SeqCst);
        self.recorder.lives()[self.index].stop = Some(at);
    }
}

impl Recorder {
    fn lives(&self) -> std::sync::MutexGuard<'_, Vec<Life>> {
        self.lives.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn start(&self, member: &str, owned: &Owned) -> Alive {
        let mut lives = self.lives();
        let at = self.sequence.fetch_add(1, Ordering::SeqCst);
        lives.push(Life {
            shard: owned.index,
            member: member.to_owned(),
            token: owned.token,
            start: at,
            stop: None,
            started_at: Instant::now(),
        });
        Alive {
            recorder: self.clone(),
            index: lives.len() - 1,
        }
    }

    pub(crate) fn snapshot(&self) -> Vec<Life> {
        self.lives().clone()
    }

    /// Every pair of lives of one shard that overlap.
    pub(crate) fn overlaps(&self) -> Vec<(Life, Life)> {
        let lives = self.snapshot();
        let mut found = Vec::new();
        for (i, a) in lives.iter().enumerate() {
            for b in &lives[i + 1..] {
                let a_stop = a.stop.unwrap_or(u64::MAX);
                let b_stop = b.stop.unwrap_or(u64::MAX);
                if a.shard == b.shard && a.start < b_stop && b.start < a_stop {
                    found.push((a.clone(), b.clone()));
                }
            }
        }
        found
    }

    /// The member running each shard's task now.
    pub(crate) fn running(&self) -> BTreeMap<usize, String> {
        self.snapshot()
            .into_iter()
            .filter(|life| life.stop.is_none())
            .map(|life| (life.shard, life.member))
            .collect()
    }
}

/// How a task behaves when told to stop for a hand-off.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Drain {
    /// Returns at once.
    Prompt,
    /// Returns after this long (still inside a grace above it).
    Slow(Duration),
    /// Never returns: dropped when the grace runs out.
    Never,
}

pub(crate) struct Fleet {
    pub(crate) table: InMemoryLockTable,
    pub(crate) terms: MemoryTerms,
    pub(crate) group: ShardGroup,
    pub(crate) recorder: Recorder,
    pub(crate) drain: Drain,
    pub(crate) grace: Duration,
    /// The members' takeover delay (20 ms unless a test needs it to show).
    pub(crate) takeover: Duration,
    /// The tick of the members that join next ([`TICK`] unless a test needs one slow).
    pub(crate) tick: Duration,
    members: BTreeMap<String, Member>,
}

pub(crate) struct Member {
    pub(crate) manager: InMemoryLockManager,
    leave: Option<oneshot::Sender<()>>,
    handle: JoinHandle<()>,
}

impl Fleet {
    pub(crate) fn new(shards: usize) -> Self {
        Self {
            table: InMemoryLockTable::new(),
            terms: MemoryTerms::new(),
            group: ShardGroup::new("projections", (0..shards).map(|i| format!("tenant-{i}")))
                .expect("a group"),
            recorder: Recorder::default(),
            drain: Drain::Prompt,
            grace: Duration::from_secs(2),
            takeover: Duration::from_millis(20),
            tick: TICK,
            members: BTreeMap::new(),
        }
    }

    pub(crate) fn member(&self, name: &str) -> ShardMember<InMemoryLockManager, MemoryTerms> {
        self.member_on(self.table.manager_with_holder_id(name))
    }

    fn member_on(
        &self,
        manager: InMemoryLockManager,
    ) -> ShardMember<InMemoryLockManager, MemoryTerms> {
        ShardMember::new(manager, self.terms.clone(), self.group.clone())
            .tick(self.tick)
            .backoff(TICK)
            .drain_grace(self.grace)
            .takeover_delay(self.takeover)
    }

    pub(crate) fn join(&mut self, name: &str) {
        let manager = self.table.manager_with_holder_id(name);
        let member = self.member_on(manager.clone());
        let (leave, left) = oneshot::channel::<()>();
        let recorder = self.recorder.clone();
        let drain = self.drain;
        let who = name.to_owned();
        let handle = tokio::spawn(async move {
            let task = move |owned: Owned, stop: LostSignal| {
                let alive = recorder.start(&who, &owned);
                async move {
                    let _alive = alive;
                    stop.await;
                    match drain {
                        Drain::Prompt => {}
                        Drain::Slow(pause) => tokio::time::sleep(pause).await,
                        Drain::Never => std::future::pending::<()>().await,
                    }
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
        self.members.insert(
            name.to_owned(),
            Member {
                manager,
                leave: Some(leave),
                handle,
            },
        );
    }

    /// A clean leave: waits until the member has handed everything over.
    pub(crate) async fn leave(&mut self, name: &str) {
        let mut member = self.members.remove(name).expect("a member");
        if let Some(leave) = member.leave.take() {
            let _ = leave.send(());
        }
        (&mut member.handle).await.expect("the member left");
    }

    /// An unclean end: the member's `run` is dropped.
    pub(crate) async fn abort(&mut self, name: &str) {
        let member = self.members.remove(name).expect("a member");
        member.handle.abort();
        let _ = member.handle.await;
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    pub(crate) fn get(&self, name: &str) -> &Member {
        &self.members[name]
    }

    /// Waits until every shard runs, balanced over the members, and the owners agree
    /// with the tasks running; returns the owners and how long it took.
    pub(crate) async fn settled(&self, within: Duration) -> (Shards, Duration) {
        let started = Instant::now();
        let watcher = self.member("observer");
        loop {
            let owners = watcher.owners().await.expect("owners");
            let running = self.recorder.running();
            let members = self.members.len();
            if owners.is_balanced()
                && owners.members.len() == members
                && running.len() == self.group.len()
                && owners.shards.iter().enumerate().all(|(i, (_, owner))| {
                    owner.as_ref().and_then(|o| o.holder_id.as_deref())
                        == running.get(&i).map(String::as_str)
                })
            {
                return (owners, started.elapsed());
            }
            assert!(
                started.elapsed() < within,
                "not settled within {within:?}: {:?}; running {running:?}",
                owners.counts()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// The shards whose running member differs between two readings.
pub(crate) fn moved(before: &BTreeMap<usize, String>, after: &BTreeMap<usize, String>) -> usize {
    after
        .iter()
        .filter(|(shard, member)| before.get(shard) != Some(member))
        .count()
}
