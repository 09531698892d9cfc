//! The primary cut off by the network: node 0 (the leader) in one network namespace, etcd
//! and node 1 in another (`PatroniCluster::start_partitionable`), the link between them
//! taken down while this process still reaches both servers through their Unix sockets.
//! Measures who can be granted what from the cut until the other node leads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard};
use locks_postgres::{PostgresLockGuard, PostgresLockManager};
use throwaway_pg::PatroniCluster;

use super::{
    FAILOVER, blocking, fenced, fenced_write, new_write_lands_stale_refused, pool, protect,
    session_on, stale_holder,
};

/// How long the test waits, from the cut, for the other node to grant the key and the
/// stale holder to be told: Patroni's TTL (20 s), its loop and the promotion, with room.
const WINDOW: Duration = Duration::from_secs(90);
/// How often each side is asked for a lock during the window.
const PROBE: Duration = Duration::from_millis(200);

/// One attempt at `key` through `manager`, released at once; `true` when granted.
async fn granted(manager: &PostgresLockManager, key: &str) -> bool {
    match manager
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_millis(500)),
        )
        .await
    {
        Ok(guard) => {
            guard.release().await;
            true
        }
        Err(_) => false,
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_by_the_network_until_patroni_demotes_it() {
    let cluster = Arc::new(
        blocking(|| {
            PatroniCluster::start_partitionable().unwrap_or_else(|error| {
                panic!("start the Patroni pair in network namespaces (needs root): {error}")
            })
        })
        .await,
    );
    let (old, new) = (0, 1);
    assert_eq!(cluster.leader(), Some(old), "node 0 bootstraps and leads");
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
    drop((relanded, new_holder, on_new, held));

    blocking(move || drop(cluster)).await;
}
