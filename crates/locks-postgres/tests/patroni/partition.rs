//! The primary cut off by the network: node 0 (the leader) in one network namespace, etcd
//! and node 1 in another (`PatroniCluster::start_partitionable`), the link between them
//! taken down while this process still reaches both servers through their Unix sockets.
//! Measures who can be granted what from the cut until the other node leads, then brings
//! the link back and follows node 0 until it streams from node 1 again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard};
use locks_postgres::{PostgresLockGuard, PostgresLockManager};
use throwaway_pg::PatroniCluster;

use super::{
    FAILOVER, blocking, fenced, fenced_write, new_write_lands_stale_refused, partitionable, pool,
    protect, session_on, stale_holder,
};

/// How long the test waits, from the cut, for the other node to grant the key and the
/// stale holder to be told: Patroni's TTL (20 s), its loop and the promotion, with room.
const WINDOW: Duration = Duration::from_secs(90);
/// How long the test waits, from the heal, for node 0 to stream from node 1 as its
/// synchronous standby: Patroni's loop finds etcd again, `pg_rewind`, the restart and the
/// catch-up. Measured 7.0–10.2 s over five runs (`docs/benchmarks.md`); room for a loaded
/// machine.
const REJOIN: Duration = Duration::from_secs(45);
/// How often each side is asked for a lock during the window.
const PROBE: Duration = Duration::from_millis(200);

/// One attempt at `key` through `manager`, released at once; the refusal's kind.
async fn attempt(manager: &PostgresLockManager, key: &str) -> Result<(), AcquisitionErrorKind> {
    let guard = manager
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_millis(500)),
        )
        .await
        .map_err(|error| error.kind())?;
    guard.release().await;
    Ok(())
}

/// One attempt at `key` through `manager`, released at once; `true` when granted.
async fn granted(manager: &PostgresLockManager, key: &str) -> bool {
    attempt(manager, key).await.is_ok()
}

/// What the window looked like, from the cut.
#[derive(Debug, Default)]
struct Window {
    /// Unfenced locks the cut-off primary granted after the cut, and the last one's time.
    old_grants: u32,
    last_old_grant: Option<Duration>,
    /// When the other node first granted the key the stale holder holds.
    first_new_grant: Option<Duration>,
    /// When the stale holder was told of its loss.
    told: Option<Duration>,
}

/// From the cut until node 1 leads: the two nodes never grant at once, the stale holder is
/// told before the key is granted elsewhere, fencing refuses its writes. Then the heal:
/// Patroni rewinds node 0 (`pg_rewind`) and it streams from node 1 within [`REJOIN`]
/// (measured 7.0–10.2 s), granting nothing meanwhile (refused `Unreachable` while it
/// restarts, `Configuration` as a standby); the lock taken on node 1 before the heal stays
/// held and exclusive, the token taken before the cut stays refused there, and node 0
/// shows node 1's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_by_the_network_until_patroni_demotes_it() {
    let cluster = partitionable().await;
    let (old, new) = (0, 1);
    let key = "patroni:partition";
    protect(&cluster, old, key).await;
    let (stale, held, stale_token, on_old) =
        stale_holder(&cluster, old, &cluster.multi_host_url(), key).await;
    // Clients that reach one node alone, through its socket, without fencing.
    let probe_old = PostgresLockManager::new(pool(&cluster.url(old), 1));
    let probe_new = PostgresLockManager::new(pool(&cluster.url(new), 1));

    {
        let cluster = cluster.clone();
        blocking(move || cluster.cut_off())
            .await
            .expect("cut node 0 off from etcd and node 1");
    }
    let cut = Instant::now();
    // The stale holder writes on after the cut, and a fenced client asks the old primary.
    let stale_write = tokio::spawn(async move {
        let written = fenced_write(&on_old, key, stale_token + 1_000).await;
        (written, cut.elapsed())
    });
    let fenced_old = {
        let url = cluster.url(old);
        tokio::spawn(async move {
            fenced(&url)
                .acquire(
                    "patroni:partition:fenced",
                    AcquireOptions::new().with_timeout(Duration::from_secs(3)),
                )
                .await
                .map(|guard| guard.info().fencing_token())
        })
    };

    let mut window = Window::default();
    let mut on_new_primary: Option<PostgresLockGuard> = None;
    while on_new_primary.is_none() || window.told.is_none() {
        assert!(
            cut.elapsed() < WINDOW,
            "within {WINDOW:?} of the cut: {window:?}"
        );
        if window.told.is_none() && held.is_lost() {
            window.told = Some(cut.elapsed());
        }
        if granted(&probe_old, "patroni:partition:old").await {
            window.old_grants += 1;
            window.last_old_grant = Some(cut.elapsed());
        }
        if on_new_primary.is_none()
            && let Ok(guard) = probe_new
                .acquire(
                    key,
                    AcquireOptions::new().with_timeout(Duration::from_millis(500)),
                )
                .await
        {
            window.first_new_grant = Some(cut.elapsed());
            on_new_primary = Some(guard);
        }
        if let (Some(last_old), Some(first_new)) = (window.last_old_grant, window.first_new_grant) {
            assert!(
                last_old < first_new,
                "the two nodes granted locks at once: {window:?}"
            );
        }
        tokio::time::sleep(PROBE).await;
    }
    // A little longer: the old node grants nothing once the new one does.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(3) {
        assert!(
            !granted(&probe_old, "patroni:partition:old").await,
            "the cut-off node granted a lock after the other took over: {window:?}"
        );
        tokio::time::sleep(PROBE).await;
    }
    let leader = {
        let cluster = cluster.clone();
        blocking(move || cluster.leader()).await
    };

    eprintln!("partition: {window:?}; leader after {leader:?}");

    // A fenced holder of the key on the new primary: its token is above the stale one;
    // its fenced write lands, the stale holder's is refused.
    if let Some(guard) = on_new_primary.take() {
        guard.release().await;
    }
    let new_holder = fenced(&cluster.url(new))
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("a fenced lock on the new primary");
    let new_token = new_holder.info().fencing_token().expect("fencing is on");
    let on_new = session_on(&cluster, new).await;
    new_write_lands_stale_refused(&on_new, key, new_token, stale_token).await;
    // The multi-host URL lands on the new primary.
    let relanded = stale
        .acquire(
            "patroni:partition:multi-host",
            AcquireOptions::new().with_timeout(FAILOVER),
        )
        .await
        .expect("the multi-host URL finds the new primary");
    let stale_write = tokio::time::timeout(Duration::from_secs(30), stale_write).await;
    let fenced_old = fenced_old.await.expect("the fenced attempt");

    eprintln!(
        "partition: {window:?}; leader after {leader:?}; stale token {stale_token}, new \
         {new_token}; the stale holder's write on the old primary after the cut: \
         {stale_write:?}; a fenced acquisition on the old primary after the cut: \
         {fenced_old:?}"
    );
    assert!(
        new_token > stale_token,
        "synchronous mode: {new_token} after {stale_token}"
    );
    assert_eq!(leader, Some(new), "{window:?}");
    assert!(
        window.old_grants > 0,
        "the cut-off primary grants to the clients that reach it until it is demoted: \
         {window:?}"
    );
    let (last_old, first_new, told) = (
        window.last_old_grant.expect("granted"),
        window.first_new_grant.expect("granted"),
        window.told.expect("told"),
    );
    assert!(last_old < first_new, "{window:?}");
    assert!(
        told < first_new,
        "the stale holder is told before the key is granted elsewhere: {window:?}"
    );
    assert!(
        fenced_old.is_err(),
        "a fenced grant on the cut-off primary: {fenced_old:?}"
    );
    assert!(
        !matches!(stale_write, Ok(Ok((Ok(rows), _))) if rows > 0),
        "the stale holder's write on the cut-off primary was acknowledged: {stale_write:?}"
    );

    // The link comes back: node 0 must rejoin as node 1's replica and grant nothing.
    let rejoin = heal_and_rejoin(&cluster, &probe_old).await;
    eprintln!("partition: after the heal: {rejoin:?}");
    after_the_rejoin(&cluster, &new_holder, &held, key, stale_token).await;
    drop((relanded, new_holder, on_new, held));

    blocking(move || drop(cluster)).await;
}

/// What node 0 answered from the heal until it streamed from node 1 again.
#[derive(Debug, Default)]
struct Rejoin {
    /// From the heal until node 0 was node 1's synchronous standby.
    took: Duration,
    /// Attempts on node 0 alone that were granted (none may be).
    granted: u32,
    /// Attempts on node 0 alone that were refused, by kind, in the order first seen.
    refused: Vec<(AcquisitionErrorKind, u32)>,
}

impl Rejoin {
    /// One attempt at a lock through `on_old` (node 0 alone), counted; the refusal's kind.
    async fn ask(&mut self, on_old: &PostgresLockManager) -> Option<AcquisitionErrorKind> {
        let kind = attempt(on_old, "patroni:partition:old").await.err();
        match kind {
            None => self.granted += 1,
            Some(kind) => match self.refused.iter_mut().find(|(seen, _)| *seen == kind) {
                Some((_, count)) => *count += 1,
                None => self.refused.push((kind, 1)),
            },
        }
        kind
    }
}

/// Brings node 0's link back and asks node 0 alone for a lock every [`PROBE`] until it
/// streams from node 1; asserts it never grants one, and that it refuses as a standby
/// (`Configuration`) once it streams.
async fn heal_and_rejoin(cluster: &Arc<PatroniCluster>, on_old: &PostgresLockManager) -> Rejoin {
    {
        let cluster = cluster.clone();
        blocking(move || cluster.heal())
            .await
            .expect("bring node 0's link back");
    }
    let healed = Instant::now();
    let waiting = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.wait_until_standby_of_leader(0, REJOIN))
    };
    let mut rejoin = Rejoin::default();
    while !waiting.is_finished() {
        rejoin.ask(on_old).await;
        assert_eq!(
            rejoin.granted, 0,
            "node 0 granted while rejoining: {rejoin:?}"
        );
        tokio::time::sleep(PROBE).await;
    }
    rejoin.took = healed.elapsed();
    let leader = waiting
        .await
        .expect("the wait")
        .unwrap_or_else(|error| panic!("node 0 rejoins within {REJOIN:?}: {error}"));
    assert_eq!(leader, 1, "node 1 still leads after the heal: {rejoin:?}");
    // Streaming, node 0 refuses as any standby does, for a few probes more.
    for _ in 0..5 {
        let refused = rejoin.ask(on_old).await;
        assert_eq!(
            refused,
            Some(AcquisitionErrorKind::Configuration),
            "node 0, a replica again, refuses: {rejoin:?}"
        );
        tokio::time::sleep(PROBE).await;
    }
    assert!(rejoin.took <= REJOIN, "{rejoin:?}");
    rejoin
}

/// After node 0 rejoined: the lock `holder` took on node 1 before the heal is still held and
/// exclusive, the stale holder was told, its token is still refused on node 1, and node 0
/// shows node 1's data (its own writes past the fork were rewound away).
async fn after_the_rejoin(
    cluster: &PatroniCluster,
    holder: &PostgresLockGuard,
    stale: &PostgresLockGuard,
    key: &str,
    stale_token: i64,
) {
    assert!(!holder.is_lost(), "the lock on node 1 survives the heal");
    assert!(
        stale.is_lost(),
        "the stale holder was told it lost the lock"
    );
    let second = fenced(&cluster.url(1));
    let taken = second
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(1)),
        )
        .await;
    assert_eq!(
        taken.as_ref().map(|_| ()).map_err(|error| error.kind()),
        Err(AcquisitionErrorKind::Timeout),
        "a second manager on node 1 cannot take the held key"
    );
    let on_new = session_on(cluster, 1).await;
    let holder_token = holder.info().fencing_token().expect("fencing is on");
    assert_eq!(
        fenced_write(&on_new, key, stale_token)
            .await
            .expect("the stale holder's write after the heal"),
        0,
        "the token taken before the cut is refused on node 1 after the heal"
    );
    // Node 0 replays node 1's history: the row carries the new holder's token.
    let on_old = session_on(cluster, 0).await;
    let started = Instant::now();
    loop {
        let row = on_old
            .query_one(
                "SELECT token FROM patroni_protected WHERE key = $1",
                &[&key],
            )
            .await
            .expect("read the protected row on node 0");
        let token: i64 = row.get(0);
        if token == holder_token {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "node 0 shows token {token}, node 1 wrote {holder_token}"
        );
        tokio::time::sleep(PROBE).await;
    }
}
