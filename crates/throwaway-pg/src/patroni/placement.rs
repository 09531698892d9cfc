//! A [`PatroniCluster`] whose primary can be cut off by the network: node 0 (the first
//! leader) in one network namespace, etcd and node 1 in another, joined by a veth pair.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

use super::PatroniCluster;
use crate::{Error, NetworkPair};

/// The second octet of the pair's addresses (`10.219.<pid % 250>.0/30`), apart from the
/// other users of [`NetworkPair`] in this workspace.
const OCTET: u8 = 219;

/// How many partitionable pairs this process has made: each pair's namespaces and links
/// are named after its number (`p00`, `p01`, ...), so that two tests of one binary can
/// each run one at once (the names are global; the addresses live in the pair's own
/// namespaces). A hundred apart, numbers are reused.
static MADE: AtomicU8 = AtomicU8::new(0);

impl PatroniCluster {
    /// As [`start`](Self::start), with node 0 (which bootstraps and leads) in one network
    /// namespace and etcd and node 1 in another, joined by a veth pair
    /// ([`NetworkPair`]): Patroni, replication and etcd talk over that link alone, so
    /// [`cut_off`](Self::cut_off) separates node 0 from etcd and from node 1 while both
    /// keep running. This host reaches each node's PostgreSQL through its Unix socket
    /// ([`url`](Self::url)), which no network cut touches: the clients that still reach
    /// a cut-off primary. Patroni's REST API is asked from inside the namespaces with
    /// `curl`.
    ///
    /// Needs root (for `ip netns`), iproute2 and curl. Several may run at once in one
    /// process.
    ///
    /// # Errors
    /// As [`start`](Self::start), and an [`Error::Io`] that says why the namespaces
    /// could not be made.
    pub fn start_partitionable() -> Result<Self, Error> {
        let number = MADE.fetch_add(1, Ordering::Relaxed) % 100;
        let network = NetworkPair::make(&format!("p{number:02}"), OCTET).map_err(|error| {
            Error::io(
                "make the network namespaces for the Patroni pair",
                io::Error::other(error.to_string()),
            )
        })?;
        Self::start_on(Some(network))
    }

    /// Cuts node 0's link to etcd and node 1 (packets dropped both ways, no socket
    /// closed), as when the primary's host loses its network to the rest of the cluster.
    ///
    /// # Errors
    /// The cluster was not started with
    /// [`start_partitionable`](Self::start_partitionable), or `ip` failed.
    pub fn cut_off(&self) -> Result<(), Error> {
        self.link("cut node0's link", NetworkPair::cut)
    }

    /// Brings node 0's link back up after [`cut_off`](Self::cut_off): node 0's Patroni
    /// reaches etcd again, finds the other node leading, rewinds its server with
    /// `pg_rewind` (`use_pg_rewind`, `wal_log_hints`) and restarts it as a replica of
    /// the leader; [`wait_until_standby_of_leader`](Self::wait_until_standby_of_leader)
    /// waits for that.
    ///
    /// # Errors
    /// As [`cut_off`](Self::cut_off).
    pub fn heal(&self) -> Result<(), Error> {
        self.link("bring node0's link back", NetworkPair::heal)
    }

    fn link(
        &self,
        what: &str,
        change: impl FnOnce(&NetworkPair) -> Result<(), crate::NetworkError>,
    ) -> Result<(), Error> {
        let network = self.network.as_ref().ok_or_else(|| {
            Error::io(
                what,
                io::Error::other("the pair was not started with start_partitionable"),
            )
        })?;
        change(network).map_err(|error| Error::io(what, io::Error::other(error.to_string())))
    }
}
