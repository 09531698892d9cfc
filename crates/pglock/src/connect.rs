//! Where the server is and how to reach it: `--url`, else `DATABASE_URL`, else the libpq
//! environment, as psql reads them; the pool the lock manager uses.

mod conninfo;
mod open;
mod passfile;
mod tls;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use locks_postgres::tokio_postgres::Config;
use locks_postgres::tokio_postgres::config::{Host, SslMode};

pub(crate) use self::open::{check, one_client, pool, pool_failure};

use self::conninfo::{EXPECTED_FORMS, scheme_problem, split_ssl_params};
use self::passfile::pgpass_password;
use crate::exit::{CONFIG, Failure, causes};

/// How long connecting may take when neither `--connect-timeout`, `connect_timeout` in
/// the URL nor `PGCONNECT_TIMEOUT` says.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslChoice {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, certificate not checked (libpq's default; `allow`
    /// is taken as this too).
    Prefer,
    /// TLS or nothing, certificate not checked (unless a root certificate is named, as in
    /// libpq: then as `VerifyCa`).
    Require,
    /// TLS, certificate chain checked against the root certificates.
    VerifyCa,
    /// TLS, chain and host name checked.
    VerifyFull,
}

impl SslChoice {
    fn parse(text: &str) -> Result<Self, Failure> {
        Ok(match text {
            "disable" => Self::Disable,
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(Failure::new(
                    CONFIG,
                    format!(
                        "invalid sslmode `{other}` (disable, allow, prefer, require, verify-ca, \
                         verify-full)"
                    ),
                ));
            }
        })
    }
}

/// A resolved connection target.
#[derive(Debug)]
pub(crate) struct Target {
    /// The driver's settings (hosts, user, password, database, application name).
    pub(crate) config: Config,
    /// The TLS mode.
    pub(crate) ssl: SslChoice,
    /// `sslrootcert`: a PEM file, or `system`.
    pub(crate) root_cert: Option<String>,
    /// `user@host:port/database`, for messages; never the password.
    pub(crate) shown: String,
    /// The whole time connecting may take.
    pub(crate) connect_timeout: Duration,
}

/// The environment as a lookup, so tests can pass their own.
pub(crate) trait Env {
    /// The value of `name`, if set and not empty.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug)]
pub(crate) struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|value| !value.is_empty())
    }
}

/// Resolves the target from `--url` (or `DATABASE_URL`) and the libpq environment.
pub(crate) fn resolve(
    url: Option<&str>,
    connect_timeout: Option<Duration>,
    env: &dyn Env,
) -> Result<Target, Failure> {
    let conninfo = url.map(str::to_owned).or_else(|| env.var("DATABASE_URL"));
    let conninfo = conninfo.unwrap_or_default();
    let invalid = |problem: String| {
        Failure::new(
            CONFIG,
            format!("invalid connection string: {problem}; {EXPECTED_FORMS}"),
        )
    };
    if let Some(problem) = scheme_problem(&conninfo) {
        return Err(invalid(problem));
    }
    let (rest, params) = split_ssl_params(&conninfo)?;
    let mut config = Config::from_str(&rest).map_err(|error| invalid(causes(&error)))?;

    if config.get_ports().is_empty()
        && let Some(port) = env.var("PGPORT")
    {
        let port: u16 = port
            .parse()
            .map_err(|_| Failure::new(CONFIG, format!("invalid PGPORT `{port}`")))?;
        config.port(port);
    }
    let port = config.get_ports().first().copied().unwrap_or(5432);
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        match env.var("PGHOST") {
            Some(hosts) => {
                for host in hosts.split(',') {
                    if host.starts_with('/') {
                        config.host_path(host);
                    } else {
                        config.host(host);
                    }
                }
            }
            None => match default_socket_dir(port) {
                Some(dir) => {
                    config.host_path(dir);
                }
                None => {
                    config.host("localhost");
                }
            },
        }
    }
    if config.get_user().is_none() {
        let user = env
            .var("PGUSER")
            .or_else(os_user)
            .unwrap_or_else(|| "postgres".to_owned());
        config.user(user);
    }
    if config.get_dbname().is_none()
        && let Some(dbname) = env.var("PGDATABASE")
    {
        config.dbname(dbname);
    }
    if config.get_password().is_none() {
        if let Some(password) = env.var("PGPASSWORD") {
            config.password(password);
        } else if let Some(password) = pgpass_password(&config, env) {
            config.password(password);
        }
    }
    if config.get_application_name().is_none()
        && let Some(name) = env.var("PGAPPNAME")
    {
        config.application_name(name);
    }
    let connect_timeout = match connect_timeout {
        Some(timeout) => timeout,
        None => match (config.get_connect_timeout(), env.var("PGCONNECT_TIMEOUT")) {
            (Some(timeout), _) => *timeout,
            (None, Some(seconds)) => seconds
                .trim()
                .parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|_| {
                    Failure::new(CONFIG, format!("invalid PGCONNECT_TIMEOUT `{seconds}`"))
                })?,
            (None, None) => DEFAULT_CONNECT_TIMEOUT,
        },
    };
    // libpq treats 0 as "wait forever"; a lock tool must not hang on a dead address.
    let connect_timeout = if connect_timeout.is_zero() {
        DEFAULT_CONNECT_TIMEOUT
    } else {
        connect_timeout
    };
    config.connect_timeout(connect_timeout);

    let ssl = match params.sslmode.or_else(|| env.var("PGSSLMODE")) {
        Some(mode) => SslChoice::parse(&mode)?,
        None => SslChoice::Prefer,
    };
    let root_cert = params.sslrootcert.or_else(|| env.var("PGSSLROOTCERT"));
    let ssl = match ssl {
        SslChoice::Require if root_cert.as_deref().is_some_and(|cert| cert != "system") => {
            SslChoice::VerifyCa
        }
        other => other,
    };
    config.ssl_mode(match ssl {
        SslChoice::Disable => SslMode::Disable,
        SslChoice::Prefer => SslMode::Prefer,
        SslChoice::Require | SslChoice::VerifyCa | SslChoice::VerifyFull => SslMode::Require,
    });

    let shown = shown(&config);
    Ok(Target {
        config,
        ssl,
        root_cert,
        shown,
        connect_timeout,
    })
}

/// libpq's default socket directory, where a server on `port` listens.
fn default_socket_dir(port: u16) -> Option<&'static str> {
    ["/var/run/postgresql", "/tmp"]
        .into_iter()
        .find(|dir| Path::new(dir).join(format!(".s.PGSQL.{port}")).exists())
}

/// The name of the user running this process, libpq's default role.
fn os_user() -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|user| user.name)
}

/// `user@host:port/database` for messages.
fn shown(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => config
            .get_hostaddrs()
            .first()
            .map(ToString::to_string)
            .unwrap_or_default(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or_default();
    let dbname = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{dbname}")
}

/// A pooled client to create `table` with when it is missing, `None` when it exists
/// (creating needs the `CREATE` privilege, using the table does not).
pub(crate) async fn missing_table(
    pool: &locks_postgres::deadpool_postgres::Pool,
    target: &Target,
    table: &str,
) -> Result<Option<locks_postgres::deadpool_postgres::Object>, Failure> {
    let client = pool
        .get()
        .await
        .map_err(|error| pool_failure(&error, target))?;
    let exists = table_exists(&client, table).await?;
    Ok((!exists).then_some(client))
}

/// Whether `table` exists, read on `client` (a command that already holds its pool's one
/// connection asks on it).
pub(crate) async fn table_exists(
    client: &locks_postgres::tokio_postgres::Client,
    table: &str,
) -> Result<bool, Failure> {
    Ok(client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .map_err(|error| Failure::new(crate::exit::SOFTWARE, crate::exit::chain(&error)))?
        .get(0))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Vars(HashMap<&'static str, &'static str>);

    impl Env for Vars {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).map(|value| (*value).to_owned())
        }
    }

    fn vars(pairs: &[(&'static str, &'static str)]) -> Vars {
        Vars(pairs.iter().copied().collect())
    }

    #[test]
    fn the_url_wins_over_database_url_and_the_environment_fills_gaps() {
        let env = vars(&[
            ("DATABASE_URL", "postgres://other@elsewhere/otherdb"),
            ("PGPASSWORD", "s3cret"),
            ("PGAPPNAME", "deploy"),
        ]);
        let target = resolve(Some("postgres://app@db.example:6543/app"), None, &env).unwrap();
        assert_eq!(target.shown, "app@db.example:6543/app");
        assert_eq!(target.config.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(target.config.get_application_name(), Some("deploy"));
        assert_eq!(target.ssl, SslChoice::Prefer);
        assert_eq!(target.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert!(!target.shown.contains("s3cret"));

        let target = resolve(None, None, &env).unwrap();
        assert_eq!(target.shown, "other@elsewhere:5432/otherdb");
    }

    #[test]
    fn the_libpq_environment_alone_is_enough() {
        let env = vars(&[
            ("PGHOST", "pg1.internal"),
            ("PGPORT", "5433"),
            ("PGUSER", "ops"),
            ("PGDATABASE", "jobs"),
            ("PGSSLMODE", "verify-full"),
            ("PGCONNECT_TIMEOUT", "3"),
        ]);
        let target = resolve(None, None, &env).unwrap();
        assert_eq!(target.shown, "ops@pg1.internal:5433/jobs");
        assert_eq!(target.ssl, SslChoice::VerifyFull);
        assert_eq!(target.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(target.connect_timeout, Duration::from_secs(3));
        let flag = resolve(None, Some(Duration::from_millis(500)), &env).unwrap();
        assert_eq!(flag.connect_timeout, Duration::from_millis(500));
    }

    #[test]
    fn ssl_parameters_the_driver_does_not_know_are_taken_out() {
        let env = vars(&[]);
        let target = resolve(
            Some("postgresql://a@h/d?sslmode=verify-ca&sslrootcert=%2Fetc%2Fca.pem&application_name=x"),
            None,
            &env,
        )
        .unwrap();
        assert_eq!(target.ssl, SslChoice::VerifyCa);
        assert_eq!(target.root_cert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(target.config.get_application_name(), Some("x"));

        let target = resolve(
            Some("host=h user=a sslmode=require sslrootcert='/etc/my ca.pem' dbname='d b'"),
            None,
            &env,
        )
        .unwrap();
        // libpq: require with a root certificate verifies the chain.
        assert_eq!(target.ssl, SslChoice::VerifyCa);
        assert_eq!(target.root_cert.as_deref(), Some("/etc/my ca.pem"));
        assert_eq!(target.config.get_dbname(), Some("d b"));

        let target = resolve(Some("postgres://a@h/d?sslmode=disable"), None, &env).unwrap();
        assert_eq!(target.config.get_ssl_mode(), SslMode::Disable);
    }

    #[test]
    fn bad_settings_are_configuration_errors() {
        let env = vars(&[]);
        for url in [
            "postgres://a@h/d?sslmode=sometimes",
            "postgres://a@h/d?sslmode=%zz",
            "host=h user='unterminated",
            "postgres://a@h:notaport/d",
        ] {
            let failure = resolve(Some(url), None, &env).unwrap_err();
            assert_eq!(failure.code, CONFIG, "{url}: {}", failure.message);
        }
        let failure = resolve(None, None, &vars(&[("PGPORT", "http")])).unwrap_err();
        assert_eq!(failure.code, CONFIG);
    }

    #[test]
    fn a_malformed_url_shows_its_problem_and_the_expected_forms() {
        let env = vars(&[]);
        let expected = "expected postgres://user:password@host:port/dbname (or \
                        postgresql://…) or key=value settings such as host=localhost user=app \
                        dbname=app";
        for (url, problem) in [
            (
                "postgress:/oops",
                "`postgress:` is not a PostgreSQL URL scheme",
            ),
            (
                "mysql://root:secret@h/d",
                "`mysql:` is not a PostgreSQL URL scheme",
            ),
            (
                "postgres:/h/d",
                "`postgres:` must be followed by `//` and the host",
            ),
            ("oops", "not key=value pairs"),
        ] {
            let failure = resolve(Some(url), None, &env).unwrap_err();
            assert_eq!(failure.code, CONFIG, "{url}");
            assert_eq!(
                failure.message,
                format!("invalid connection string: {problem}; {expected}"),
                "{url}"
            );
            assert!(!failure.message.contains("secret"), "no password shown");
        }
        let failure = resolve(Some("postgres://a@h:notaport/d"), None, &env).unwrap_err();
        assert!(
            failure.message.ends_with(expected) && failure.message.contains("port"),
            "the parser's words, then the forms: {}",
            failure.message
        );
        for good in [
            "host=h user=u password=a:b",
            "postgresql://u@h/d",
            "postgres://h",
        ] {
            assert!(resolve(Some(good), None, &env).is_ok(), "{good}");
        }
    }
}
