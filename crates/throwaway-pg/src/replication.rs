//! A throwaway primary with one streaming standby, for failover tests.

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use crate::cluster::StandbySource;
use crate::{Error, ThrowawayPostgres};

/// How long [`PrimaryWithStandby`] waits for the standby to stream, or to finish promotion.
const WAIT: Duration = Duration::from_secs(60);
/// How often it looks while waiting.
const POLL: Duration = Duration::from_millis(50);
/// The physical replication slot the standby streams through.
const SLOT: &str = "throwaway_standby";

/// Configures a [`PrimaryWithStandby`]; see [`PrimaryWithStandby::builder`].
#[derive(Debug, Clone, Default)]
pub struct ReplicationBuilder {
    synchronous: bool,
    settings: Vec<(String, String)>,
    bin_dir: Option<PathBuf>,
}

impl ReplicationBuilder {
    /// Synchronous replication: the primary gets `synchronous_standby_names = '*'` and
    /// `synchronous_commit = on`, so a commit returns only once the standby has flushed
    /// it, and a promoted standby has every transaction the primary reported committed.
    /// Off by default (asynchronous streaming, which may lose the last commits on failover).
    #[must_use]
    pub fn synchronous(mut self, on: bool) -> Self {
        self.synchronous = on;
        self
    }

    /// A `postgresql.conf` line for both servers; see [`crate::Builder::setting`].
    #[must_use]
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Uses the server binaries in `dir` (which must also hold `pg_basebackup` and `psql`)
    /// instead of searching for them.
    #[must_use]
    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Starts the primary (`initdb`, like [`ThrowawayPostgres::start`]), copies it with
    /// `pg_basebackup -R` into a second folder (where the binaries have no `pg_basebackup`:
    /// stops the primary cleanly, copies its data folder, starts it again), starts that copy
    /// as a hot standby on another free port, streaming through a replication slot, and waits until the primary reports it streaming (and, when synchronous,
    /// `sync_state = 'sync'`). Both have watchdogs. On error nothing is left behind.
    pub fn start(self) -> Result<PrimaryWithStandby, Error> {
        let base = |builder: crate::Builder| {
            let builder = match &self.bin_dir {
                Some(dir) => builder.bin_dir(dir.clone()),
                None => builder,
            };
            self.settings
                .iter()
                .fold(builder, |builder, (name, value)| {
                    builder.setting(name.clone(), value.clone())
                })
        };
        let mut primary = base(ThrowawayPostgres::builder())
            .setting("wal_level", "replica")
            .setting("max_wal_senders", "10")
            .setting("max_replication_slots", "10")
            .setting("hot_standby", "on");
        if self.synchronous {
            primary = primary
                .setting("synchronous_standby_names", "'*'")
                .setting("synchronous_commit", "on");
        }
        let primary = primary.start()?;
        // The copy takes the primary's postgresql.conf; a promoted standby must not wait
        // for a standby of its own, so it gets no synchronous_standby_names.
        let standby = base(ThrowawayPostgres::builder())
            .setting("synchronous_standby_names", "''")
            .setting("hot_standby", "on");
        let standby = if primary.bin_dir().join("pg_basebackup").is_file() {
            standby
                .standby_of(StandbySource::BaseBackup {
                    port: primary.port(),
                    slot: SLOT.to_owned(),
                })
                .start()?
        } else {
            // Binary sets without client tools (the npm packages of each major version):
            // copy the primary while it is stopped cleanly, which is as good a base.
            primary.psql(&format!(
                "SELECT pg_create_physical_replication_slot('{SLOT}')"
            ))?;
            primary.stop()?;
            let standby = standby
                .setting(
                    "primary_conninfo",
                    format!(
                        "'host=127.0.0.1 port={} user=postgres application_name=standby'",
                        primary.port()
                    ),
                )
                .setting("primary_slot_name", format!("'{SLOT}'"))
                .standby_of(StandbySource::StoppedCopy {
                    data_dir: primary.data_dir(),
                })
                .start();
            primary.start_again()?;
            standby?
        };
        let pair = PrimaryWithStandby {
            synchronous: self.synchronous,
            standby,
            primary,
        };
        pair.wait_for_streaming()?;
        Ok(pair)
    }
}

/// A throwaway primary and a hot standby streaming from it, both on 127.0.0.1 on free ports,
/// each in its own temporary folder, run as the `postgres` user when this process is root
/// (like [`ThrowawayPostgres`]). Dropping it stops both and removes both folders.
///
/// Failover by hand, as an operator or a failover manager would do it:
/// [`stop_primary_immediately`](Self::stop_primary_immediately) then
/// [`promote_standby`](Self::promote_standby). Clients on
/// [`multi_host_url`](Self::multi_host_url) then reach the promoted standby.
#[derive(Debug)]
pub struct PrimaryWithStandby {
    synchronous: bool,
    // Dropped first: the standby stops before the primary it streams from.
    standby: ThrowawayPostgres,
    primary: ThrowawayPostgres,
}

impl PrimaryWithStandby {
    /// Starts an asynchronous pair; see [`ReplicationBuilder::start`].
    pub fn start() -> Result<Self, Error> {
        Self::builder().start()
    }

    /// A builder for synchronous replication, settings and the binaries' folder.
    pub fn builder() -> ReplicationBuilder {
        ReplicationBuilder::default()
    }

    /// The primary (the server that was started with `initdb`).
    pub fn primary(&self) -> &ThrowawayPostgres {
        &self.primary
    }

    /// The standby (the `pg_basebackup` copy); read-only until promoted.
    pub fn standby(&self) -> &ThrowawayPostgres {
        &self.standby
    }

    /// Whether the pair was started with synchronous replication.
    pub fn is_synchronous(&self) -> bool {
        self.synchronous
    }

    /// `postgres://postgres@127.0.0.1:PRIMARY,127.0.0.1:STANDBY/postgres?target_session_attrs=read-write`:
    /// clients try the hosts in order and keep the first that accepts writes, so they reach
    /// the primary, and after a failover the promoted standby. `tokio_postgres::Config`
    /// parses it (multiple hosts and `target_session_attrs` since tokio-postgres 0.7).
    pub fn multi_host_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.primary.port(),
            self.standby.port()
        )
    }

    /// The same as [`multi_host_url`](Self::multi_host_url) as a key-value connection
    /// string: `host=127.0.0.1,127.0.0.1 port=PRIMARY,STANDBY user=postgres dbname=postgres
    /// target_session_attrs=read-write`.
    pub fn multi_host_conninfo(&self) -> String {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
             target_session_attrs=read-write",
            self.primary.port(),
            self.standby.port()
        )
    }

    /// Stops the primary with `pg_ctl stop -m immediate`: every backend is killed at once, as
    /// in a crash; the standby keeps running, read-only, until promoted.
    pub fn stop_primary_immediately(&self) -> Result<(), Error> {
        self.primary.stop_immediately()
    }

    /// Promotes the standby (`SELECT pg_promote(true, 60)`: waits up to 60 s) and waits until
    /// it accepts writes (`pg_is_in_recovery()` is false).
    pub fn promote_standby(&self) -> Result<(), Error> {
        let promoted = self.standby.psql("SELECT pg_promote(true, 60)")?;
        if promoted != "t" {
            return Err(self.timeout("promote the standby", promoted));
        }
        self.wait_until(
            &self.standby,
            "SELECT NOT pg_is_in_recovery()",
            "the promotion",
        )
    }

    /// Waits until the primary reports the standby streaming in `pg_stat_replication` (with
    /// `sync_state = 'sync'` when synchronous).
    pub fn wait_for_streaming(&self) -> Result<(), Error> {
        let sql = if self.synchronous {
            "SELECT count(*) > 0 FROM pg_stat_replication \
             WHERE state = 'streaming' AND sync_state = 'sync'"
        } else {
            "SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming'"
        };
        self.wait_until(&self.primary, sql, "the standby to stream")
    }

    /// Waits until the standby has replayed everything the primary has written so far
    /// (`pg_current_wal_insert_lsn()`, which includes asynchronous commits not yet flushed).
    pub fn wait_for_replay(&self) -> Result<(), Error> {
        let lsn = self.primary.psql("SELECT pg_current_wal_insert_lsn()")?;
        let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        self.wait_until(
            &self.standby,
            &sql,
            "the standby to replay the primary's WAL",
        )
    }

    /// Cuts the standby off as a lagging standby would be: waits until it has replayed
    /// what the primary wrote so far, then clears its `primary_conninfo` (reloadable since
    /// PostgreSQL 13) and waits until the primary lists no standby in
    /// `pg_stat_replication`. What the primary writes from then on is not shipped (with
    /// asynchronous replication; a synchronous primary would wait for its standby).
    pub fn cut_standby_off(&self) -> Result<(), Error> {
        self.wait_for_replay()?;
        self.standby
            .psql("ALTER SYSTEM SET primary_conninfo = ''")?;
        self.standby.psql("SELECT pg_reload_conf()")?;
        self.wait_until(
            &self.primary,
            "SELECT count(*) = 0 FROM pg_stat_replication",
            "the standby to stop streaming",
        )
    }

    /// Polls `sql` (a query answering `t` or `f`) on `server` until it answers `t`.
    fn wait_until(&self, server: &ThrowawayPostgres, sql: &str, what: &str) -> Result<(), Error> {
        let deadline = Instant::now() + WAIT;
        loop {
            let answer = server.psql(sql);
            match answer {
                Ok(answer) if answer == "t" => return Ok(()),
                Ok(answer) if Instant::now() >= deadline => {
                    return Err(self.timeout(&format!("wait for {what}"), answer));
                }
                Err(error) if Instant::now() >= deadline => return Err(error),
                _ => thread::sleep(POLL),
            }
        }
    }

    fn timeout(&self, action: &str, answer: String) -> Error {
        Error::io(
            format!(
                "{action} (`psql` answered `{answer}` for {} s; logs: {} and {})",
                WAIT.as_secs(),
                self.primary.log_file().display(),
                self.standby.log_file().display()
            ),
            std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
        )
    }
}
