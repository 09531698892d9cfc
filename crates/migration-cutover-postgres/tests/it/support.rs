//! Shared set-up: a fleet of two databases on the test server, and instances over it.

use std::str::FromStr;
use std::time::Duration;

use locks_postgres::PostgresLockManager;
use migration_cutover::{MigrationConfig, MigrationCoordinator, MigrationPorts, Stores};
use migration_cutover_postgres::deadpool_postgres::Pool;
use migration_cutover_postgres::tokio_postgres::{self, NoTls};
use migration_cutover_postgres::{
    PostgresEventStore, PostgresMigrationRepository, PostgresRoutingRepository, PostgresWritePause,
    PostgresWriteRouter, TableName, install_fleet, install_store,
};
pub(crate) use throwaway_pg::testing::{database_url, unique};

/// The store ids of every test fleet.
pub(crate) const SOURCE: &str = "shared";
pub(crate) const TARGET: &str = "dedicated";

fn config_for(database: Option<&str>) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::from_str(&database_url()).expect("test URL");
    if let Some(database) = database {
        config.dbname(database);
    }
    config
}

/// A plain connection to `database` (the URL's own database when `None`).
pub(crate) async fn connect(database: Option<&str>) -> tokio_postgres::Client {
    let (client, connection) = config_for(database)
        .connect(NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
}

/// A pool of `size` connections to `database`.
pub(crate) fn pool(database: &str, size: usize) -> Pool {
    locks_postgres::plain_pool_with_config(config_for(Some(database)), size).expect("pool")
}

pub(crate) fn table(name: &str) -> TableName {
    TableName::new(name).expect("a valid table name")
}

/// Two databases: `a` holds the source store `shared.events` and the fleet's tables
/// `fleet.routes` and `fleet.migrations`; `b` holds the target store `dedicated.events`.
#[derive(Debug, Clone)]
pub(crate) struct Fleet {
    pub(crate) a: String,
    pub(crate) b: String,
}

pub(crate) type Coordinator = MigrationCoordinator<
    PostgresLockManager,
    PostgresEventStore,
    PostgresRoutingRepository,
    PostgresWritePause,
    PostgresMigrationRepository,
>;

/// One instance of the fleet: its own pools, coordinator and router.
#[derive(Debug)]
pub(crate) struct Instance {
    pub(crate) coordinator: Coordinator,
    pub(crate) router: PostgresWriteRouter,
    pub(crate) pause: PostgresWritePause,
    pub(crate) source: PostgresEventStore,
    pub(crate) target: PostgresEventStore,
    pub(crate) routing: PostgresRoutingRepository,
    pub(crate) migrations: PostgresMigrationRepository,
}

/// What an instance is made of, before it is put together.
pub(crate) struct Parts {
    pub(crate) stores: Stores<PostgresEventStore>,
    pub(crate) source: PostgresEventStore,
    pub(crate) target: PostgresEventStore,
    pub(crate) routing: PostgresRoutingRepository,
    pub(crate) pause: PostgresWritePause,
    pub(crate) migrations: PostgresMigrationRepository,
    pub(crate) locks: PostgresLockManager,
}

/// The settings of every test instance: the default 500 ms pause budget, a cutover lock
/// waited for long enough that a racing instance gets it after the winner.
pub(crate) fn test_config() -> MigrationConfig {
    MigrationConfig::new()
        .with_lock_timeout(Duration::from_secs(5))
        .with_write_timeout(Duration::from_secs(5))
}

impl Fleet {
    /// Creates the two databases and installs the tables.
    pub(crate) async fn create(name: &str) -> Self {
        let fleet = Self {
            a: unique(&format!("{name}_a")),
            b: unique(&format!("{name}_b")),
        };
        let admin = connect(None).await;
        for database in [&fleet.a, &fleet.b] {
            admin
                .batch_execute(&format!("CREATE DATABASE \"{database}\""))
                .await
                .expect("create a test database");
        }
        let (a, b) = (pool(&fleet.a, 2), pool(&fleet.b, 2));
        install_store(&a, &table("shared.events"))
            .await
            .expect("source table");
        install_store(&b, &table("dedicated.events"))
            .await
            .expect("target table");
        install_fleet(&a, &table("fleet.routes"), &table("fleet.migrations"))
            .await
            .expect("fleet tables");
        fleet
    }

    /// The fleet named by a parent process (see [`vars`](Self::vars)).
    pub(crate) fn from_env() -> Self {
        let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"));
        Self {
            a: var("MCP_FLEET_A"),
            b: var("MCP_FLEET_B"),
        }
    }

    /// The environment that names this fleet to a child process.
    pub(crate) fn vars(&self) -> [(&'static str, String); 2] {
        [
            ("MCP_FLEET_A", self.a.clone()),
            ("MCP_FLEET_B", self.b.clone()),
        ]
    }

    /// The ports of an instance, with a pause that waits `acquire` for writes under
    /// way, and its lock manager: each on its own pools.
    pub(crate) fn parts(&self, acquire: Duration) -> Parts {
        let (a, b) = (pool(&self.a, 8), pool(&self.b, 8));
        let source = PostgresEventStore::new(a.clone(), table("shared.events"));
        let target = PostgresEventStore::new(b, table("dedicated.events"));
        let stores = Stores::new()
            .with_store(SOURCE, source.clone())
            .with_store(TARGET, target.clone());
        let routing = PostgresRoutingRepository::new(a.clone(), table("fleet.routes"));
        let pause = PostgresWritePause::new(&stores, &routing).with_acquire_timeout(acquire);
        let migrations = PostgresMigrationRepository::new(a, table("fleet.migrations"));
        let locks = PostgresLockManager::builder(pool(&self.a, 2))
            .holder_id(format!("instance-{}", std::process::id()))
            .build();
        Parts {
            stores,
            source,
            target,
            routing,
            pause,
            migrations,
            locks,
        }
    }

    /// An instance with `config` and a pause that waits `acquire` for writes under way.
    pub(crate) fn instance(&self, config: MigrationConfig, acquire: Duration) -> Instance {
        let parts = self.parts(acquire);
        let ports = MigrationPorts::new(
            parts.stores,
            parts.routing.clone(),
            parts.pause.clone(),
            parts.migrations.clone(),
        );
        let coordinator = MigrationCoordinator::new(ports, parts.locks).with_config(config);
        let router = PostgresWriteRouter::new(coordinator.ports(), &config);
        Instance {
            coordinator,
            router,
            pause: parts.pause,
            source: parts.source,
            target: parts.target,
            routing: parts.routing,
            migrations: parts.migrations,
        }
    }

    /// Makes the target database refuse connections and ends the sessions it has.
    pub(crate) async fn take_target_down(&self) {
        connect(None)
            .await
            .batch_execute(&format!(
                "ALTER DATABASE \"{b}\" ALLOW_CONNECTIONS false;
                 SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{b}';",
                b = self.b
            ))
            .await
            .expect("take the target down");
    }

    /// Drops both databases (best effort: the sessions of killed children go with FORCE).
    pub(crate) async fn drop_databases(self) {
        let admin = connect(None).await;
        for database in [&self.a, &self.b] {
            let _ = admin
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
                ))
                .await;
        }
    }
}

/// Polls `done` every 5 ms for up to 10 s.
pub(crate) async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..2_000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("waited 10 s for {what}");
}
