//! Failovers made by Patroni, as users run it: etcd and two PostgreSQL nodes under Patroni
//! in synchronous mode (`throwaway_pg::PatroniCluster`), the manager on the multi-host URL
//! with `target_session_attrs=read-write` and fencing on. One cluster goes through a crash
//! of the primary's postmaster (`kill -9`), a `patronictl switchover` and a `patronictl
//! failover`; after each: every holder told within the bound, new acquisitions on the
//! primary Patroni names within the failover bound, nothing granted on the other node,
//! fencing tokens strictly above every token before. Two more clusters have their primary
//! cut off while clients still reach it: its Patroni frozen (`frozen.rs`, which resumes it
//! with its link to etcd down), or its network to etcd and the other node cut
//! (`partition.rs`, which then brings the link back and follows the old primary until it
//! streams from the new one); both in network namespaces, as root. Its own test binary
//! (run by `cargo xtask test --ha`): it needs Patroni and etcd and starts its own clusters.

mod frozen;
mod partition;

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard};
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres;
use locks_postgres::{PostgresLockGuard, PostgresLockManager};
use throwaway_pg::PatroniCluster;
use throwaway_pg::testing::granted_advisory_locks;

/// Holders of a lock learn of its loss within this, once the old primary's sessions end
/// (the README's bound for a failover that closes connections).
const TOLD: Duration = Duration::from_secs(5);
/// A new acquisition succeeds within this after the fault: Patroni's TTL (20 s), its
/// loop and the restart or promotion, with room for a loaded machine.
const FAILOVER: Duration = Duration::from_secs(45);
/// The keepalive the manager runs with.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// Locks held across each fault.
const HELD: usize = 4;

fn pool(url: &str, size: usize) -> Pool {
    let config = tokio_postgres::Config::from_str(url).expect("a valid URL");
    locks_postgres::plain_pool_with_config(config, size).expect("pool")
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("a blocking task")
}

fn keys(phase: &str) -> Vec<String> {
    (0..HELD)
        .map(|n| format!("patroni:{phase}:{}:{n}", std::process::id()))
        .collect()
}

/// A `patronictl` hand-over, retried while Patroni refuses it (its synchronous standby
/// is named a moment after the standby streams again).
fn retried(hand_over: impl Fn() -> Result<(), throwaway_pg::Error>) {
    let started = Instant::now();
    loop {
        match hand_over() {
            Ok(()) => return,
            Err(error) if started.elapsed() < Duration::from_secs(30) => {
                eprintln!("retrying the hand-over: {error}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(error) => panic!("the hand-over: {error}"),
        }
    }
}

/// What one fault did, measured.
#[derive(Debug)]
struct Figures {
    phase: &'static str,
    leader_before: usize,
    leader_after: usize,
    /// From the fault until the last holder was told.
    told: Duration,
    /// From the fault until the first new lock was granted.
    first_new_lock: Duration,
    /// The highest token before and the lowest after, over the phase's keys.
    highest_before: i64,
    lowest_after: i64,
}

/// Granted advisory locks on node `node`, asked of that node alone; `None` when it does
/// not answer (restarting).
async fn granted_on(cluster: &PatroniCluster, node: usize) -> Option<i64> {
    let url = cluster.url(node);
    let (client, connection) = tokio::time::timeout(
        Duration::from_secs(2),
        tokio_postgres::connect(&url, tokio_postgres::NoTls),
    )
    .await
    .ok()?
    .ok()?;
    tokio::spawn(connection);
    Some(granted_advisory_locks(&client).await)
}

/// Holds the phase's keys, runs `fault`, and measures what the README promises.
async fn through(
    cluster: &Arc<PatroniCluster>,
    manager: &PostgresLockManager,
    phase: &'static str,
    fault: impl FnOnce(&PatroniCluster, usize) + Send + 'static,
) -> Figures {
    let leader_before = {
        let cluster = cluster.clone();
        blocking(move || cluster.wait_until_replicating(Duration::from_secs(120)))
            .await
            .expect("a leader and a synchronous standby before the fault")
    };
    let keys = keys(phase);
    let mut guards: Vec<PostgresLockGuard> = Vec::new();
    for key in &keys {
        guards.push(
            manager
                .acquire(key, AcquireOptions::new().with_timeout(FAILOVER))
                .await
                .expect("a lock before the fault"),
        );
    }
    let highest_before = guards
        .iter()
        .map(|guard| guard.info().fencing_token().expect("fencing is on"))
        .max()
        .expect("locks");
    assert_eq!(
        granted_on(cluster, leader_before).await,
        Some(i64::try_from(HELD).expect("small")),
        "{phase}: the locks are on the leader"
    );
    assert_eq!(
        granted_on(cluster, 1 - leader_before).await,
        Some(0),
        "{phase}: nothing granted on the standby"
    );

    let started = Instant::now();
    let faulted = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || fault(&cluster, leader_before))
    };
    let mut told = Duration::ZERO;
    for guard in &guards {
        let lost = guard.lost();
        tokio::time::timeout(TOLD + FAILOVER, lost)
            .await
            .unwrap_or_else(|_| panic!("{phase}: a holder was never told"));
        told = told.max(started.elapsed());
    }
    faulted.await.expect("the fault");

    // New acquisitions: retried until the primary Patroni names takes them.
    let mut first_new_lock = None;
    let mut after = Vec::new();
    for key in &keys {
        let guard = loop {
            match manager
                .acquire(
                    key,
                    AcquireOptions::new().with_timeout(Duration::from_secs(2)),
                )
                .await
            {
                Ok(guard) => break guard,
                Err(error) => {
                    assert!(
                        started.elapsed() < FAILOVER,
                        "{phase}: no acquisition within {FAILOVER:?}: {error}"
                    );
                    assert_ne!(
                        error.kind(),
                        AcquisitionErrorKind::Configuration,
                        "{phase}: {error}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        first_new_lock.get_or_insert_with(|| started.elapsed());
        after.push(guard);
    }
    let leader_after = {
        let cluster = cluster.clone();
        blocking(move || cluster.leader())
            .await
            .expect("a leader after the fault")
    };
    assert_eq!(
        granted_on(cluster, leader_after).await,
        Some(i64::try_from(HELD).expect("small")),
        "{phase}: the new locks are on the node Patroni names primary"
    );
    // The other node may be down or rewinding; when it answers, it holds nothing.
    let other = granted_on(cluster, 1 - leader_after).await;
    assert!(
        matches!(other, None | Some(0)),
        "{phase}: a lock granted on the node that is not the primary: {other:?}"
    );
    let lowest_after = after
        .iter()
        .map(|guard| guard.info().fencing_token().expect("fencing is on"))
        .min()
        .expect("locks");
    for guard in after {
        guard.release().await;
    }
    drop(guards);
    Figures {
        phase,
        leader_before,
        leader_after,
        told,
        first_new_lock: first_new_lock.expect("locks"),
        highest_before,
        lowest_after,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patroni_crash_switchover_and_failover() {
    let cluster = Arc::new(
        blocking(|| PatroniCluster::start().expect("start etcd and two Patroni nodes")).await,
    );
    let url = cluster.multi_host_url();
    let setup = pool(&url, 1);
    locks_postgres::install_fencing(&setup.get().await.expect("a connection"))
        .await
        .expect("install the fencing table");
    drop(setup);
    let manager = PostgresLockManager::builder(pool(&url, HELD * 2))
        .holder_id("patroni-test")
        .keepalive(Some(KEEPALIVE))
        .fencing(true)
        .build();

    // A manager on the standby alone is refused: it grants nothing there.
    let leader = cluster.leader().expect("a leader");
    let on_standby = PostgresLockManager::new(pool(&cluster.url(1 - leader), 1));
    let refused = on_standby
        .acquire("patroni:standby", AcquireOptions::new())
        .await
        .expect_err("a standby grants no lock");
    assert_eq!(
        refused.kind(),
        AcquisitionErrorKind::Configuration,
        "{refused}"
    );

    let mut figures = Vec::new();
    figures.push(
        through(
            &cluster,
            &manager,
            "kill -9 postmaster",
            |cluster, leader| {
                cluster
                    .kill_postmaster(leader)
                    .expect("kill the postmaster");
            },
        )
        .await,
    );
    figures.push(
        through(&cluster, &manager, "switchover", |cluster, leader| {
            retried(|| cluster.switchover(1 - leader));
        })
        .await,
    );
    figures.push(
        through(&cluster, &manager, "failover", |cluster, leader| {
            retried(|| cluster.failover(1 - leader));
        })
        .await,
    );
    for figure in &figures {
        eprintln!("{figure:?}");
        assert!(figure.told <= TOLD, "{}: {figure:?}", figure.phase);
        assert!(figure.first_new_lock <= FAILOVER, "{figure:?}");
        assert!(
            figure.lowest_after > figure.highest_before,
            "fencing tokens must grow: {figure:?}"
        );
    }
    assert_ne!(
        figures[1].leader_after, figures[1].leader_before,
        "{figures:?}"
    );
    assert_ne!(
        figures[2].leader_after, figures[2].leader_before,
        "{figures:?}"
    );
    drop(manager);
    blocking(move || drop(cluster)).await;
}

/// A [`PatroniCluster::start_partitionable`] pair (as root), node 0 leading: the node a
/// link cut separates from etcd and node 1.
async fn partitionable() -> Arc<PatroniCluster> {
    let cluster = Arc::new(
        blocking(|| {
            PatroniCluster::start_partitionable().unwrap_or_else(|error| {
                panic!("start the Patroni pair in network namespaces (needs root): {error}")
            })
        })
        .await,
    );
    assert_eq!(cluster.leader(), Some(0), "node 0 bootstraps and leads");
    cluster
}

/// A session on node `node` alone, with the protected table's writes.
async fn session_on(cluster: &PatroniCluster, node: usize) -> tokio_postgres::Client {
    throwaway_pg::testing::connect(&cluster.url(node)).await
}

/// Installs the fencing table on node `node` (the primary) and the protected data: one
/// row for `key` at token 0.
async fn protect(cluster: &PatroniCluster, node: usize, key: &str) {
    let setup = session_on(cluster, node).await;
    locks_postgres::install_fencing(&setup)
        .await
        .expect("install the fencing table");
    setup
        .batch_execute(
            "CREATE TABLE patroni_protected (key text PRIMARY KEY, token bigint NOT NULL)",
        )
        .await
        .expect("the protected table");
    setup
        .execute("INSERT INTO patroni_protected VALUES ($1, 0)", &[&key])
        .await
        .expect("the protected row");
}

/// The holder the cut makes stale: `key` held through `url` with fencing on, its token
/// written to the protected row on node `node`. Answers its manager, guard, token and
/// session on `node`.
async fn stale_holder(
    cluster: &PatroniCluster,
    node: usize,
    url: &str,
    key: &str,
) -> (
    PostgresLockManager,
    PostgresLockGuard,
    i64,
    tokio_postgres::Client,
) {
    let manager = fenced(url);
    let held = manager
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("the lock before the cut");
    let token = held.info().fencing_token().expect("fencing is on");
    let session = session_on(cluster, node).await;
    assert_eq!(
        fenced_write(&session, key, token)
            .await
            .expect("the holder's write before the cut"),
        1
    );
    (manager, held, token, session)
}

/// On the new primary, through `session`: the new holder's fenced write lands, the
/// stale holder's (an older token) is refused.
async fn new_write_lands_stale_refused(
    session: &tokio_postgres::Client,
    key: &str,
    new_token: i64,
    stale_token: i64,
) {
    let new = fenced_write(session, key, new_token).await;
    assert_eq!(new.expect("the new holder's write"), 1);
    let stale = fenced_write(session, key, stale_token).await;
    assert_eq!(
        stale.expect("the stale holder's write"),
        0,
        "the stale write refused"
    );
}

/// A manager with fencing and keepalive on `url`.
fn fenced(url: &str) -> PostgresLockManager {
    PostgresLockManager::builder(pool(url, 2))
        .keepalive(Some(KEEPALIVE))
        .fencing(true)
        .build()
}

/// The fenced write a holder makes to the protected data: applied only while the row
/// carries an older token. Answers how many rows it changed.
async fn fenced_write(
    client: &tokio_postgres::Client,
    key: &str,
    token: i64,
) -> Result<u64, tokio_postgres::Error> {
    client
        .execute(
            "UPDATE patroni_protected SET token = $2 WHERE key = $1 AND token < $2",
            &[&key, &token],
        )
        .await
}
