//! The soak on an HA pair under Patroni (`soak --patroni`, `cargo xtask soak --patroni`):
//! the same workers and checks, on the multi-host URL with
//! `target_session_attrs=read-write`, while the driver kills workers, terminates and stops
//! their backends, and makes Patroni fail over: a `kill -9` of the primary's postmaster
//! (Patroni restarts it), a `patronictl switchover`, a `patronictl failover`, in turn. No
//! network namespaces: Patroni and etcd run on loopback.

use std::time::{Duration, Instant};

use throwaway_pg::PatroniCluster;

use super::{Error, Faults, KEYS, Lcg, WORKERS, chaos};

/// How long the pair may take to have a leader and a synchronous standby again.
const HEAL: Duration = Duration::from_secs(120);

pub(super) async fn driver(duration: Duration, shards: bool) -> Result<(), Error> {
    let cluster = tokio::task::spawn_blocking(PatroniCluster::start).await??;
    let url = cluster.multi_host_url();
    println!(
        "soak: {WORKERS} workers, {KEYS} keys, {}{duration:?}, Patroni pair {url}",
        super::shards::banner(shards)
    );
    let cluster = std::sync::Arc::new(cluster);
    let pair = &cluster;
    let outcome = chaos(
        duration,
        &url,
        &url,
        None,
        shards,
        async |_, faults: &mut Faults, _: &mut Lcg| -> Result<(), Error> {
            let kind = faults.failovers % 3;
            let pair = pair.clone();
            faults
                .outage(async || {
                    tokio::task::spawn_blocking(move || fail_over(&pair, kind)).await?
                })
                .await?;
            faults.failovers += 1;
            Ok(())
        },
    )
    .await;
    tokio::task::spawn_blocking(move || drop(cluster)).await?;
    outcome
}

/// One Patroni failover of `kind` (0: `kill -9` of the postmaster, 1: switchover, 2:
/// failover), once the pair has a leader and a synchronous standby; waits for it to have
/// them again.
fn fail_over(cluster: &PatroniCluster, kind: u32) -> Result<(), Error> {
    let leader = cluster.wait_until_replicating(HEAL)?;
    let standby = 1 - leader;
    let started = Instant::now();
    loop {
        let done = match kind {
            0 => cluster.kill_postmaster(leader).map(drop),
            1 => cluster.switchover(standby),
            _ => cluster.failover(standby),
        };
        match done {
            Ok(()) => break,
            // Patroni refuses a hand-over for a moment after the standby streams again.
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(error) => return Err(error.into()),
        }
    }
    cluster.wait_until_replicating(HEAL)?;
    Ok(())
}
