//! Floor 1: connections, the library's pools and the raw baselines' dedicated connections.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::config::Host;
use locks_postgres::tokio_postgres::{self, Client, NoTls, Statement};

use crate::BoxError;
use crate::plan::sources;

/// Where to connect, parsed once.
#[derive(Debug, Clone)]
pub(crate) struct Database {
    config: tokio_postgres::Config,
}

impl Database {
    /// The round trip of a prepared `SELECT 1` on a connection of `application_name`,
    /// p50 of 50.
    pub(crate) async fn round_trip(&self, application_name: &str) -> Result<u64, BoxError> {
        let client = self.connect(application_name).await?;
        let statement = client.prepare("SELECT 1").await?;
        let mut latencies = crate::stats::Latencies::new();
        for _ in 0..50 {
            let started = std::time::Instant::now();
            client.query_one(&statement, &[]).await?;
            latencies.record(started.elapsed());
        }
        Ok(latencies.p50())
    }

    pub(crate) fn new(url: &str) -> Result<Self, BoxError> {
        let config = tokio_postgres::Config::from_str(url)
            .map_err(|error| format!("invalid database URL: {error}"))?;
        Ok(Self { config })
    }

    /// The server's TCP address (its first host), for a proxy in front of it.
    pub(crate) fn tcp_address(&self) -> Result<(String, u16), BoxError> {
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        match self.config.get_hosts().first() {
            Some(Host::Tcp(host)) => Ok((host.clone(), port)),
            _ => Err("the latency scenario needs a server reached over TCP".into()),
        }
    }

    /// The same server, user, password and database, reached at 127.0.0.1:`port`.
    pub(crate) fn through(&self, port: u16) -> Self {
        self.at(Host::Tcp("127.0.0.1".into()), port)
    }

    /// How it connects: `TCP 127.0.0.1:5432` or `Unix socket /tmp/x/.s.PGSQL.5432`.
    pub(crate) fn transport(&self) -> String {
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        match self.config.get_hosts().first() {
            Some(Host::Unix(dir)) => format!("Unix socket {}/.s.PGSQL.{port}", dir.display()),
            Some(Host::Tcp(host)) => format!("TCP {host}:{port}"),
            None => format!("TCP localhost:{port}"),
        }
    }

    /// Whether it connects over a Unix socket.
    pub(crate) fn is_unix(&self) -> bool {
        matches!(self.config.get_hosts().first(), Some(Host::Unix(_)))
    }

    /// The same server reached over its Unix socket: the first of the server's
    /// `unix_socket_directories` that holds `.s.PGSQL.<port>` on this machine, checked
    /// with a connection to be the same server (the same postmaster start time, not
    /// another one on this machine's same port). `Err`: why there is none, for a note.
    pub(crate) async fn over_socket(&self) -> Result<Self, String> {
        const ASK: &str = "SELECT current_setting('unix_socket_directories'), \
                           current_setting('port'), pg_postmaster_start_time()::text";
        let ask = async |db: &Self| -> Result<[String; 3], BoxError> {
            let row = db
                .connect("lock-bench-admin")
                .await?
                .query_one(ASK, &[])
                .await?;
            Ok([row.get(0), row.get(1), row.get(2)])
        };
        let [directories, port, started] = ask(self)
            .await
            .map_err(|error| format!("the server's sockets are unknown: {}", sources(&*error)))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("the server's port `{port}` is not a number"))?;
        let file = format!(".s.PGSQL.{port}");
        let directory = socket_directory(&directories, &file).ok_or_else(|| {
            format!(
                "none of the server's unix_socket_directories (`{directories}`) holds \
                     {file} on this machine"
            )
        })?;
        let socket = self.at(Host::Unix(directory.into()), port);
        match ask(&socket).await {
            Ok([.., there]) if there == started => Ok(socket),
            Ok([.., there]) => Err(format!(
                "{} leads to another server (started {there}, the URL's {started})",
                socket.transport()
            )),
            Err(error) => Err(format!(
                "{} does not take connections: {}",
                socket.transport(),
                sources(&*error)
            )),
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

    /// A pool of at most `size` connections, tagged `application_name`, recycled the
    /// default (`Fast`) way, as the crate's README recommends. Opens nothing yet.
    pub(crate) fn pool(&self, size: usize, application_name: &str) -> Pool {
        let mut config = self.config.clone();
        config.application_name(application_name);
        locks_postgres::plain_pool_with_config(config, size)
            .expect("a pool with a runtime and no hooks always builds")
    }

    /// A dedicated connection (the raw baselines), its driver task spawned.
    pub(crate) async fn connect(&self, application_name: &str) -> Result<Client, BoxError> {
        let mut config = self.config.clone();
        config.application_name(application_name);
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(async move {
            // Ends when the client is dropped; an error here only means the server left.
            let _ = connection.await;
        });
        client.simple_query("SELECT 1").await?;
        Ok(client)
    }

    /// How many sessions of `application_name` the server has, waiting up to five
    /// seconds for the count to reach `expected` (disconnections are asynchronous).
    pub(crate) async fn sessions(
        &self,
        admin: &Client,
        application_name: &str,
        expected: i64,
    ) -> Result<i64, BoxError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let count: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&application_name],
                )
                .await?
                .get(0);
            if count == expected || tokio::time::Instant::now() >= deadline {
                return Ok(count);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The first of `directories` (the server's `unix_socket_directories`: comma-separated,
/// each perhaps quoted; `@name` an abstract socket, which has no file) that holds `file`
/// on this machine.
fn socket_directory<'a>(directories: &'a str, file: &str) -> Option<&'a str> {
    (directories.split(','))
        .map(|dir| dir.trim().trim_matches('"'))
        .filter(|dir| !dir.is_empty() && !dir.starts_with('@'))
        .find(|dir| Path::new(dir).join(file).exists())
}

/// A raw baseline: a dedicated connection with its lock, try and unlock statements
/// prepared.
#[derive(Debug)]
pub(crate) struct Raw {
    pub(crate) client: Client,
    pub(crate) lock: Statement,
    pub(crate) try_lock: Statement,
    pub(crate) unlock: Statement,
}

impl Raw {
    /// The exclusive forms, or the `shared` (reader) ones: `pg_advisory_lock_shared($1)`
    /// and its kin.
    pub(crate) async fn connect(
        db: &Database,
        application_name: &str,
        shared: bool,
    ) -> Result<Self, BoxError> {
        let client = db.connect(application_name).await?;
        let suffix = if shared { "_shared" } else { "" };
        let prepare = async |name| {
            client
                .prepare(&format!("SELECT pg_{name}{suffix}($1)"))
                .await
        };
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

    /// The unlock, an error when the server answers that the lock was not held.
    pub(crate) async fn unlock(&self, id: i64) -> Result<(), BoxError> {
        let released: bool = self.client.query_one(&self.unlock, &[&id]).await?.get(0);
        released.then_some(()).ok_or_else(|| NOT_HELD.into())
    }

    /// Lock + unlock of `id`.
    pub(crate) async fn cycle(&self, id: i64) -> Result<(), BoxError> {
        self.lock(id).await?;
        self.unlock(id).await
    }
}

pub(crate) const NOT_HELD: &str = "pg_advisory_unlock answered false";

/// Advisory locks granted to sessions of `application_name`.
pub(crate) async fn granted_advisory_locks(
    admin: &Client,
    application_name: &str,
) -> Result<i64, BoxError> {
    Ok(admin
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1",
            &[&application_name],
        )
        .await?
        .get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_the_first_directory_holding_its_file() {
        let here = std::env::temp_dir().join(format!("lock-bench-socket-{}", std::process::id()));
        std::fs::create_dir_all(&here).unwrap();
        std::fs::write(here.join(".s.PGSQL.5432"), "").unwrap();
        let found = |listed: &str, file| socket_directory(listed, file).map(str::to_owned);
        let text = here.to_str().unwrap();
        let listed = format!("/nowhere/at/all, @abstract, \"{text}\", /tmp");
        let answers = [
            found(&listed, ".s.PGSQL.5432"),
            found(&listed, ".s.PGSQL.5433"),
            found("", ".s.PGSQL.5432"),
        ];
        std::fs::remove_dir_all(&here).unwrap();
        assert_eq!(answers, [Some(text.to_owned()), None, None]);
    }
}
