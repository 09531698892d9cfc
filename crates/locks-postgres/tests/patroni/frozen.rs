//! The primary cut off from Patroni's consensus by freezing its Patroni (`SIGSTOP`): the
//! case of a primary whose manager hangs while its PostgreSQL serves on, so both servers
//! are writable for a while. `partition.rs` cuts the network instead.
//!
//! The frozen Patroni resumes with its link to etcd down (the pair is partitionable for
//! that alone). Resumed with etcd in reach, Debian 12's Patroni 3.0.2 may take the leader
//! key back: frozen after its loop read the cluster (itself the leader) and before it
//! renewed its lease, it resumes on that stale view, finds its lease expired, takes a new
//! one and writes the leader key over the new leader's without a condition
//! (patroni/patroni#2689, fixed in 3.0.3). The new leader then demotes itself and the old
//! primary stays the primary, so its holder is rightly never told: this test failed so
//! in about one run of three, as the freeze happened to catch Patroni's loop. Without
//! etcd, Patroni writes nothing and demotes its server, wherever the freeze caught it.

use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard};
use locks_postgres::PostgresLockManager;

use super::{
    FAILOVER, blocking, fenced, fenced_write, new_write_lands_stale_refused, partitionable, pool,
    protect, session_on, stale_holder,
};

/// The primary cut off from Patroni's consensus while clients still reach it: its Patroni
/// frozen (it cannot renew the leader key, as when cut off from etcd and the other node),
/// its PostgreSQL still serving. Says who can be granted what during the window, then
/// that the stale holder is told once its Patroni, resumed without etcd, demotes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_from_patroni_until_it_is_demoted() {
    // Node 0 leads: the one the link cut separates from etcd.
    let cluster = partitionable().await;
    let (old, new) = (0, 1);
    let url = cluster.multi_host_url();
    let key = "patroni:cut";
    protect(&cluster, old, key).await;
    let (_stale, held, stale_token, on_old) = stale_holder(&cluster, old, &url, key).await;

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
    new_write_lands_stale_refused(&on_new, key, new_token, stale_token).await;
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

    // The old primary's Patroni resumes without etcd (see the module doc): it cannot
    // renew its leader key and demotes its server: the stale holder is told.
    let resumed = Instant::now();
    {
        let cluster = cluster.clone();
        blocking(move || {
            cluster.cut_off()?;
            cluster.resume_patroni(old)
        })
        .await
        .expect("cut node 0 off from etcd, then resume its Patroni");
    }
    if tokio::time::timeout(FAILOVER, held.lost()).await.is_err() {
        let leader = {
            let cluster = cluster.clone();
            blocking(move || cluster.leader()).await
        };
        panic!(
            "the stale holder was not told within {FAILOVER:?} of its Patroni's resume; \
             Patroni names node {leader:?} the primary (node {old} is the old one)"
        );
    }
    let told = resumed.elapsed();
    eprintln!(
        "cut-off: takeover {takeover:?} after the cut; stale token {stale_token}, new {new_token}; \
         fenced acquisition on the old primary: {fenced_old_kind:?}; stale holder told {told:?} \
         after its Patroni resumed"
    );
    drop((split, on_new_primary, on_old, on_new));
    blocking(move || drop(cluster)).await;
}
