//! Failovers made by Patroni, as users run it: etcd and two PostgreSQL nodes under Patroni
//! in synchronous mode (`throwaway_pg::PatroniCluster`), the manager on the multi-host URL
//! with `target_session_attrs=read-write` and fencing on. One cluster goes through a crash
//! of the primary's postmaster (`kill -9`), a `patronictl switchover` and a `patronictl
//! failover`; after each: every holder told within the bound, new acquisitions on the
//! primary Patroni names within the failover bound, nothing granted on the other node,
//! fencing tokens strictly above every token before. A second cluster has its primary cut
//! off from Patroni's consensus while clients still reach it. Its own test binary (run by
//! `cargo xtask test --ha`): it needs Patroni and etcd and starts its own cluster.

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

/// A session on node `node` alone, with the protected table's writes.
async fn session_on(cluster: &PatroniCluster, node: usize) -> tokio_postgres::Client {
    throwaway_pg::testing::connect(&cluster.url(node)).await
}

/// The fenced write a holder makes to the protected data: applied only while the row
/// carries an older token. Answers how many rows it changed.
async fn fenced_write(client: &tokio_postgres::Client, key: &str, token: i64) -> u64 {
    client
        .execute(
            "UPDATE patroni_protected SET token = $2 WHERE key = $1 AND token < $2",
            &[&key, &token],
        )
        .await
        .expect("the fenced write")
}

/// The primary cut off from Patroni's consensus while clients still reach it: its Patroni
/// frozen (it cannot renew the leader key, as when cut off from etcd and the other node),
/// its PostgreSQL still serving. Says who can be granted what during the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_from_patroni_until_it_is_demoted() {
    let cluster = Arc::new(
        blocking(|| PatroniCluster::start().expect("start etcd and two Patroni nodes")).await,
    );
    let old = cluster.leader().expect("a leader");
    let new = 1 - old;
    let url = cluster.multi_host_url();
    {
        let setup = session_on(&cluster, old).await;
        locks_postgres::install_fencing(&setup)
            .await
            .expect("install the fencing table");
        setup
            .batch_execute(
                "CREATE TABLE patroni_protected (key text PRIMARY KEY, token bigint NOT NULL);
                 INSERT INTO patroni_protected VALUES ('patroni:cut', 0)",
            )
            .await
            .expect("the protected table");
    }
    let fenced = |url: &str| {
        PostgresLockManager::builder(pool(url, 2))
            .keepalive(Some(KEEPALIVE))
            .fencing(true)
            .build()
    };
    let key = "patroni:cut";
    let stale = fenced(&url);
    let held = stale
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("the lock before the cut");
    let stale_token = held.info().fencing_token().expect("fencing is on");
    let on_old = session_on(&cluster, old).await;
    assert_eq!(fenced_write(&on_old, key, stale_token).await, 1);

    // The cut: the old primary's Patroni stops renewing; its PostgreSQL serves on.
    let cut = Instant::now();
    {
        let cluster = cluster.clone();
        blocking(move || cluster.pause_patroni(old))
            .await
            .expect("pause the primary's Patroni");
    }

    // Before the takeover, a fenced acquisition on the old primary is still granted (it
    // is the primary; its token commit reaches the synchronous standby).
    let early = fenced(&cluster.url(old))
        .acquire(
            "patroni:cut:early",
            AcquireOptions::new().with_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("granted on the old primary before the takeover");
    early.release().await;

    {
        let cluster = cluster.clone();
        blocking(move || cluster.wait_for_leader(new, Duration::from_secs(90)))
            .await
            .expect("the other node takes over");
    }
    let takeover = cut.elapsed();

    // The window: both servers are writable. On the old primary an advisory lock without
    // fencing is still granted (nothing checks who Patroni says leads), even a key held on
    // the new one: the two exclude nothing of each other.
    let unfenced_old = PostgresLockManager::new(pool(&cluster.url(old), 1));
    let fenced_new = fenced(&cluster.url(new));
    let on_new_primary = fenced_new
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("the lock on the new primary while the old one still holds it");
    let new_token = on_new_primary
        .info()
        .fencing_token()
        .expect("fencing is on");
    assert!(
        new_token > stale_token,
        "synchronous mode: {new_token} after {stale_token}"
    );
    let split = unfenced_old
        .acquire(
            "patroni:cut:split",
            AcquireOptions::new().with_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("an unfenced lock on the cut-off primary");
    // With fencing, the old primary grants nothing: the token's commit waits for a
    // synchronous standby that is now the primary, until the call's timeout.
    let fenced_old = fenced(&cluster.url(old))
        .acquire(
            "patroni:cut:fenced",
            AcquireOptions::new().with_timeout(Duration::from_secs(3)),
        )
        .await;
    let fenced_old_kind = fenced_old
        .as_ref()
        .err()
        .map(locks_port::LockAcquisitionError::kind);
    assert!(fenced_old.is_err(), "a fenced grant on the cut-off primary");

    // Fencing refuses the stale holder: on the new primary its token is older than the
    // new holder's; on the old one its write is never acknowledged (synchronous commit).
    let on_new = session_on(&cluster, new).await;
    assert_eq!(fenced_write(&on_new, key, new_token).await, 1);
    assert_eq!(
        fenced_write(&on_new, key, stale_token).await,
        0,
        "the stale write refused"
    );
    let stale_on_old = tokio::time::timeout(
        Duration::from_secs(2),
        fenced_write(&on_old, key, stale_token + 1_000),
    )
    .await;
    assert!(
        stale_on_old.is_err(),
        "a write on the cut-off primary was acknowledged"
    );
    assert!(!held.is_lost(), "the stale holder has not been told yet");

    // The old primary's Patroni resumes, finds another leader and demotes its server:
    // the stale holder is told.
    let resumed = Instant::now();
    {
        let cluster = cluster.clone();
        blocking(move || cluster.resume_patroni(old))
            .await
            .expect("resume the old primary's Patroni");
    }
    tokio::time::timeout(FAILOVER, held.lost())
        .await
        .expect("the stale holder told once its server is demoted");
    let told = resumed.elapsed();
    eprintln!(
        "cut-off: takeover {takeover:?} after the cut; stale token {stale_token}, new {new_token}; \
         fenced acquisition on the old primary: {fenced_old_kind:?}; stale holder told {told:?} \
         after its Patroni resumed"
    );
    drop((split, on_new_primary, on_old, on_new));
    blocking(move || drop(cluster)).await;
}
