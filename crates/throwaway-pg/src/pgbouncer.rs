//! A throwaway PgBouncer in front of a server: for tests of code that must work behind a
//! session- or transaction-pooling proxy.

use std::fmt::Write as _;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::client_env;

mod error;
mod os;
mod upstream;

pub use error::PgBouncerError;
use error::io_error;
use os::{Identity, Watchdog, create_dir, find_binary, free_port};
use upstream::Upstream;

/// Environment variable naming the `pgbouncer` binary; when set it wins over the `PATH`.
pub const PGBOUNCER_ENV: &str = "THROWAWAY_PGBOUNCER";

/// Where Debian's `pgbouncer` package installs it (not on an ordinary user's `PATH`).
const DEBIAN_BINARY: &str = "/usr/sbin/pgbouncer";
const HOST: &str = "127.0.0.1";
const CONFIG_FILE: &str = "pgbouncer.ini";
const AUTH_FILE: &str = "userlist.txt";
const LOG_FILE: &str = "pgbouncer.log";
const STDERR_FILE: &str = "pgbouncer.stderr";
/// How long PgBouncer has to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How many free ports to try when another process takes the chosen one first.
const PORT_ATTEMPTS: usize = 5;

/// When PgBouncer hands a server connection back to its pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PoolMode {
    /// When the client disconnects (`pool_mode = session`): a client keeps one server session.
    #[default]
    Session,
    /// When each transaction ends (`pool_mode = transaction`): consecutive transactions of
    /// one client may run on different server sessions, so session state (session advisory
    /// locks, `SET`, prepared statements) does not follow the client.
    Transaction,
}

impl PoolMode {
    /// The value of PgBouncer's `pool_mode` setting: `session` or `transaction`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// Configures a [`PgBouncer`]; see [`PgBouncer::builder`].
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct PgBouncerBuilder {
    pool_mode: PoolMode,
    settings: Vec<(String, String)>,
    binary: Option<PathBuf>,
}

impl PgBouncerBuilder {
    /// The pool mode (default [`PoolMode::Session`]).
    pub fn pool_mode(mut self, mode: PoolMode) -> Self {
        self.pool_mode = mode;
        self
    }

    /// Adds a `[pgbouncer]` line `name = value` after ours, so it overrides them (e.g.
    /// `default_pool_size`). A name other than ASCII letters, digits and `_`, or a value
    /// that is empty or spans lines, makes [`start`](Self::start) fail with
    /// [`PgBouncerError::InvalidSetting`].
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Uses this `pgbouncer` binary instead of searching for one.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Starts PgBouncer on a free port of 127.0.0.1 in front of the server named by
    /// `server_url` (`postgres://[user[:password]@]host[:port][/database]`, as
    /// [`ThrowawayPostgres::url`](crate::ThrowawayPostgres::url) gives), and waits until it
    /// accepts connections. Clients authenticate with `auth_type = trust` (no password asked);
    /// PgBouncer logs in to the server as the URL's user with the URL's password. As root it
    /// runs as the `postgres` user (PgBouncer refuses root). On error nothing is left behind.
    pub fn start(self, server_url: &str) -> Result<PgBouncer, PgBouncerError> {
        for (name, value) in &self.settings {
            if !valid_setting(name, value) {
                return Err(PgBouncerError::InvalidSetting {
                    name: name.clone(),
                    value: value.clone(),
                });
            }
        }
        let binary = match self.binary {
            Some(path) if path.is_file() => path,
            Some(path) => {
                return Err(PgBouncerError::NotInstalled {
                    looked_in: vec![path.display().to_string()],
                });
            }
            None => find_binary()?,
        };
        let upstream = Upstream::parse(server_url)?;
        let identity = Identity::detect()?;
        let root = create_dir()?;
        let mut bouncer = PgBouncer {
            root,
            port: 0,
            pool_mode: self.pool_mode,
            client_userinfo: upstream.userinfo_raw.clone(),
            client_database: upstream.database_raw.clone(),
            child: None,
            watchdog: None,
        };
        // From here on, dropping `bouncer` (on any error) stops what started and removes `root`.
        bouncer.write_auth_file(&upstream)?;
        identity.give(&bouncer.root)?;
        bouncer.watchdog = Some(Watchdog::spawn(&bouncer.root)?);
        let mut attempt = 0;
        loop {
            attempt += 1;
            bouncer.port = free_port()?;
            bouncer.write_config(&upstream, &self.settings)?;
            identity.give(&bouncer.root)?;
            match bouncer.launch(&binary, identity) {
                Err(PgBouncerError::Exited { log, .. })
                    if attempt < PORT_ATTEMPTS && log.contains("Address already in use") => {}
                Err(error) => return Err(error),
                Ok(()) => return Ok(bouncer),
            }
        }
    }
}

/// A PgBouncer in a temporary folder, listening on 127.0.0.1 only, in front of one server,
/// with trust authentication for its clients. Dropping it kills PgBouncer (its server
/// sessions end with it) and removes the folder; a watchdog does the same if this process
/// ends without dropping it (Ctrl-C, `SIGKILL`).
///
/// ```no_run
/// use throwaway_pg::{PgBouncer, PoolMode, ThrowawayPostgres};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pg = ThrowawayPostgres::start()?;
/// let bouncer = PgBouncer::builder()
///     .pool_mode(PoolMode::Transaction)
///     .start(&pg.url())?;
/// println!("{}", bouncer.url()); // postgres://postgres@127.0.0.1:PORT/postgres
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PgBouncer {
    root: PathBuf,
    port: u16,
    pool_mode: PoolMode,
    /// `user[:password]` as written in the server's URL (still percent-encoded).
    client_userinfo: Option<String>,
    /// The database as written in the server's URL (still percent-encoded).
    client_database: Option<String>,
    child: Option<Child>,
    watchdog: Option<Watchdog>,
}

impl PgBouncer {
    /// A builder: pool mode, extra settings, the binary.
    pub fn builder() -> PgBouncerBuilder {
        PgBouncerBuilder::default()
    }

    /// Starts one in `mode` in front of `server_url`; see [`PgBouncerBuilder::start`].
    pub fn start(server_url: &str, mode: PoolMode) -> Result<Self, PgBouncerError> {
        Self::builder().pool_mode(mode).start(server_url)
    }

    /// The URL clients connect to: the server's URL (same user, password and database) with
    /// PgBouncer's host and port.
    pub fn url(&self) -> String {
        self.url_of(self.client_database.as_deref())
    }

    /// The URL of PgBouncer's admin console (database `pgbouncer`: `SHOW POOLS`, …).
    pub fn admin_url(&self) -> String {
        self.url_of(Some("pgbouncer"))
    }

    fn url_of(&self, database: Option<&str>) -> String {
        let userinfo = self
            .client_userinfo
            .as_deref()
            .map(|userinfo| format!("{userinfo}@"))
            .unwrap_or_default();
        let database = database.map(|db| format!("/{db}")).unwrap_or_default();
        format!("postgres://{userinfo}{HOST}:{}{database}", self.port)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pool mode it runs in.
    pub fn pool_mode(&self) -> PoolMode {
        self.pool_mode
    }

    /// The temporary folder holding the configuration and the log.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// PgBouncer's log.
    pub fn log_file(&self) -> PathBuf {
        self.root.join(LOG_FILE)
    }

    /// Whether PgBouncer is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    fn write_auth_file(&self, upstream: &Upstream) -> Result<(), PgBouncerError> {
        let path = self.root.join(AUTH_FILE);
        let text = format!(
            "\"{}\" \"{}\"\n",
            upstream.user,
            upstream.password.as_deref().unwrap_or("")
        );
        fs::write(&path, text)
            .map_err(|source| io_error(format!("write {}", path.display()), source))
    }

    fn write_config(
        &self,
        upstream: &Upstream,
        extra: &[(String, String)],
    ) -> Result<(), PgBouncerError> {
        let root = self.root.display();
        let mut server = format!("host={} port={}", upstream.host, upstream.port);
        if let Some(password) = &upstream.password {
            let _ = write!(server, " password={password}");
        }
        let mut text = format!(
            "; Written by throwaway-pg\n\
             [databases]\n\
             * = {server}\n\
             \n\
             [pgbouncer]\n\
             listen_addr = {HOST}\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {root}/{AUTH_FILE}\n\
             admin_users = {user}\n\
             pool_mode = {mode}\n\
             logfile = {root}/{LOG_FILE}\n\
             max_client_conn = 1000\n\
             default_pool_size = 20\n\
             ignore_startup_parameters = extra_float_digits\n",
            port = self.port,
            user = upstream.user,
            mode = self.pool_mode.as_str(),
        );
        for (name, value) in extra {
            let _ = writeln!(text, "{name} = {value}");
        }
        let path = self.root.join(CONFIG_FILE);
        fs::write(&path, text)
            .map_err(|source| io_error(format!("write {}", path.display()), source))
    }

    /// Starts the process and waits until it listens, or fails with its log.
    fn launch(&mut self, binary: &Path, identity: Identity) -> Result<(), PgBouncerError> {
        let stderr_path = self.root.join(STDERR_FILE);
        let stderr = fs::File::create(&stderr_path)
            .map_err(|source| io_error(format!("create {}", stderr_path.display()), source))?;
        let mut command = Command::new(binary);
        command.arg(self.root.join(CONFIG_FILE));
        client_env(&mut command);
        identity.apply(&mut command);
        command
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        // Its own process group: the Ctrl-C that ends a test run reaches the watchdog's
        // clean-up instead of leaving half a shutdown.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .spawn()
            .map_err(|source| io_error(format!("run {}", binary.display()), source))?;
        if let Some(watchdog) = &mut self.watchdog {
            watchdog.watch(child.id());
        }
        let child = self.child.insert(child);
        let deadline = Instant::now() + START_TIMEOUT;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(PgBouncerError::Exited {
                    status: status.to_string(),
                    log: self.log_text(),
                });
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(PgBouncerError::NotListening {
                    port: self.port,
                    log: self.log_text(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The end of the log and whatever PgBouncer wrote to standard error, for errors.
    fn log_text(&self) -> String {
        let mut text = String::new();
        for file in [STDERR_FILE, LOG_FILE] {
            let content = fs::read_to_string(self.root.join(file)).unwrap_or_default();
            let lines: Vec<&str> = content.lines().collect();
            for line in &lines[lines.len().saturating_sub(20)..] {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Errors have nowhere to go from `drop`: a process that already exited is fine.
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.disarm();
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn valid_setting(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !value.trim().is_empty()
        && !value.contains(['\n', '\r'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_could_break_the_config_are_refused() {
        assert!(valid_setting("default_pool_size", "5"));
        assert!(!valid_setting("pool mode", "session"));
        assert!(!valid_setting("pool_mode", ""));
        assert!(!valid_setting("pool_mode", "session\nlisten_port = 1"));
    }
}
