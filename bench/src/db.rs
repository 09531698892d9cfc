//! Floor 1: connections, the library's pools and the raw baselines' dedicated connections.

use std::ops::Range;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::config::Host;
use locks_postgres::tokio_postgres::{self, Client, NoTls, Statement};

use crate::plan::sources;
use crate::stats::Latencies;
use crate::{BoxError, Result};

/// Where to connect, parsed once.
#[derive(Debug, Clone)]
pub(crate) struct Database {
    config: tokio_postgres::Config,
}

impl Database {
    pub(crate) fn new(url: &str) -> Result<Self> {
        let config = tokio_postgres::Config::from_str(url)
            .map_err(|error| format!("invalid database URL: {error}"))?;
        Ok(Self { config })
    }

    /// The round trip of a prepared `SELECT 1`, p50 of 50.
    pub(crate) async fn round_trip(&self, application_name: &str) -> Result<u64> {
        let client = self.connect(application_name).await?;
        let statement = client.prepare("SELECT 1").await?;
        let query = async |_| client.query_one(&statement, &[]).await;
        Ok(Latencies::timed(0..50, query).await?.p50())
    }

    fn host(&self) -> (Option<&Host>, u16) {
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        (self.config.get_hosts().first(), port)
    }

    /// The server's TCP address, for a proxy in front of it.
    pub(crate) fn tcp_address(&self) -> Result<(String, u16)> {
        match self.host() {
            (Some(Host::Tcp(host)), port) => Ok((host.clone(), port)),
            _ => Err("the latency scenario needs a server reached over TCP".into()),
        }
    }

    /// The same server reached at 127.0.0.1:`port` (through a proxy).
    pub(crate) fn through(&self, port: u16) -> Self {
        self.at(Host::Tcp("127.0.0.1".into()), port)
    }

    pub(crate) fn transport(&self) -> String {
        match self.host() {
            (Some(Host::Unix(dir)), port) => {
                format!("Unix socket {}/.s.PGSQL.{port}", dir.display())
            }
            (Some(Host::Tcp(host)), port) => format!("TCP {host}:{port}"),
            (None, port) => format!("TCP localhost:{port}"),
        }
    }

    pub(crate) fn is_unix(&self) -> bool {
        matches!(self.host().0, Some(Host::Unix(_)))
    }

    /// The same server over its Unix socket: the first of its `unix_socket_directories`
    /// holding `.s.PGSQL.<port>` here, checked to be the same server (the same postmaster
    /// start time). `Err`: why there is none, for a note.
    pub(crate) async fn over_socket(&self) -> Result<Self, String> {
        const ASK: &str = "SELECT current_setting('unix_socket_directories'), \
                           current_setting('port'), pg_postmaster_start_time()::text";
        let ask = async |db: &Self| -> Result<[String; 3]> {
            let client = db.connect("lock-bench-admin").await?;
            let row = client.query_one(ASK, &[]).await?;
            Ok([row.get(0), row.get(1), row.get(2)])
        };
        let said = |error: BoxError| sources(&*error);
        let asked = ask(self).await.map_err(said);
        let [dirs, port, started] =
            asked.map_err(|e| format!("the server's sockets are unknown: {e}"))?;
        let port: u16 =
            (port.parse()).map_err(|_| format!("the server's port `{port}` is not a number"))?;
        let file = format!(".s.PGSQL.{port}");
        let Some(dir) = socket_directory(&dirs, &file) else {
            let none = "none of the server's unix_socket_directories";
            return Err(format!("{none} (`{dirs}`) holds {file} on this machine"));
        };
        let socket = self.at(Host::Unix(dir.into()), port);
        let transport = socket.transport();
        match ask(&socket).await.map_err(said) {
            Ok([.., there]) if there == started => Ok(socket),
            Ok([.., there]) => Err(format!(
                "{transport} leads to another server (started {there}, the URL's {started})"
            )),
            Err(error) => Err(format!("{transport} does not take connections: {error}")),
        }
    }

    /// The same user, password and database at `host`:`port`.
    fn at(&self, host: Host, port: u16) -> Self {
        let mut config = tokio_postgres::Config::new();
        match host {
            Host::Tcp(name) => config.host(&name),
            Host::Unix(dir) => config.host_path(dir),
        };
        config.port(port);
        if let Some(user) = self.config.get_user() {
            config.user(user);
        }
        if let Some(password) = self.config.get_password() {
            config.password(password);
        }
        if let Some(dbname) = self.config.get_dbname() {
            config.dbname(dbname);
        }
        Self { config }
    }

    /// A pool of at most `size` connections, recycled the default (`Fast`) way, as the
    /// crate's README recommends. Opens nothing yet.
    pub(crate) fn pool(&self, size: usize, application_name: &str) -> Pool {
        let mut config = self.config.clone();
        config.application_name(application_name);
        locks_postgres::plain_pool_with_config(config, size)
            .expect("a pool with a runtime and no hooks always builds")
    }

    /// A dedicated connection (the raw baselines).
    pub(crate) async fn connect(&self, application_name: &str) -> Result<Client> {
        let mut config = self.config.clone();
        config.application_name(application_name);
        let (client, connection) = config.connect(NoTls).await?;
        // Ends when the client is dropped; an error here only means the server left.
        tokio::spawn(async move { drop(connection.await) });
        client.simple_query("SELECT 1").await?;
        Ok(client)
    }

    /// The server's sessions of `app`lication name, awaited up to 5 s to be `expected`.
    pub(crate) async fn sessions(&self, admin: &Client, app: &str, expected: i64) -> Result<i64> {
        const COUNT: &str = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let count: i64 = admin.query_one(COUNT, &[&app]).await?.get(0);
            if count == expected || Instant::now() >= deadline {
                return Ok(count);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Connections opened at once (more, on a loaded machine, time out in the pool).
pub(crate) const OPENING: usize = 16;

/// A pool of `size` connections, all opened, each having run one query (so that its
/// buffers are grown before anything is measured).
pub(crate) async fn open_pool(db: &Database, size: usize, app: &str) -> Result<Pool> {
    let pool = db.pool(size, app);
    let opener = pool.clone();
    // Every object is kept until all are open, so that the pool opens `size` connections.
    let objects = each(0..size, OPENING, move |_| {
        let pool = opener.clone();
        async move {
            let object = pool.get().await?;
            object.simple_query("SELECT 1").await?;
            Ok(object)
        }
    });
    drop(objects.await?);
    Ok(pool)
}

/// `f(n)` for each `n` of `range`, on `at_once` tasks taking the next `n` in turn: the
/// answers, in the order they came.
pub(crate) async fn each<T, F, Fut>(range: Range<usize>, at_once: usize, f: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T>> + Send,
{
    let next = Arc::new(AtomicUsize::new(range.start));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..at_once.min(range.len()) {
        let (f, next, end) = (f.clone(), Arc::clone(&next), range.end);
        workers.spawn(async move {
            let mut answers = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= end {
                    return Ok::<_, BoxError>(answers);
                }
                answers.push(f(n).await?);
            }
        });
    }
    let mut answers = Vec::with_capacity(range.len());
    while let Some(joined) = workers.join_next().await {
        answers.extend(joined??);
    }
    Ok(answers)
}

/// The first of `directories` (comma-separated, perhaps quoted; `@name` an abstract
/// socket, which has no file) that holds `file` here.
fn socket_directory<'a>(directories: &'a str, file: &str) -> Option<&'a str> {
    (directories.split(','))
        .map(|dir| dir.trim().trim_matches('"'))
        .filter(|dir| !dir.is_empty() && !dir.starts_with('@'))
        .find(|dir| Path::new(dir).join(file).exists())
}

/// A raw baseline: a connection with its lock, try and unlock statements prepared.
#[derive(Debug)]
pub(crate) struct Raw {
    pub(crate) client: Client,
    pub(crate) lock: Statement,
    pub(crate) try_lock: Statement,
    pub(crate) unlock: Statement,
}

impl Raw {
    /// The exclusive forms, or the `shared` ones (`pg_advisory_lock_shared($1)`, …).
    pub(crate) async fn connect(db: &Database, app: &str, shared: bool) -> Result<Self> {
        let suffix = if shared { "_shared" } else { "" };
        let sql = |name: &str| format!("SELECT pg_{name}{suffix}($1)");
        Self::prepare(db.connect(app).await?, sql).await
    }

    /// On `client`, each statement as `sql` writes the function `name`d (`advisory_lock`,
    /// `try_advisory_lock`, `advisory_unlock`).
    pub(crate) async fn prepare(client: Client, sql: impl Fn(&str) -> String) -> Result<Self> {
        let prepare = async |name| client.prepare(&sql(name)).await;
        Ok(Self {
            lock: prepare("advisory_lock").await?,
            try_lock: prepare("try_advisory_lock").await?,
            unlock: prepare("advisory_unlock").await?,
            client,
        })
    }

    pub(crate) async fn lock(&self, id: i64) -> Result<(), tokio_postgres::Error> {
        self.client.execute(&self.lock, &[&id]).await.map(drop)
    }

    pub(crate) async fn try_lock(&self, id: i64) -> Result<bool> {
        Ok(self.client.query_one(&self.try_lock, &[&id]).await?.get(0))
    }

    pub(crate) async fn unlock(&self, id: i64) -> Result<()> {
        let released: bool = self.client.query_one(&self.unlock, &[&id]).await?.get(0);
        released.then_some(()).ok_or_else(|| NOT_HELD.into())
    }

    pub(crate) async fn cycle(&self, id: i64) -> Result<()> {
        self.lock(id).await?;
        self.unlock(id).await
    }
}

pub(crate) const NOT_HELD: &str = "pg_advisory_unlock answered false";

/// The server's setting `name` (`SHOW name`).
pub(crate) async fn show(client: &Client, name: &str) -> Result<String> {
    Ok(client.query_one(&format!("SHOW {name}"), &[]).await?.get(0))
}

/// Advisory locks granted to sessions of `application_name`.
pub(crate) async fn granted_advisory_locks(admin: &Client, app: &str) -> Result<i64> {
    const COUNT: &str = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = \
                         l.pid WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1";
    Ok(admin.query_one(COUNT, &[&app]).await?.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_the_first_directory_holding_its_file() {
        let here = std::env::temp_dir().join(format!("lock-bench-socket-{}", std::process::id()));
        std::fs::create_dir_all(&here).unwrap();
        std::fs::write(here.join(".s.PGSQL.5432"), "").unwrap();
        let text = here.to_str().unwrap();
        let listed = format!("/nowhere/at/all, @abstract, \"{text}\", /tmp");
        let found = |listed: &str, file| socket_directory(listed, file).map(str::to_owned);
        let answers = [
            found(&listed, ".s.PGSQL.5432"),
            found(&listed, ".s.PGSQL.5433"),
            found("", ".s.PGSQL.5432"),
        ];
        std::fs::remove_dir_all(&here).unwrap();
        assert_eq!(answers, [Some(text.to_owned()), None, None]);
    }
}
