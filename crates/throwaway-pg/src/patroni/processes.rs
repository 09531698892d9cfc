//! The processes of a [`PatroniCluster`]: their configuration, how they are started as
//! the server's user, `patronictl`, and how they are stopped.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Instant;

use super::{
    LOOP_WAIT, POLL, PatroniCluster, Place, RETRY_TIMEOUT, START, STOP, TTL, WAL_SENDER_TIMEOUT,
};
use crate::process::{client_env, run};
use crate::{Error, NetworkPair};

impl PatroniCluster {
    pub(super) fn write_config(&self, index: usize) -> Result<(), Error> {
        let node = &self.nodes[index];
        let home = self.root.join(&node.name);
        fs::create_dir_all(&home)
            .map_err(|source| Error::io(format!("create folder {}", home.display()), source))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&home, fs::Permissions::from_mode(0o700))
                .map_err(|source| Error::io(format!("restrict {}", home.display()), source))?;
        }
        let mut yaml = String::new();
        let root = self.root.display();
        let _ = write!(
            yaml,
            "scope: throwaway\n\
             namespace: /throwaway/\n\
             name: {name}\n\
             restapi:\n  listen: {address}:{rest}\n  connect_address: {address}:{rest}\n\
             etcd3:\n  hosts: {etcd_address}:{etcd}\n\
             bootstrap:\n  dcs:\n    ttl: {TTL}\n    loop_wait: {LOOP_WAIT}\n    \
             retry_timeout: {RETRY_TIMEOUT}\n    synchronous_mode: true\n    \
             postgresql:\n      use_pg_rewind: true\n      use_slots: true\n      \
             parameters:\n        max_connections: 200\n        wal_level: replica\n        \
             hot_standby: 'on'\n        wal_log_hints: 'on'\n        fsync: 'off'\n        \
             full_page_writes: 'on'\n        \
             wal_sender_timeout: {WAL_SENDER_TIMEOUT}\n  \
             initdb:\n    - encoding: UTF8\n    - locale: C\n    - auth: trust\n  \
             pg_hba:\n    - local all all trust\n    \
             - host replication all {network} trust\n    \
             - host all all {network} trust\n\
             postgresql:\n  listen: {address}:{pg}\n  connect_address: {address}:{pg}\n  \
             data_dir: {root}/{name}/data\n  bin_dir: {bin}\n  pgpass: {root}/{name}/pgpass\n  \
             authentication:\n    replication:\n      username: postgres\n    \
             superuser:\n      username: postgres\n    rewind:\n      username: postgres\n  \
             parameters:\n    unix_socket_directories: {root}/{name}\n",
            name = node.name,
            address = node.place.address,
            etcd_address = self.etcd_place.address,
            network = self
                .network
                .as_ref()
                .map_or_else(|| "127.0.0.1/32".to_owned(), crate::NetworkPair::network),
            rest = node.rest_port,
            etcd = self.etcd_port,
            pg = node.pg_port,
            bin = self.bin.dir().display(),
        );
        fs::write(&node.config, yaml)
            .map_err(|source| Error::io(format!("write {}", node.config.display()), source))
    }

    /// A command for `program` as the server's user at `place`, its output into `log`.
    pub(super) fn command(
        &self,
        place: &Place,
        program: &Path,
        log: &Path,
    ) -> Result<Command, Error> {
        let mut command = match &place.namespace {
            None => {
                let mut command = Command::new(program);
                #[cfg(unix)]
                if let Some((uid, gid)) = self.ids {
                    use std::os::unix::process::CommandExt;
                    command.uid(uid).gid(gid);
                }
                command
            }
            // `ip netns exec` and `setpriv` both exec: the child's pid is the program's.
            Some(namespace) => {
                let mut command = NetworkPair::command_in(namespace, "setpriv");
                if let Some((uid, gid)) = self.ids {
                    command.args([
                        format!("--reuid={uid}"),
                        format!("--regid={gid}"),
                        "--init-groups".to_owned(),
                    ]);
                }
                command.arg(program);
                command
            }
        };
        client_env(&mut command);
        let open = || {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|source| Error::io(format!("open {}", log.display()), source))
        };
        command
            .current_dir(&self.root)
            .env("HOME", &self.root)
            .stdin(Stdio::null())
            .stdout(open()?)
            .stderr(open()?);
        Ok(command)
    }

    pub(super) fn start_etcd(&mut self, peer_port: u16) -> Result<(), Error> {
        let etcd = find_tool("etcd").ok_or_else(|| Error::HaNotInstalled {
            missing: vec!["etcd".to_owned()],
        })?;
        let address = &self.etcd_place.address;
        let client = format!("http://{address}:{}", self.etcd_port);
        let peer = format!("http://{address}:{peer_port}");
        let mut command = self.command(&self.etcd_place, &etcd, &self.root.join("etcd.log"))?;
        command
            .args(["--name", "etcd0", "--data-dir"])
            .arg(self.root.join("etcd"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("etcd0={peer}")]);
        self.etcd = Some(spawn(&mut command)?);
        self.wait(START, "etcd to answer", |cluster| {
            cluster
                .http_get(&cluster.etcd_place, cluster.etcd_port, "/version")
                .is_some()
        })
    }

    pub(super) fn start_node(&mut self, index: usize) -> Result<(), Error> {
        let patroni = find_tool("patroni").ok_or_else(|| Error::HaNotInstalled {
            missing: vec!["patroni".to_owned()],
        })?;
        let log = self.root.join(format!("{}.log", self.nodes[index].name));
        let mut command = self.command(&self.nodes[index].place, &patroni, &log)?;
        command.arg(&self.nodes[index].config);
        self.nodes[index].process = Some(spawn(&mut command)?);
        Ok(())
    }

    pub(super) fn patronictl(&self, args: &[&str]) -> Result<(), Error> {
        let patronictl = find_tool("patronictl").ok_or_else(|| Error::HaNotInstalled {
            missing: vec!["patronictl".to_owned()],
        })?;
        // Where etcd is reached: as root, in etcd's namespace when it has one.
        let mut command = match &self.etcd_place.namespace {
            None => self.run_as.command(&patronictl, &self.root),
            Some(namespace) => {
                let mut command = NetworkPair::command_in(namespace, &patronictl);
                command.current_dir(&self.root).stdin(Stdio::null());
                command
            }
        };
        command
            .env("HOME", &self.root)
            .arg("-c")
            .arg(&self.nodes[1].config)
            .args(args);
        let output = run(&mut command)?;
        // patronictl exits 0 when a switchover or failover fails ("Switchover failed,
        // details: 412, ..."); only its success line says it worked ("Successfully
        // switched over to", "Successfully failed over to").
        let said = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        if !said.contains("Successfully") {
            return Err(Error::Command {
                command: crate::process::display(&command),
                status: output.status,
                output: said,
            });
        }
        Ok(())
    }
}

/// `SIGTERM`, then `SIGKILL` if it has not exited within [`STOP`]; reaps it.
pub(super) fn stop(mut process: Child) {
    let pid = process.id().to_string();
    let _ = Command::new("kill")
        .args(["-TERM", &pid])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let started = Instant::now();
    while started.elapsed() < STOP {
        if matches!(process.try_wait(), Ok(Some(_))) {
            return;
        }
        thread::sleep(POLL);
    }
    let _ = process.kill();
    let _ = process.wait();
}

pub(super) fn spawn(command: &mut Command) -> Result<Child, Error> {
    command.spawn().map_err(|source| {
        Error::io(
            format!("start `{}`", crate::process::display(command)),
            source,
        )
    })
}

/// `program` on `PATH`, else in `/usr/bin`.
pub(super) fn find_tool(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

/// The `postgres` user's uid (`-u`) or gid (`-g`).
pub(super) fn postgres_id(which: &str) -> Result<u32, Error> {
    let output = run(Command::new("id")
        .args([which, "postgres"])
        .stdin(Stdio::null()))?;
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|_| {
            Error::io(
                format!("read `id {which} postgres`"),
                io::Error::new(io::ErrorKind::InvalidData, "not a number"),
            )
        })
}
