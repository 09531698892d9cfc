//! `cargo xtask test --ha [-- <cargo test args>]`: the Patroni tests, on an HA pair of their
//! own (etcd and two PostgreSQL nodes under Patroni, `throwaway_pg::PatroniCluster`).
//!
//! Installs Patroni, etcd and curl first when they are missing
//! (`scripts/install-test-deps.sh --ha`), then runs `cargo test -p locks-postgres
//! --features ha-tests --test patroni`: a crash of the primary's postmaster, a switchover
//! and a failover on one cluster, a primary whose Patroni is frozen on another (resumed
//! with its link to etcd down), and a primary cut off by the network on a third, which then
//! rejoins as a replica once the link is back (both in network namespaces, as root) (about 80 s on two cores, the clusters'
//! start included). Not part of the default run, which needs neither Patroni nor etcd.

use crate::cargo;

/// Runs the Patroni tests, with `extra` for cargo.
pub(crate) fn run(extra: &[String]) -> crate::Result {
    crate::deps::ensure_ha_deps()?;
    let mut command = cargo();
    command
        .args([
            "test",
            "-p",
            "locks-postgres",
            "--features",
            "ha-tests",
            "--test",
            "patroni",
        ])
        .args(extra);
    crate::run(&mut command)?;
    eprintln!("xtask: the Patroni tests passed");
    Ok(())
}
