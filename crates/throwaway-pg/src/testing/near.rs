//! Tests of a network that fails without closing sockets: a throwaway PostgreSQL in the
//! near namespace of a [`NetworkPair`], and children of the test binary on either side.
//!
//! As in [`child`](super::child), the test binary re-executes itself, here inside a
//! namespace (`ip netns exec`): [`InNamespace::spawn`] runs only the test `test`, whose
//! body dispatches on a role the parent set in the environment (with
//! [`child::entry`](super::child::entry)), and the child speaks with
//! [`child::say`](super::child::say). The server's child plays its role with
//! [`serve`]; the parent starts it with [`NearServer::start`] and plays the other hosts
//! through the server's Unix socket ([`NearServer::socket_url`]), which no cut touches.

use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::child::{read_messages, say};
use crate::{NetworkPair, ThrowawayPostgres};

/// The near address the server listens on besides loopback, for [`serve`].
const LISTEN: &str = "THROWAWAY_NEAR_LISTEN";
/// The pair's network, which the server trusts, for [`serve`].
const NETWORK: &str = "THROWAWAY_NEAR_NETWORK";

/// How long [`NearServer::start`] waits for the server to say it is ready.
const READY: Duration = Duration::from_secs(120);

/// A child process of this test binary inside a network namespace, and its messages
/// (with when each arrived) as they come; killed and reaped on drop.
#[derive(Debug)]
pub struct InNamespace {
    child: Child,
    messages: mpsc::Receiver<(Instant, String)>,
}

impl InNamespace {
    /// Runs this test binary inside `namespace`, running only the test `test` (its path,
    /// such as `child_entry`), with `env` (the role among it).
    ///
    /// # Panics
    /// When the child cannot be started.
    #[must_use]
    pub fn spawn(namespace: &str, test: &str, env: &[(&str, &str)]) -> Self {
        // The running image's path: `/proc/self/exe` itself would name `ip` in the child.
        let exe = std::fs::read_link("/proc/self/exe")
            .or_else(|_| std::env::current_exe())
            .expect("this test binary");
        let mut command = NetworkPair::command_in(namespace, exe);
        command
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = command.spawn().expect("spawn a child in the namespace");
        let stdout = child.stdout.take().expect("child stdout");
        let (sender, messages) = mpsc::channel();
        read_messages(stdout, move |message| {
            sender.send((Instant::now(), message)).is_ok()
        });
        Self { child, messages }
    }

    /// The next message and when it arrived, within `within`.
    ///
    /// # Panics
    /// When none comes within `within`, naming `what` was awaited.
    #[must_use]
    pub fn next(&self, within: Duration, what: &str) -> (Instant, String) {
        self.messages
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("no message from the child: {what}"))
    }

    /// The next message and when it arrived, if one comes within `within` (at once for
    /// `Duration::ZERO`).
    ///
    /// # Errors
    /// `Timeout` when none came, `Disconnected` when the child is gone and said all.
    pub fn poll(&self, within: Duration) -> Result<(Instant, String), mpsc::RecvTimeoutError> {
        if within.is_zero() {
            return self.messages.try_recv().map_err(|error| match error {
                mpsc::TryRecvError::Empty => mpsc::RecvTimeoutError::Timeout,
                mpsc::TryRecvError::Disconnected => mpsc::RecvTimeoutError::Disconnected,
            });
        }
        self.messages.recv_timeout(within)
    }
}

impl Drop for InNamespace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server child's role: starts PostgreSQL listening on loopback and the near address
/// (trusting the pair's network), runs `beside` with it and that address (for what else
/// runs next to it, a PgBouncer say), says `ready PORT DIR WORDS…` (the words `beside`
/// answers) and keeps both until its input closes.
///
/// # Panics
/// When the server cannot start, or the parent did not set the environment
/// [`NearServer::start`] sets.
pub fn serve<T>(beside: impl FnOnce(&ThrowawayPostgres, &str) -> (T, Vec<String>)) {
    let listen = super::child::env(LISTEN);
    let server = ThrowawayPostgres::builder()
        .setting("listen_addresses", format!("'127.0.0.1,{listen}'"))
        .start()
        .expect("a throwaway PostgreSQL in the namespace");
    // Trust the far side too (the cluster trusts loopback only).
    server
        .trust(&super::child::env(NETWORK))
        .expect("trust the far side");
    let (kept, words) = beside(&server, &listen);
    say(&format!(
        "ready {} {} {}",
        server.port(),
        server.dir().display(),
        words.join(" ")
    ));
    while super::child::command().is_some() {}
    drop(kept);
    drop(server);
}

/// A [`NetworkPair`] and a server child ([`serve`]) on its near side. Dropping it stops
/// the child, then removes the namespaces.
#[derive(Debug)]
pub struct NearServer {
    /// Declared before the pair: dropped (killed) before the namespaces go.
    _child: InNamespace,
    pair: NetworkPair,
    port: u16,
    socket_dir: String,
    words: Vec<String>,
}

impl NearServer {
    /// Makes the pair (`name` and `octet` as [`NetworkPair::make`] takes them) and
    /// starts the test `test` on its near side with `env` (its role among it), which
    /// must play [`serve`].
    ///
    /// # Panics
    /// When the namespaces cannot be made (saying why: root and iproute2 are needed), or
    /// the server does not say it is ready within 120 s.
    #[must_use]
    pub fn start(name: &str, octet: u8, test: &str, env: &[(&str, &str)]) -> Self {
        let pair = NetworkPair::make(name, octet).unwrap_or_else(|error| panic!("{error}"));
        let (near_address, network) = (pair.near_address(), pair.network());
        let mut env = env.to_vec();
        env.extend([(LISTEN, near_address.as_str()), (NETWORK, network.as_str())]);
        let child = InNamespace::spawn(pair.near(), test, &env);
        let (_, ready) = child.next(READY, "the server started");
        let mut words = ready.split_whitespace().skip(1);
        let port = words
            .next()
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("not a ready line: {ready}"));
        let socket_dir = words
            .next()
            .unwrap_or_else(|| panic!("not a ready line: {ready}"))
            .to_owned();
        let words = words.map(str::to_owned).collect();
        Self {
            _child: child,
            pair,
            port,
            socket_dir,
            words,
        }
    }

    /// The pair: its far namespace for the clients that will be cut off.
    #[must_use]
    pub fn pair(&self) -> &NetworkPair {
        &self.pair
    }

    /// The words the server child's `beside` answered (ports of what runs beside it).
    #[must_use]
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// Through the server's Unix socket: how the test plays the other hosts.
    #[must_use]
    pub fn socket_url(&self) -> String {
        format!(
            "host={} port={} user=postgres dbname=postgres",
            self.socket_dir, self.port
        )
    }

    /// Over TCP to `port` (the server's when `None`) on the near address, as the far side
    /// connects.
    #[must_use]
    pub fn far_url(&self, port: Option<&str>) -> String {
        format!(
            "postgres://postgres@{}:{}/postgres",
            self.pair.near_address(),
            port.map_or_else(|| self.port.to_string(), str::to_owned)
        )
    }

    /// Takes the far end of the link down.
    ///
    /// # Panics
    /// When `ip` fails.
    pub fn cut(&self) {
        self.pair.cut().unwrap_or_else(|error| panic!("{error}"));
    }
}
