//! A throwaway PgBouncer in front of a server: for tests of code that must work behind a
//! session- or transaction-pooling proxy.

use std::fmt;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::client_env;

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

/// Why a throwaway PgBouncer could not be started.
#[derive(Debug)]
#[non_exhaustive]
pub enum PgBouncerError {
    /// No `pgbouncer` binary was found. Install PgBouncer (`apt-get install pgbouncer`;
    /// `scripts/install-test-deps.sh` does it), or name the binary in `THROWAWAY_PGBOUNCER`.
    NotInstalled {
        /// The places that were searched, in order.
        looked_in: Vec<String>,
    },
    /// The server URL is not one this launcher can put behind PgBouncer.
    InvalidUrl {
        /// What is wrong with it (the URL itself is left out: it may hold a password).
        reason: String,
    },
    /// A setting given to [`PgBouncerBuilder::setting`] cannot be written to the config.
    InvalidSetting {
        /// The setting's name as given.
        name: String,
        /// The setting's value as given.
        value: String,
    },
    /// Running as root, with no `postgres` user to run PgBouncer as (it refuses root).
    NoUnprivilegedUser,
    /// PgBouncer exited while starting.
    Exited {
        /// How it exited.
        status: String,
        /// The end of its log and standard error.
        log: String,
    },
    /// PgBouncer did not listen on its port in time.
    NotListening {
        /// The port it was told to listen on.
        port: u16,
        /// The end of its log and standard error.
        log: String,
    },
    /// A file-system or process-spawning operation failed.
    Io {
        /// What was being done.
        action: String,
        /// The operating system's error.
        source: io::Error,
    },
}

impl fmt::Display for PgBouncerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled { looked_in } => write!(
                f,
                "pgbouncer was not found (looked in: {}); install PgBouncer: \
                 `apt-get install pgbouncer` (Debian, Ubuntu; `scripts/install-test-deps.sh` \
                 does it and `cargo xtask test` runs that), `dnf install pgbouncer` (Fedora), \
                 `brew install pgbouncer` (macOS), or set {PGBOUNCER_ENV} to the binary",
                looked_in.join(", ")
            ),
            Self::InvalidUrl { reason } => write!(
                f,
                "cannot put PgBouncer in front of the server URL: {reason}"
            ),
            Self::InvalidSetting { name, value } => write!(
                f,
                "invalid PgBouncer setting `{name} = {value}`: a name is ASCII letters, digits \
                 and `_`; a value is one non-empty line"
            ),
            Self::NoUnprivilegedUser => f.write_str(
                "running as root, which PgBouncer refuses, and there is no `postgres` user to \
                 run it as",
            ),
            Self::Exited { status, log } => {
                write!(
                    f,
                    "pgbouncer exited while starting ({status}):\n{}",
                    log.trim_end()
                )
            }
            Self::NotListening { port, log } => write!(
                f,
                "pgbouncer did not listen on {HOST}:{port} within {}s:\n{}",
                START_TIMEOUT.as_secs(),
                log.trim_end()
            ),
            Self::Io { action, source } => write!(f, "could not {action}: {source}"),
        }
    }
}

impl std::error::Error for PgBouncerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_error(action: impl Into<String>, source: io::Error) -> PgBouncerError {
    PgBouncerError::Io {
        action: action.into(),
        source,
    }
}

/// `$THROWAWAY_PGBOUNCER`, else `pgbouncer` on the `PATH`, else Debian's `/usr/sbin/pgbouncer`.
fn find_binary() -> Result<PathBuf, PgBouncerError> {
    let mut looked_in = Vec::new();
    if let Some(path) = std::env::var_os(PGBOUNCER_ENV).filter(|path| !path.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        looked_in.push(format!("{PGBOUNCER_ENV}={}", path.display()));
    }
    if let Some(path) = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("pgbouncer"))
        .find(|path| path.is_file())
    {
        return Ok(path);
    }
    looked_in.push("PATH".to_owned());
    let debian = PathBuf::from(DEBIAN_BINARY);
    if debian.is_file() {
        return Ok(debian);
    }
    looked_in.push(DEBIAN_BINARY.to_owned());
    Err(PgBouncerError::NotInstalled { looked_in })
}

/// The server behind PgBouncer, from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Upstream {
    host: String,
    port: u16,
    user: String,
    password: Option<String>,
    /// `user[:password]` as written, for the client URL.
    userinfo_raw: Option<String>,
    /// The database as written, for the client URL.
    database_raw: Option<String>,
}

impl Upstream {
    fn parse(url: &str) -> Result<Self, PgBouncerError> {
        let invalid = |reason: &str| PgBouncerError::InvalidUrl {
            reason: reason.to_owned(),
        };
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| invalid("it does not start with postgres:// or postgresql://"))?;
        let (rest, _query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, database) = match rest.split_once('/') {
            Some((authority, database)) => (authority, Some(database)),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        if hostport.contains(',') {
            return Err(invalid("it names several hosts"));
        }
        let port_number = |port: &str| {
            port.parse::<u16>()
                .map_err(|_| invalid("its port is not a number from 1 to 65535"))
        };
        let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| invalid("its IPv6 address has no closing `]`"))?;
            match after.strip_prefix(':') {
                Some(port) => (host, port_number(port)?),
                None if after.is_empty() => (host, 5432),
                None => return Err(invalid("it has text after its IPv6 address")),
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((host, port)) => (host, port_number(port)?),
                None => (hostport, 5432),
            }
        };
        if host.is_empty() {
            return Err(invalid("it names no host (a Unix socket is not supported)"));
        }
        let (user, password) = match userinfo {
            Some(userinfo) => match userinfo.split_once(':') {
                Some((user, password)) => (decode(user)?, Some(decode(password)?)),
                None => (decode(userinfo)?, None),
            },
            None => (
                std::env::var("USER").unwrap_or_else(|_| "postgres".to_owned()),
                None,
            ),
        };
        let safe = |text: &str| {
            !text.is_empty()
                && !text
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || "\"'\\;#=".contains(c))
        };
        if !safe(host) || !safe(&user) || password.as_deref().is_some_and(|p| !safe(p)) {
            return Err(invalid(
                "its host, user or password is empty or holds whitespace, quotes, `\\`, `;`, \
                 `#` or `=`, which this launcher does not write into PgBouncer's files",
            ));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
            user,
            password,
            userinfo_raw: userinfo.map(str::to_owned),
            database_raw: database.filter(|db| !db.is_empty()).map(str::to_owned),
        })
    }
}

/// Percent-decoding of a URL part.
fn decode(text: &str) -> Result<String, PgBouncerError> {
    let invalid = || PgBouncerError::InvalidUrl {
        reason: "it holds an invalid percent-escape".to_owned(),
    };
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or_else(invalid)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| invalid())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid())
}

fn valid_setting(name: &str, value: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !value.trim().is_empty()
        && !value.contains(['\n', '\r'])
}

/// The user PgBouncer runs as: this process's, or `postgres` when this process is root.
#[derive(Debug, Clone, Copy)]
enum Identity {
    CurrentUser,
    Unprivileged { uid: u32, gid: u32 },
}

impl Identity {
    fn detect() -> Result<Self, PgBouncerError> {
        if id(&["-u"]) != Some(0) {
            return Ok(Self::CurrentUser);
        }
        match (id(&["-u", "postgres"]), id(&["-g", "postgres"])) {
            (Some(uid), Some(gid)) => Ok(Self::Unprivileged { uid, gid }),
            _ => Err(PgBouncerError::NoUnprivilegedUser),
        }
    }

    /// Makes `command` run as this identity (std drops root's supplementary groups too).
    fn apply(self, command: &mut Command) {
        if let Self::Unprivileged { uid, gid } = self {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid);
        }
    }

    /// Hands the folder and its files to this identity.
    fn give(self, root: &Path) -> Result<(), PgBouncerError> {
        if let Self::Unprivileged { uid, gid } = self {
            let mut paths = vec![root.to_path_buf()];
            let entries = fs::read_dir(root)
                .map_err(|source| io_error(format!("list {}", root.display()), source))?;
            paths.extend(entries.filter_map(Result::ok).map(|entry| entry.path()));
            for path in paths {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .map_err(|source| io_error(format!("chown {}", path.display()), source))?;
            }
        }
        Ok(())
    }
}

/// `id <args>` as a number.
fn id(args: &[&str]) -> Option<u32> {
    let output = Command::new("id")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8(output.stdout).ok()?.trim().parse().ok()
}

/// A new folder under the temporary folder, readable only by its owner.
fn create_dir() -> Result<PathBuf, PgBouncerError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "throwaway-pgbouncer.{}.{}.{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut builder = fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        match builder.create(&path) {
            Ok(()) => return Ok(path),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io_error(format!("create folder {}", path.display()), error)),
        }
    }
}

/// A port that was free a moment ago.
fn free_port() -> Result<u16, PgBouncerError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|source| io_error("find a free TCP port on 127.0.0.1", source))
}

/// A detached `sh` that kills PgBouncer and removes its folder if this process ends without
/// dropping the [`PgBouncer`]: it reads a pipe only this process writes to, so it sees
/// end-of-file when this process exits, however it exits. `done` disarms it.
#[derive(Debug)]
struct Watchdog {
    child: Child,
    pipe: Option<ChildStdin>,
}

/// `$1` is the folder; each line read before end-of-file names a pid to kill.
const WATCHDOG_SCRIPT: &str = r#"pid=
while IFS= read -r line; do
    [ "$line" = done ] && exit 0
    pid=$line
done
[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
rm -rf -- "$1"
"#;

impl Watchdog {
    fn spawn(root: &Path) -> Result<Self, PgBouncerError> {
        let mut command = Command::new("sh");
        command
            .args(["-c", WATCHDOG_SCRIPT, "throwaway-pgbouncer-watchdog"])
            .arg(root)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .map_err(|source| io_error("start the clean-up watchdog (`sh`)", source))?;
        let pipe = child.stdin.take();
        Ok(Self { child, pipe })
    }

    /// Tells the watchdog which process to kill.
    fn watch(&mut self, pid: u32) {
        if let Some(pipe) = &mut self.pipe {
            // If the write fails the watchdog is gone; nothing more can be done.
            let _ = writeln!(pipe, "{pid}");
        }
    }

    /// Tells the watchdog to leave everything alone (this process cleans up) and waits for it.
    fn disarm(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(b"done\n");
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_are_read_like_libpq_reads_them() {
        let upstream = Upstream::parse("postgres://postgres@127.0.0.1:5433/postgres").unwrap();
        assert_eq!(upstream.host, "127.0.0.1");
        assert_eq!(upstream.port, 5433);
        assert_eq!(upstream.user, "postgres");
        assert_eq!(upstream.password, None);
        assert_eq!(upstream.database_raw.as_deref(), Some("postgres"));

        let upstream =
            Upstream::parse("postgresql://app:p%40ss@db.local/app?sslmode=disable").unwrap();
        assert_eq!(upstream.host, "db.local");
        assert_eq!(upstream.port, 5432);
        assert_eq!(upstream.password.as_deref(), Some("p@ss"));
        assert_eq!(upstream.userinfo_raw.as_deref(), Some("app:p%40ss"));

        let upstream = Upstream::parse("postgres://u@[::1]:6000").unwrap();
        assert_eq!((upstream.host.as_str(), upstream.port), ("::1", 6000));
        assert_eq!(upstream.database_raw, None);

        for bad in [
            "mysql://x@h/db",
            "postgres://x@h:port/db",
            "postgres://x@h1,h2/db",
            "postgres://x@/db",
            "postgres://x:a%20b@h/db",
            "postgres://x:%zz@h/db",
        ] {
            assert!(
                matches!(Upstream::parse(bad), Err(PgBouncerError::InvalidUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn settings_that_could_break_the_config_are_refused() {
        assert!(valid_setting("default_pool_size", "5"));
        assert!(!valid_setting("pool mode", "session"));
        assert!(!valid_setting("pool_mode", ""));
        assert!(!valid_setting("pool_mode", "session\nlisten_port = 1"));
    }
}
