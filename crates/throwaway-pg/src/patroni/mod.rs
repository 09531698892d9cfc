//! A throwaway HA pair as users run it: etcd (one member) and two PostgreSQL nodes under
//! Patroni in synchronous mode, every process on 127.0.0.1 ports, every file in one
//! temporary folder. For tests of failovers that Patroni makes (a crash, a switchover, a
//! failover), not by hand.
//!
//! Needs Debian's `patroni` (3.x) and `etcd-server` (3.4) packages
//! (`scripts/install-test-deps.sh --ha` installs them) and the PostgreSQL server binaries.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

mod placement;
mod processes;
mod rest;

use crate::Error;
use crate::NetworkPair;
use crate::binaries::Binaries;
use crate::cluster::{create_root, free_port};
use crate::process::{RunAs, run};
use processes::{find_tool, postgres_id, stop};

/// How long [`PatroniCluster::start`] waits for a leader and a synchronous standby.
const START: Duration = Duration::from_secs(120);
/// How often it looks while waiting.
const POLL: Duration = Duration::from_millis(100);
/// Patroni's leader key TTL, main loop period and DCS retry timeout, in seconds: the
/// smallest TTL Patroni accepts, so a lost primary is replaced as fast as Patroni can.
const TTL: u32 = 20;
const LOOP_WAIT: u32 = 1;
const RETRY_TIMEOUT: u32 = 5;
/// The primary's `wal_sender_timeout`: a walsender whose standby stopped answering (a cut
/// link) ends after this, instead of holding up the primary's shutdown when Patroni demotes
/// it. A shutdown slower than Patroni's next loop makes Patroni 3.0 demote a second time
/// from its main thread and start PostgreSQL twice once both stops return
/// (patroni/patroni#3649), which leaves a postmaster Patroni no longer knows and a node
/// that cannot rejoin; this keeps the first stop shorter than `RETRY_TIMEOUT`.
const WAL_SENDER_TIMEOUT: &str = "'3s'";
/// How long a stopping Patroni (which stops its PostgreSQL) gets before `SIGKILL`.
const STOP: Duration = Duration::from_secs(30);

/// One Patroni node: where it listens, its PostgreSQL and REST API ports, its
/// configuration, its process.
#[derive(Debug)]
struct Node {
    name: String,
    /// The address its PostgreSQL and REST API listen on, and the network namespace it
    /// runs in (none: 127.0.0.1 of this host).
    place: Place,
    pg_port: u16,
    rest_port: u16,
    config: PathBuf,
    process: Option<Child>,
}

/// etcd and two PostgreSQL nodes under Patroni (`synchronous_mode: true`), started in a
/// temporary folder on free ports of 127.0.0.1, with trust authentication for the
/// `postgres` user. Dropping it stops both Patronis (which stop their PostgreSQL), then
/// etcd, stops any PostgreSQL still running (`pg_ctl stop -m immediate`) and removes the
/// folder.
///
/// Patroni's settings: `ttl` 20 s (the least it accepts), `loop_wait` 1 s,
/// `retry_timeout` 5 s; a failover after the primary's Patroni dies takes up to the TTL.
/// `use_pg_rewind` with `wal_log_hints` and `full_page_writes` on (`pg_rewind` needs both):
/// a former primary whose history went past the fork is rewound and follows the new
/// leader; `wal_sender_timeout` 3 s, so a primary cut off from its standby stops at once
/// when Patroni demotes it (see [`heal`](Self::heal)).
/// As root, every process runs as the `postgres` user.
#[derive(Debug)]
pub struct PatroniCluster {
    root: PathBuf,
    run_as: RunAs,
    /// The `postgres` user's uid and gid, when this process is root.
    ids: Option<(u32, u32)>,
    bin: Binaries,
    etcd: Option<Child>,
    etcd_place: Place,
    etcd_port: u16,
    nodes: [Node; 2],
    /// The namespaces of a [`start_partitionable`](Self::start_partitionable) pair:
    /// removed after every process has stopped (fields drop after `Drop::drop`).
    network: Option<NetworkPair>,
}

/// Where a process runs and listens: a network namespace (`None`: this host's) and an
/// IPv4 address in it.
#[derive(Debug, Clone)]
struct Place {
    namespace: Option<String>,
    address: String,
}

impl Place {
    fn host() -> Self {
        Self {
            namespace: None,
            address: "127.0.0.1".to_owned(),
        }
    }
}

impl PatroniCluster {
    /// Starts etcd, then the first node (which bootstraps the cluster with `initdb` and
    /// leads), then the second (a base backup of the first), and waits until one leads and
    /// the other is its synchronous standby. On error nothing is left behind.
    ///
    /// # Errors
    /// [`Error::HaNotInstalled`] without `patroni`, `patronictl` or `etcd`; the errors of
    /// [`ThrowawayPostgres::start`](crate::ThrowawayPostgres::start); an
    /// [`Error::Io`] of kind `TimedOut` when the pair is not ready within 120 s (with
    /// the end of each node's log).
    pub fn start() -> Result<Self, Error> {
        Self::start_on(None)
    }

    fn start_on(network: Option<NetworkPair>) -> Result<Self, Error> {
        let missing: Vec<String> = ["etcd", "patroni", "patronictl"]
            .into_iter()
            .filter(|tool| find_tool(tool).is_none())
            .map(str::to_owned)
            .collect();
        if !missing.is_empty() {
            return Err(Error::HaNotInstalled { missing });
        }
        let bin = Binaries::find()?;
        let run_as = RunAs::detect()?;
        let ids = match run_as {
            RunAs::CurrentUser => None,
            RunAs::Postgres => Some((postgres_id("-u")?, postgres_id("-g")?)),
        };
        let root = create_root()?;
        // Node 0 (the first leader) on the near side, etcd and node 1 on the far side.
        let place = |near: bool| {
            network.as_ref().map_or_else(Place::host, |pair| Place {
                namespace: Some(if near { pair.near() } else { pair.far() }.to_owned()),
                address: if near {
                    pair.near_address()
                } else {
                    pair.far_address()
                },
            })
        };
        let node = |index: usize| -> Result<Node, Error> {
            Ok(Node {
                name: format!("node{index}"),
                place: place(index == 0),
                pg_port: free_port()?,
                rest_port: free_port()?,
                config: root.join(format!("node{index}.yml")),
                process: None,
            })
        };
        let nodes = [node(0)?, node(1)?];
        // From here on, dropping `cluster` (on any error) stops what started and removes
        // `root`.
        let mut cluster = Self {
            etcd_place: place(false),
            etcd_port: free_port()?,
            nodes,
            network,
            root,
            run_as,
            ids,
            bin,
            etcd: None,
        };
        let peer_port = free_port()?;
        for index in 0..2 {
            cluster.write_config(index)?;
        }
        run_as.give(&cluster.root)?;
        cluster.start_etcd(peer_port)?;
        cluster.start_node(0)?;
        cluster.wait(START, "the first node to lead", |cluster| {
            cluster.leader() == Some(0)
        })?;
        cluster.start_node(1)?;
        cluster.wait_until_replicating(START)?;
        Ok(cluster)
    }

    /// The folder that holds everything: `etcd/`, `nodeN/data`, `nodeN.yml`, the logs.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// Node `node`'s (0 or 1) PostgreSQL port on 127.0.0.1.
    ///
    /// # Panics
    /// When `node` is not 0 or 1.
    #[must_use]
    pub fn port(&self, node: usize) -> u16 {
        self.nodes[node].pg_port
    }

    /// A URL of node `node` alone (whatever its role): `postgres://postgres@127.0.0.1:PORT/postgres`.
    /// For a [`start_partitionable`](Self::start_partitionable) pair, the node's Unix
    /// socket instead (`host=<its folder> port=PORT user=postgres dbname=postgres`), which
    /// this host reaches whatever its network does.
    ///
    /// # Panics
    /// When `node` is not 0 or 1.
    #[must_use]
    pub fn url(&self, node: usize) -> String {
        if self.network.is_some() {
            return format!(
                "host={} port={} user=postgres dbname=postgres",
                self.socket_dir(node).display(),
                self.port(node)
            );
        }
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port(node))
    }

    /// Both nodes in one key-value connection string that takes whichever is the primary:
    /// `host=127.0.0.1,127.0.0.1 port=P0,P1 user=postgres dbname=postgres
    /// target_session_attrs=read-write` (the Unix sockets' folders as hosts for a
    /// [`start_partitionable`](Self::start_partitionable) pair).
    #[must_use]
    pub fn multi_host_url(&self) -> String {
        let hosts = if self.network.is_some() {
            format!(
                "{},{}",
                self.socket_dir(0).display(),
                self.socket_dir(1).display()
            )
        } else {
            "127.0.0.1,127.0.0.1".to_owned()
        };
        format!(
            "host={hosts} port={},{} user=postgres dbname=postgres \
             target_session_attrs=read-write",
            self.port(0),
            self.port(1)
        )
    }

    /// The node whose Patroni says it is the primary (its REST API's `GET /primary`
    /// answers 200), if one does.
    #[must_use]
    pub fn leader(&self) -> Option<usize> {
        (0..2).find(|&node| self.rest_status(node, "/primary") == Some(200))
    }

    /// The node the cluster's state (`GET /cluster`) names synchronous standby and running:
    /// the only node a switchover or failover may go to in synchronous mode.
    #[must_use]
    pub fn sync_standby(&self) -> Option<usize> {
        (0..2).find_map(|node| self.sync_standby_seen_by(node))
    }

    /// As [`sync_standby`](Self::sync_standby), asked of node `asker`'s Patroni alone.
    fn sync_standby_seen_by(&self, asker: usize) -> Option<usize> {
        let body = self.rest_get(asker, "/cluster")?;
        // {"members": [{"name": "node0", "role": "leader", "state": "running", ...}, ...]}
        body.split("{\"name\": \"").skip(1).find_map(|member| {
            let name = member.split('"').next()?;
            let synchronous = member.contains("\"role\": \"sync_standby\"")
                && (member.contains("\"state\": \"running\"")
                    || member.contains("\"state\": \"streaming\""));
            synchronous
                .then(|| self.nodes.iter().position(|node| node.name == name))
                .flatten()
        })
    }

    /// Waits until a node leads and the other is its synchronous standby; returns the
    /// leader.
    ///
    /// # Errors
    /// An [`Error::Io`] of kind `TimedOut` after `timeout`, with the nodes' log tails.
    pub fn wait_until_replicating(&self, timeout: Duration) -> Result<usize, Error> {
        self.wait(timeout, "a leader and a synchronous standby", |cluster| {
            matches!((cluster.leader(), cluster.sync_standby()), (Some(l), Some(s)) if l != s)
        })?;
        self.leader()
            .ok_or_else(|| self.timed_out("a leader", timeout))
    }

    /// Waits until node `node` is a replica that streams from the other node, which leads:
    /// the leader's Patroni answers `GET /primary` with 200 and names `node` its running
    /// synchronous standby (which it does only once `node` streams and has caught up, as
    /// `pg_stat_replication` shows it), and `node`'s own Patroni answers `GET /replica`
    /// with 200. For a node that comes back after a failover (rewound or cloned again).
    /// Returns the leader.
    ///
    /// # Errors
    /// An [`Error::Io`] of kind `TimedOut` after `timeout`, with the nodes' log tails.
    ///
    /// # Panics
    /// When `node` is not 0 or 1.
    pub fn wait_until_standby_of_leader(
        &self,
        node: usize,
        timeout: Duration,
    ) -> Result<usize, Error> {
        let leader = 1 - node;
        self.wait(
            timeout,
            &format!("node{node} to stream from node{leader} as its synchronous standby"),
            |cluster| {
                cluster.rest_status(leader, "/primary") == Some(200)
                    && cluster.sync_standby_seen_by(leader) == Some(node)
                    && cluster.rest_status(node, "/replica") == Some(200)
            },
        )?;
        Ok(leader)
    }

    /// Waits until node `node` leads (after a failover, a switchover) and its PostgreSQL
    /// accepts writes. Patroni's `GET /primary` answers 200 as soon as it has taken the
    /// leader key and asked its server to promote; the server may still be replaying WAL
    /// for a moment after (`pg_is_in_recovery()` true), and refuses an advisory lock's
    /// fencing write until it is done.
    ///
    /// # Errors
    /// An [`Error::Io`] of kind `TimedOut` after `timeout`.
    pub fn wait_for_leader(&self, node: usize, timeout: Duration) -> Result<(), Error> {
        self.wait(
            timeout,
            &format!("node{node} to lead and accept writes"),
            |cluster| cluster.leader() == Some(node) && cluster.accepts_writes(node),
        )
    }

    /// Whether node `node`'s PostgreSQL answers `SELECT NOT pg_is_in_recovery()` with true,
    /// asked over its Unix socket (which this host reaches whatever the network does).
    fn accepts_writes(&self, node: usize) -> bool {
        let mut command = Command::new(self.bin.tool("psql"));
        crate::process::client_env(&mut command);
        command
            .args(["-X", "-A", "-t", "-q", "-h"])
            .arg(self.socket_dir(node))
            .arg("-p")
            .arg(self.port(node).to_string())
            .args(["-U", "postgres", "-d", "postgres", "-c"])
            .arg("SELECT NOT pg_is_in_recovery()")
            .stdin(Stdio::null());
        run(&mut command).is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "t")
    }

    /// `patronictl switchover --candidate nodeN --force`: a planned hand-over, the leader
    /// demoting itself first.
    ///
    /// # Errors
    /// The command's failure (for example, `candidate` is not the synchronous standby).
    pub fn switchover(&self, candidate: usize) -> Result<(), Error> {
        let leader = self
            .leader()
            .ok_or_else(|| self.timed_out("a leader to switch over from", Duration::ZERO))?;
        self.patronictl(&[
            "switchover",
            "--leader",
            &self.nodes[leader].name,
            "--candidate",
            &self.nodes[candidate].name,
            "--force",
        ])
    }

    /// `patronictl failover --candidate nodeN --force`: a hand-over that does not need
    /// the leader's consent (in synchronous mode, only to the synchronous standby).
    ///
    /// # Errors
    /// The command's failure.
    pub fn failover(&self, candidate: usize) -> Result<(), Error> {
        self.patronictl(&[
            "failover",
            "--candidate",
            &self.nodes[candidate].name,
            "--force",
        ])
    }

    /// Kills node `node`'s postmaster with `SIGKILL` (its pid from `postmaster.pid`), as a
    /// crash of PostgreSQL would; its Patroni stays up and restarts it.
    ///
    /// # Errors
    /// No `postmaster.pid` (PostgreSQL not running), or `kill` failed.
    pub fn kill_postmaster(&self, node: usize) -> Result<u32, Error> {
        let pid_file = self.data_dir(node).join("postmaster.pid");
        let text = fs::read_to_string(&pid_file)
            .map_err(|source| Error::io(format!("read {}", pid_file.display()), source))?;
        let pid: u32 = text
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .ok_or_else(|| {
                Error::io(
                    format!("read the pid in {}", pid_file.display()),
                    io::Error::new(io::ErrorKind::InvalidData, text.clone()),
                )
            })?;
        run(Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stdin(Stdio::null()))?;
        Ok(pid)
    }

    /// Freezes node `node`'s Patroni (`SIGSTOP`) while its PostgreSQL runs on: it can no
    /// longer renew its leader key, as when cut off from etcd and from the other node,
    /// while clients that reach its PostgreSQL are still served. After the TTL the other
    /// node takes over; [`resume_patroni`](Self::resume_patroni) lets it find out and demote.
    ///
    /// Patroni 3.0.2 (Debian 12's) may not: frozen after its loop read the cluster and
    /// before it renewed its lease, it resumes on that stale view, takes a new lease and
    /// writes the leader key over the new leader's without a condition
    /// (patroni/patroni#2689, fixed in 3.0.3), and the new leader demotes itself. To have
    /// it demote wherever the freeze caught it, resume it cut off from etcd
    /// ([`start_partitionable`](Self::start_partitionable), [`cut_off`](Self::cut_off)).
    ///
    /// # Errors
    /// The node's Patroni is not running, or `kill` failed.
    pub fn pause_patroni(&self, node: usize) -> Result<(), Error> {
        self.signal_patroni(node, "-STOP")
    }

    /// Lets node `node`'s Patroni run again (`SIGCONT`).
    ///
    /// # Errors
    /// As [`pause_patroni`](Self::pause_patroni).
    pub fn resume_patroni(&self, node: usize) -> Result<(), Error> {
        self.signal_patroni(node, "-CONT")
    }

    fn signal_patroni(&self, node: usize, signal: &str) -> Result<(), Error> {
        let pid = self.nodes[node]
            .process
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| {
                Error::io(
                    format!("signal node{node}'s Patroni"),
                    io::Error::new(io::ErrorKind::NotFound, "not running"),
                )
            })?;
        run(Command::new("kill")
            .args([signal, &pid.to_string()])
            .stdin(Stdio::null()))
        .map(drop)
    }

    /// Node `node`'s data folder.
    fn data_dir(&self, node: usize) -> PathBuf {
        self.socket_dir(node).join("data")
    }

    /// Node `node`'s folder, which holds its data folder and its Unix socket.
    fn socket_dir(&self, node: usize) -> PathBuf {
        self.root.join(&self.nodes[node].name)
    }

    fn wait(
        &self,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Self) -> bool,
    ) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            if ready(self) {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(self.timed_out(what, timeout));
            }
            thread::sleep(POLL);
        }
    }

    /// A timeout error with the end of each log.
    fn timed_out(&self, what: &str, timeout: Duration) -> Error {
        let mut logs = format!("waited {timeout:?} for {what}");
        for log in ["etcd.log", "node0.log", "node1.log"] {
            let text = fs::read_to_string(self.root.join(log)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let _ = write!(logs, "\n--- end of {log} ---");
            for line in tail.into_iter().rev() {
                let _ = write!(logs, "\n{line}");
            }
        }
        Error::io(
            format!("start the Patroni pair in {}", self.root.display()),
            io::Error::new(io::ErrorKind::TimedOut, logs),
        )
    }

    fn teardown(&mut self) {
        for node in 0..2 {
            // A paused Patroni would not act on SIGTERM.
            let _ = self.resume_patroni(node);
        }
        for node in &mut self.nodes {
            if let Some(process) = node.process.take() {
                stop(process);
            }
        }
        if let Some(etcd) = self.etcd.take() {
            stop(etcd);
        }
        for node in 0..2 {
            let data = self.data_dir(node);
            if data.join("postmaster.pid").exists() {
                let mut command = self.run_as.command(&self.bin.tool("pg_ctl"), &self.root);
                command
                    .arg("-D")
                    .arg(&data)
                    .args(["-m", "immediate", "stop"]);
                let _ = run(&mut command);
            }
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        self.teardown();
    }
}
