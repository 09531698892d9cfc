//! One throwaway cluster: a temporary folder, `initdb`, `pg_ctl`.

use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Error;
use crate::binaries::Binaries;
use crate::process::{RunAs, run};
use crate::watchdog::Watchdog;

/// The file that marks a folder as made by this crate; it holds the TCP port.
pub(crate) const MARKER_FILE: &str = "THROWAWAY_PG";
const DATA_DIR: &str = "data";
const LOG_FILE: &str = "postgres.log";
const HOST: &str = "127.0.0.1";
/// How many free ports to try when another process takes the chosen one first.
const PORT_ATTEMPTS: usize = 5;
/// Seconds `pg_ctl` waits for the server to start or stop.
const PG_CTL_TIMEOUT: &str = "60";

/// The settings every cluster gets, before those given to [`Builder::setting`].
const DEFAULT_SETTINGS: &[(&str, &str)] = &[
    // The lock benchmark holds 500 locks, one session each.
    ("max_connections", "600"),
    // Throwaway data: durability buys nothing and costs time.
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
];

/// Configures a [`ThrowawayPostgres`] before starting it; see [`ThrowawayPostgres::builder`].
#[derive(Debug, Clone)]
pub struct Builder {
    settings: Vec<(String, String)>,
    watchdog: bool,
    bin_dir: Option<PathBuf>,
    /// A primary to copy instead of running `initdb`.
    standby_of: Option<StandbySource>,
}

/// Where a standby's data folder comes from.
#[derive(Debug, Clone)]
pub(crate) enum StandbySource {
    /// `pg_basebackup -R` from the running primary on 127.0.0.1:`port`, through the
    /// replication slot `slot` (created by `pg_basebackup`).
    BaseBackup {
        /// The primary's port.
        port: u16,
        /// The physical replication slot the standby streams through.
        slot: String,
    },
    /// A copy of the data folder of a primary stopped cleanly; the caller sets
    /// `primary_conninfo` and `primary_slot_name`. For binary sets without `pg_basebackup`.
    StoppedCopy {
        /// The primary's data folder.
        data_dir: PathBuf,
    },
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            settings: Vec::new(),
            watchdog: true,
            bin_dir: None,
            standby_of: None,
        }
    }
}

impl Builder {
    /// Adds a `postgresql.conf` line `name = value`, written after the defaults
    /// (`max_connections = 600`, `fsync = off`, `synchronous_commit = off`,
    /// `full_page_writes = off`) so it overrides them. The value is written as is: quote
    /// strings the way `postgresql.conf` wants (`'…'`). A name other than ASCII letters,
    /// digits, `_` and `.`, or a value that is empty or spans lines, makes
    /// [`start`](Self::start) fail with [`Error::InvalidSetting`].
    #[must_use]
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Whether a watchdog process stops the server and removes its folder when this
    /// process exits without dropping the [`ThrowawayPostgres`] (a `static`, `SIGKILL`, Ctrl-C).
    /// On by default; [`ThrowawayPostgres::detach`] disarms it.
    #[must_use]
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Uses the server binaries in `dir` instead of searching for them.
    #[must_use]
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Makes the cluster a standby copied from `source` instead of running `initdb`; see
    /// [`crate::PrimaryWithStandby`].
    pub(crate) fn standby_of(mut self, source: StandbySource) -> Self {
        self.standby_of = Some(source);
        self
    }

    /// Creates the folder, runs `initdb`, and starts the server on a free port of 127.0.0.1.
    /// On error nothing is left behind.
    pub fn start(self) -> Result<ThrowawayPostgres, Error> {
        for (name, value) in &self.settings {
            if !valid_setting(name, value) {
                return Err(Error::InvalidSetting {
                    name: name.clone(),
                    value: value.clone(),
                });
            }
        }
        let bin = match self.bin_dir {
            Some(dir) => Binaries::at(dir)?,
            None => Binaries::find()?,
        };
        let run_as = RunAs::detect()?;
        let root = create_root()?;
        // From here on, dropping `pg` (on any error) stops whatever started and removes `root`.
        let mut pg = ThrowawayPostgres {
            bin,
            run_as,
            root,
            port: 0,
            watchdog: None,
            owned: true,
        };
        pg.write_marker()?;
        run_as.give(&pg.root)?;
        if self.watchdog {
            pg.watchdog = Some(Watchdog::spawn(
                run_as,
                &pg.bin.tool("pg_ctl"),
                &pg.root,
                &pg.data_dir(),
            )?);
        }
        match &self.standby_of {
            Some(StandbySource::BaseBackup { port, slot }) => pg.base_backup(*port, slot)?,
            Some(StandbySource::StoppedCopy { data_dir }) => pg.copy_stopped(data_dir)?,
            None => pg.initdb()?,
        }
        pg.configure(&self.settings)?;
        pg.start_on_a_free_port()?;
        Ok(pg)
    }
}

/// A PostgreSQL cluster in a temporary folder, listening on 127.0.0.1 only, with trust
/// authentication for the `postgres` user. Dropping it stops the server
/// (`pg_ctl stop -m immediate`) and removes the folder.
///
/// The folder holds `data/` (the cluster), `postgres.log` (the server log), the Unix socket,
/// and a marker file. As root, every server binary runs as the `postgres` user through
/// `runuser`, and the folder belongs to that user.
#[derive(Debug)]
pub struct ThrowawayPostgres {
    bin: Binaries,
    run_as: RunAs,
    root: PathBuf,
    port: u16,
    watchdog: Option<Watchdog>,
    /// Whether dropping stops the server and removes the folder.
    owned: bool,
}

impl ThrowawayPostgres {
    /// Starts a cluster with the default settings and a watchdog;
    /// see [`Builder::start`].
    pub fn start() -> Result<Self, Error> {
        Self::builder().start()
    }

    /// A builder for settings, the watchdog and the binaries' folder.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Adopts a cluster left running by [`detach`](Self::detach), given its folder (or its
    /// `data` folder): dropping the result stops it and removes the folder. No watchdog.
    /// A folder without this crate's marker file is refused and left untouched.
    pub fn attach(dir: impl AsRef<Path>) -> Result<Self, Error> {
        let mut root = dir.as_ref().to_path_buf();
        if !root.join(MARKER_FILE).is_file()
            && root.file_name().is_some_and(|name| name == DATA_DIR)
            && root.parent().is_some_and(|p| p.join(MARKER_FILE).is_file())
        {
            root.pop();
        }
        let not_ours = || Error::NotAThrowawayCluster {
            dir: dir.as_ref().to_path_buf(),
        };
        if !root.is_dir() {
            return Err(Error::io(
                format!("open the cluster folder {}", root.display()),
                io::Error::new(io::ErrorKind::NotFound, "no such folder"),
            ));
        }
        let marker = fs::read_to_string(root.join(MARKER_FILE)).map_err(|_| not_ours())?;
        let port = marker
            .lines()
            .find_map(|line| line.strip_prefix("port="))
            .and_then(|port| port.trim().parse().ok())
            .ok_or_else(not_ours)?;
        Ok(Self {
            bin: Binaries::find()?,
            run_as: RunAs::detect()?,
            root,
            port,
            watchdog: None,
            owned: true,
        })
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: user `postgres`, no password.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{HOST}:{}/postgres", self.port)
    }

    /// The TCP port on 127.0.0.1; it stays the same across [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The temporary folder that holds everything (and the Unix socket).
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The cluster's data folder (`PGDATA`).
    pub fn data_dir(&self) -> PathBuf {
        self.root.join(DATA_DIR)
    }

    /// The server log.
    pub fn log_file(&self) -> PathBuf {
        self.root.join(LOG_FILE)
    }

    /// The folder with the PostgreSQL binaries in use.
    pub fn bin_dir(&self) -> &Path {
        self.bin.dir()
    }

    /// Whether the server is running (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        let mut command = self.pg_ctl();
        command.arg("status");
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// Stops the server with a fast shutdown: sessions end, so their advisory locks are
    /// freed. The folder stays; [`start_again`](Self::start_again) brings it back.
    pub fn stop(&self) -> Result<(), Error> {
        self.pg_ctl_stop("fast")
    }

    /// Stops the server with an immediate shutdown, as close to a crash as `pg_ctl` gets.
    pub fn stop_immediately(&self) -> Result<(), Error> {
        self.pg_ctl_stop("immediate")
    }

    /// Starts a stopped server again, on the same port.
    pub fn start_again(&self) -> Result<(), Error> {
        self.pg_ctl_start()
    }

    /// [`stop`](Self::stop) then [`start_again`](Self::start_again): every session ends, the
    /// URL stays valid. Fails if another process took the port in between.
    pub fn restart(&self) -> Result<(), Error> {
        self.stop()?;
        self.start_again()
    }

    /// Lets clients from `network` (a CIDR such as `10.1.2.0/30`) in with trust
    /// authentication, as loopback already is, and reloads the configuration; for a server
    /// that listens on more than loopback (see [`crate::NetworkPair`]).
    ///
    /// # Errors
    /// [`Error::Io`] when `pg_hba.conf` cannot be written, [`Error::Command`] when the
    /// reload fails.
    pub fn trust(&self, network: &str) -> Result<(), Error> {
        let path = self.data_dir().join("pg_hba.conf");
        OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut file| writeln!(file, "host all all {network} trust"))
            .map_err(|source| Error::io(format!("append to {}", path.display()), source))?;
        self.psql("SELECT pg_reload_conf()").map(drop)
    }

    /// Runs `sql` with `psql` (over TCP, `ON_ERROR_STOP`) and returns its unaligned,
    /// tuples-only output, trimmed: `psql("select 1")` is `"1"`.
    pub fn psql(&self, sql: &str) -> Result<String, Error> {
        let mut command = self.psql_command();
        command
            .args(["-A", "-t", "-q", "-c", sql])
            .stdin(Stdio::null());
        let output = run(&mut command)?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// A `psql` command connected to this server (`-X -h 127.0.0.1 -p PORT -U postgres -d
    /// postgres -v ON_ERROR_STOP=1`), to which the caller adds arguments; for sessions that
    /// must stay open while a test does something else.
    pub fn psql_command(&self) -> Command {
        let mut command = Command::new(self.bin.tool("psql"));
        crate::process::client_env(&mut command);
        command
            .args(["-X", "-h", HOST, "-p"])
            .arg(self.port.to_string())
            .args(["-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1"]);
        command
    }

    /// Leaves the server running and the folder in place, disarms the watchdog, and returns
    /// the folder; [`attach`](Self::attach) adopts it again.
    pub fn detach(mut self) -> PathBuf {
        self.owned = false;
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.disarm();
        }
        self.root.clone()
    }

    /// Stops the server (immediate shutdown) and removes the folder, reporting what failed;
    /// dropping does the same but ignores failures.
    pub fn destroy(mut self) -> Result<(), Error> {
        self.owned = false;
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), Error> {
        let stopped = if self.data_dir().join("postmaster.pid").exists() {
            self.pg_ctl_stop("immediate")
        } else {
            Ok(())
        };
        let removed = match fs::remove_dir_all(&self.root) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => {
                Err(Error::io(format!("remove {}", self.root.display()), error))
            }
            _ => Ok(()),
        };
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.disarm();
        }
        stopped.and(removed)
    }

    fn pg_ctl(&self) -> Command {
        let mut command = self.run_as.command(&self.bin.tool("pg_ctl"), &self.root);
        command.arg("-D").arg(self.data_dir());
        command
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), Error> {
        let mut command = self.pg_ctl();
        command.args(["-m", mode, "-w", "-t", PG_CTL_TIMEOUT, "stop"]);
        run(&mut command).map(drop)
    }

    fn pg_ctl_start(&self) -> Result<(), Error> {
        let mut command = self.pg_ctl();
        command
            .arg("-l")
            .arg(self.log_file())
            .args(["-w", "-t", PG_CTL_TIMEOUT, "start"]);
        match run(&mut command) {
            Ok(_) => Ok(()),
            Err(Error::Command {
                command,
                status,
                mut output,
            }) => {
                let _ = write!(output, "\n--- end of {} ---\n", self.log_file().display());
                output.push_str(&self.log_tail());
                Err(Error::Command {
                    command,
                    status,
                    output,
                })
            }
            Err(other) => Err(other),
        }
    }

    fn initdb(&self) -> Result<(), Error> {
        let mut command = self.run_as.command(&self.bin.tool("initdb"), &self.root);
        command.arg("-D").arg(self.data_dir()).args([
            "--auth=trust",
            "--username=postgres",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        run(&mut command).map(drop)
    }

    /// Copies the primary on 127.0.0.1:`primary_port` into the data folder, streaming the WAL
    /// written meanwhile (`-X stream`), through the replication slot `slot` (`-C -S`) so the
    /// primary keeps the WAL the standby has not received, and with `-R`: `standby.signal`
    /// and the `primary_conninfo` that points back at the primary.
    fn base_backup(&self, primary_port: u16, slot: &str) -> Result<(), Error> {
        let mut command = self
            .run_as
            .command(&self.bin.tool("pg_basebackup"), &self.root);
        command
            .arg("-D")
            .arg(self.data_dir())
            .args([
                "-R", "-X", "stream", "-c", "fast", "-C", "-S", slot, "-h", HOST,
            ])
            .arg("-p")
            .arg(primary_port.to_string())
            .args(["-U", "postgres", "--no-sync"]);
        run(&mut command).map(drop)
    }

    /// Copies the data folder of a cleanly stopped primary (`cp -a`, as the server's user)
    /// and marks the copy a standby (`standby.signal`).
    fn copy_stopped(&self, primary_data_dir: &Path) -> Result<(), Error> {
        let mut command = self.run_as.command(Path::new("cp"), &self.root);
        command.arg("-a").arg(primary_data_dir).arg(self.data_dir());
        run(&mut command)?;
        for stale in ["postmaster.pid", "postmaster.opts"] {
            let _ = fs::remove_file(self.data_dir().join(stale));
        }
        let signal = self.data_dir().join("standby.signal");
        fs::write(&signal, "")
            .map_err(|source| Error::io(format!("write {}", signal.display()), source))?;
        self.run_as.give(&self.root)
    }

    /// Appends our settings to `postgresql.conf` (the last line for a name wins).
    fn configure(&self, extra: &[(String, String)]) -> Result<(), Error> {
        let socket_dir = self.root.to_string_lossy().replace('\'', "''");
        let mut text = format!(
            "\n# Added by throwaway-pg\nlisten_addresses = '{HOST}'\n\
             unix_socket_directories = '{socket_dir}'\n"
        );
        for (name, value) in DEFAULT_SETTINGS {
            let _ = writeln!(text, "{name} = {value}");
        }
        for (name, value) in extra {
            let _ = writeln!(text, "{name} = {value}");
        }
        self.append_conf(&text)
    }

    fn append_conf(&self, text: &str) -> Result<(), Error> {
        let path = self.data_dir().join("postgresql.conf");
        OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(text.as_bytes()))
            .map_err(|source| Error::io(format!("append to {}", path.display()), source))
    }

    fn start_on_a_free_port(&mut self) -> Result<(), Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.port = free_port()?;
            self.write_marker()?;
            self.append_conf(&format!("port = {}\n", self.port))?;
            match self.pg_ctl_start() {
                Err(Error::Command { output, .. })
                    if attempt < PORT_ATTEMPTS && output.contains("could not bind") => {}
                result => return result,
            }
        }
    }

    fn write_marker(&self) -> Result<(), Error> {
        let path = self.root.join(MARKER_FILE);
        fs::write(&path, format!("port={}\n", self.port))
            .map_err(|source| Error::io(format!("write {}", path.display()), source))
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_file()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        if self.owned {
            // Errors have nowhere to go from `drop`; `destroy` reports them.
            let _ = self.teardown();
        }
    }
}

/// A new, empty folder under the temporary folder, readable only by its owner.
pub(crate) fn create_root() -> Result<PathBuf, Error> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        let name = format!(
            "throwaway-pg.{}.{}.{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = base.join(name);
        match fs::create_dir(&path) {
            Ok(()) => {
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).map_err(
                        |source| Error::io(format!("restrict {}", path.display()), source),
                    )?;
                }
                return Ok(path);
            }
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => {
                return Err(Error::io(
                    format!("create folder {}", path.display()),
                    error,
                ));
            }
        }
    }
}

/// A port that was free a moment ago: bind 127.0.0.1:0, read the port, close.
pub(crate) fn free_port() -> Result<u16, Error> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|source| Error::io("find a free TCP port on 127.0.0.1", source))
}

fn valid_setting(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && !value.trim().is_empty()
        && !value.contains(['\n', '\r'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_could_break_postgresql_conf_are_refused() {
        assert!(valid_setting("max_connections", "600"));
        assert!(valid_setting("log_line_prefix", "'%m [%p] '"));
        assert!(valid_setting("auto_explain.log_min_duration", "0"));
        assert!(!valid_setting("", "1"));
        assert!(!valid_setting("max connections", "1"));
        assert!(!valid_setting("fsync", ""));
        assert!(!valid_setting("fsync", "off\nport = 1"));
    }
}
