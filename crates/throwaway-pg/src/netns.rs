//! Two network namespaces joined by a veth pair: a "near" side (where a server runs) and a
//! "far" side (its clients), for tests of a network that fails without closing sockets.

use std::fmt;
use std::process::Command;

/// Two network namespaces, `near` and `far`, joined by a veth pair with one address in
/// each (`10.<a>.<b>.1` near, `.2` far, a /30 of their own), and loopback up in both.
/// [`cut`](Self::cut) takes the far end of the link down: packets are dropped both ways
/// and no socket is closed, as when a host loses power or a cable is cut.
///
/// Made with `ip` (iproute2), which needs root. Dropping the pair removes both
/// namespaces, and the veth pair with them, unless it was [`attach`](Self::attach)ed.
///
/// Only the two addresses of the pair are ever used: nothing is routed anywhere else.
#[derive(Debug)]
pub struct NetworkPair {
    near: String,
    far: String,
    far_link: String,
    /// The first three octets of the /30.
    net: String,
    owned: bool,
}

/// A namespace or link could not be made or changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkError {
    message: String,
}

impl fmt::Display for NetworkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NetworkError {}

fn ip(args: &[&str]) -> Result<(), NetworkError> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|error| NetworkError {
            message: format!(
                "network namespaces cannot be made here: `ip` did not run ({error}); \
                 this needs root and iproute2"
            ),
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(NetworkError {
        message: format!(
            "network namespaces cannot be made here: `ip {}` failed: {}; this needs root and \
             iproute2",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ),
    })
}

impl NetworkPair {
    /// Makes the pair. `name` (a few ASCII letters or digits) and this process's id name the
    /// namespaces (`<name>-near-<pid>`, `<name>-far-<pid>`); `second_octet` picks the
    /// address range (`10.<second_octet>.<pid % 250>.0/30`), so two users in one process
    /// tree pick different ones.
    ///
    /// # Errors
    /// A [`NetworkError`] that says which `ip` command failed and why (not root, no
    /// iproute2). What was made before the failure is removed.
    pub fn make(name: &str, second_octet: u8) -> Result<Self, NetworkError> {
        let id = std::process::id();
        let short = id % 100_000;
        let tag: String = name.chars().take(3).collect();
        let near_link = format!("{tag}n{short}");
        let pair = Self {
            near: format!("{name}-near-{id}"),
            far: format!("{name}-far-{id}"),
            far_link: format!("{tag}f{short}"),
            net: format!("10.{second_octet}.{}", id % 250),
            owned: true,
        };
        ip(&["netns", "add", &pair.near])?;
        ip(&["netns", "add", &pair.far])?;
        ip(&[
            "link",
            "add",
            &near_link,
            "type",
            "veth",
            "peer",
            "name",
            &pair.far_link,
        ])?;
        ip(&["link", "set", &near_link, "netns", &pair.near])?;
        ip(&["link", "set", &pair.far_link, "netns", &pair.far])?;
        for (namespace, link, host) in [(&pair.near, &near_link, 1), (&pair.far, &pair.far_link, 2)]
        {
            let address = format!("{}.{host}/30", pair.net);
            ip(&["-n", namespace, "addr", "add", &address, "dev", link])?;
            ip(&["-n", namespace, "link", "set", "lo", "up"])?;
            ip(&["-n", namespace, "link", "set", link, "up"])?;
        }
        Ok(pair)
    }

    /// A pair made by another process (see [`describe`](Self::describe)), to cut and heal
    /// from inside one of its namespaces; dropping it removes nothing.
    ///
    /// # Errors
    /// A [`NetworkError`] when `description` is not one [`describe`](Self::describe) made.
    pub fn attach(description: &str) -> Result<Self, NetworkError> {
        let mut parts = description.split(' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(near), Some(far), Some(far_link), Some(net)) => Ok(Self {
                near: near.to_owned(),
                far: far.to_owned(),
                far_link: far_link.to_owned(),
                net: net.to_owned(),
                owned: false,
            }),
            _ => Err(NetworkError {
                message: format!("not a network pair's description: {description:?}"),
            }),
        }
    }

    /// One word-separated line that [`attach`](Self::attach) reads back.
    #[must_use]
    pub fn describe(&self) -> String {
        format!("{} {} {} {}", self.near, self.far, self.far_link, self.net)
    }

    /// The near namespace's name.
    #[must_use]
    pub fn near(&self) -> &str {
        &self.near
    }

    /// The far namespace's name.
    #[must_use]
    pub fn far(&self) -> &str {
        &self.far
    }

    /// The near side's address (where a server listens for the far side).
    #[must_use]
    pub fn near_address(&self) -> String {
        format!("{}.1", self.net)
    }

    /// The far side's address.
    #[must_use]
    pub fn far_address(&self) -> String {
        format!("{}.2", self.net)
    }

    /// The pair's network (`10.a.b.0/30`), e.g. for a `pg_hba.conf` line.
    #[must_use]
    pub fn network(&self) -> String {
        format!("{}.0/30", self.net)
    }

    /// A command that runs `program` inside `namespace` (`ip netns exec`).
    #[must_use]
    pub fn command_in(namespace: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", namespace]).arg(program);
        command
    }

    /// Takes the far end of the link down: packets are dropped both ways, no socket
    /// closes.
    ///
    /// # Errors
    /// A [`NetworkError`] when `ip` fails.
    pub fn cut(&self) -> Result<(), NetworkError> {
        ip(&["-n", &self.far, "link", "set", &self.far_link, "down"])
    }

    /// Brings the far end of the link back up.
    ///
    /// # Errors
    /// A [`NetworkError`] when `ip` fails.
    pub fn heal(&self) -> Result<(), NetworkError> {
        ip(&["-n", &self.far, "link", "set", &self.far_link, "up"])
    }
}

impl Drop for NetworkPair {
    fn drop(&mut self) {
        if self.owned {
            for namespace in [&self.far, &self.near] {
                let _ = Command::new("ip")
                    .args(["netns", "del", namespace])
                    .status();
            }
        }
    }
}
