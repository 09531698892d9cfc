//! A member cut off from the server (a network namespace whose link goes down: no FIN, no
//! RST) while it owns half the shards: it stops its own tasks when its renewals stop
//! being confirmed, and only after that does the member on the other side of the cut end
//! its sessions and take its shards.
//!
//! The server runs in the near namespace (a child process of this test binary), the
//! cut-off member in the far one (another child), and the other member in this process
//! through the server's Unix socket, which no cut touches. It needs root (`ip netns`);
//! where namespaces cannot be made it fails and says so. Its own test binary: it starts
//! its own cluster inside the namespace.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_shard::{ShardGroup, ShardMember};
use locks_shard_postgres::{PostgresShardTerms, install_shard_terms};
use throwaway_pg::testing::child::{entry, env, say};
use throwaway_pg::testing::near::{InNamespace, NearServer, serve};

const ROLE: &str = "SHARD_PARTITION_ROLE";
const URL: &str = "SHARD_PARTITION_URL";
const SHARDS: usize = 24;
/// The members' renewal expiry: the cut-off member stops its tasks 0.8 times this after
/// its last confirmed renewal, the other ends its sessions 1 to 1.2 times this after it.
const EXPIRY: Duration = Duration::from_secs(4);
/// How long the test waits for the shards to move at most.
const PATIENCE: Duration = Duration::from_secs(30);
const TAKEOVER: Duration = Duration::from_millis(500);

fn group() -> ShardGroup {
    ShardGroup::new("partitioned", (0..SHARDS).map(|i| format!("tenant-{i}"))).expect("a group")
}

fn member(
    pool_url: &str,
    holder: &str,
    lease: Option<Duration>,
) -> ShardMember<PostgresLockManager, PostgresShardTerms> {
    let pool = locks_postgres::plain_pool(pool_url, SHARDS + 4).expect("a pool");
    let locks = PostgresLockManager::builder(pool.clone())
        .holder_id(holder)
        .lease(lease)
        .try_build()
        .expect("a manager");
    let terms = PostgresShardTerms::new(locks_postgres::plain_pool(pool_url, 4).expect("a pool"))
        .answer_timeout(Duration::from_secs(1));
    ShardMember::new(locks, terms, group())
        .tick(Duration::from_millis(50))
        .backoff(Duration::from_millis(200))
        .takeover_delay(TAKEOVER)
        .renewal(Some(EXPIRY))
}

/// Says `stopped SHARD` when its task's future is dropped.
struct SayStopped(String);

impl Drop for SayStopped {
    fn drop(&mut self) {
        say(&format!("stopped {}", self.0));
    }
}

#[test]
fn child_entry() {
    entry(ROLE, |role, runtime| match role {
        "server" => serve(|_, _| ((), Vec::new())),
        "member" => runtime.block_on(async {
            // No lease (ADR 0016) and so no keepalive: nothing but its renewal deadline
            // tells this member that it is cut off.
            let member = member(&env(URL), "far", None);
            let _ = member
                .run(|owned, _stop| {
                    say(&format!("running {}", owned.shard));
                    let stopped = SayStopped(owned.shard.to_string());
                    async move {
                        let _stopped = stopped;
                        // Ignores its stop: only a drop ends it (a hand-off drains 5 s).
                        std::future::pending::<()>().await;
                    }
                })
                .await;
        }),
        other => panic!("unknown {ROLE} {other:?}"),
    });
}

/// What the far member said: the shards it runs, and when each stopped (as this process
/// read it, which is after it stopped).
#[derive(Debug, Default)]
struct Far {
    running: BTreeMap<String, bool>,
    stopped: BTreeMap<String, Instant>,
}

impl Far {
    fn read(&mut self, far: &InNamespace, within: Duration) {
        while let Ok((at, message)) = far.poll(within) {
            if let Some(shard) = message.strip_prefix("running ") {
                self.running.insert(shard.to_owned(), true);
                self.stopped.remove(shard);
            } else if let Some(shard) = message.strip_prefix("stopped ") {
                self.running.insert(shard.to_owned(), false);
                self.stopped.insert(shard.to_owned(), at);
            }
        }
    }

    fn owned(&self) -> Vec<String> {
        self.running
            .iter()
            .filter(|(_, running)| **running)
            .map(|(shard, _)| shard.clone())
            .collect()
    }
}

#[test]
fn a_cut_off_member_stops_its_tasks_before_the_other_takes_its_shards() {
    let server = NearServer::start("shards", 131, "child_entry", &[(ROLE, "server")]);
    let (socket_url, far_url) = (server.socket_url(), server.far_url(None));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let pool = locks_postgres::plain_pool(&socket_url, 1).expect("a pool");
        install_shard_terms(&pool.get().await.expect("a connection"))
            .await
            .expect("install");
    });
    let far = InNamespace::spawn(
        server.pair().far(),
        "child_entry",
        &[(ROLE, "member"), (URL, far_url.as_str())],
    );
    let mut seen = Far::default();
    let started = Instant::now();
    while seen.owned().len() < SHARDS {
        seen.read(&far, Duration::from_millis(50));
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the far member ran {:?}",
            seen.owned()
        );
    }

    // The near member joins: the far one hands half over (after its 5 s drain, as its
    // tasks ignore their stop).
    let near_started: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let near = member(&socket_url, "near", None);
    let record = Arc::clone(&near_started);
    let near_run = runtime.spawn(async move {
        let _ = near
            .run(move |owned, _stop| {
                record
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(owned.shard.to_string(), Instant::now());
                std::future::pending::<()>()
            })
            .await;
    });
    let near_count = || {
        near_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    };
    let started = Instant::now();
    while seen.owned().len() > SHARDS / 2 || near_count() < SHARDS / 2 {
        seen.read(&far, Duration::from_millis(50));
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not balanced: far {:?}",
            seen.owned()
        );
    }
    let far_owned = seen.owned();
    assert_eq!(far_owned.len(), SHARDS / 2);
    // Settle: no hand-off in flight.
    seen.read(&far, Duration::from_millis(500));
    let before_cut = near_started
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();

    server.cut();
    let cut = Instant::now();
    loop {
        seen.read(&far, Duration::from_millis(50));
        let near_now = near_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let taken = far_owned.iter().all(|shard| near_now.contains_key(shard));
        if taken
            && far_owned
                .iter()
                .all(|shard| seen.stopped.contains_key(shard))
        {
            break;
        }
        assert!(
            cut.elapsed() < PATIENCE,
            "after {:?}: the far member stopped {:?}, the near one took {:?}",
            cut.elapsed(),
            seen.stopped.keys().collect::<Vec<_>>(),
            near_now
                .keys()
                .filter(|s| !before_cut.contains_key(*s))
                .collect::<Vec<_>>()
        );
    }
    let near_now = near_started
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let last_stop = far_owned
        .iter()
        .map(|s| seen.stopped[s])
        .max()
        .expect("stops");
    let first_take = far_owned.iter().map(|s| near_now[s]).min().expect("takes");
    let last_take = far_owned.iter().map(|s| near_now[s]).max().expect("takes");
    println!(
        "cut-off member stopped its tasks {:?} after the cut; the other took the first of \
         them {:?} and all {:?} after it",
        last_stop - cut,
        first_take - cut,
        last_take - cut
    );
    for shard in &far_owned {
        assert!(
            seen.stopped[shard] < near_now[shard],
            "{shard}: the near member started it {:?} after the cut, the far one stopped it \
             {:?} after",
            near_now[shard] - cut,
            seen.stopped[shard] - cut
        );
    }
    let bound = EXPIRY + EXPIRY / 5 + TAKEOVER + Duration::from_secs(2);
    assert!(
        last_take - cut <= bound,
        "the cut-off member's shards ran again {:?} after the cut (bound {bound:?})",
        last_take - cut
    );
    near_run.abort();
    drop(far);
    drop(server);
}
