//! Where the server is and how to reach it: `--url`, else `DATABASE_URL`, else the libpq
//! environment, as psql reads them; the pool the lock manager uses.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use locks_postgres::deadpool_postgres::{
    Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime,
};
use locks_postgres::tokio_postgres::config::{Host, SslMode};
use locks_postgres::tokio_postgres::{self, Config, NoTls};

use crate::exit::{CONFIG, Failure, NOPERM, SOFTWARE, UNAVAILABLE, chain};
use crate::tls;

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
    let (rest, params) = split_ssl_params(&conninfo)?;
    let mut config = Config::from_str(&rest).map_err(|error| {
        Failure::new(
            CONFIG,
            format!("invalid connection string: {}", chain(&error)),
        )
    })?;

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

/// The TLS parameters taken out of a connection string (the driver knows neither
/// `verify-*` modes nor `sslrootcert`).
#[derive(Debug, Default, PartialEq, Eq)]
struct SslParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// `conninfo` without `sslmode` and `sslrootcert`, and their values. Both libpq forms:
/// `postgres://…?sslmode=…` and `host=… sslmode=…`.
fn split_ssl_params(conninfo: &str) -> Result<(String, SslParams), Failure> {
    let mut params = SslParams::default();
    let is_url = conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://");
    if is_url {
        let Some((base, query)) = conninfo.split_once('?') else {
            return Ok((conninfo.to_owned(), params));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match percent_decode(key)?.as_str() {
                "sslmode" => params.sslmode = Some(percent_decode(value)?),
                "sslrootcert" => params.sslrootcert = Some(percent_decode(value)?),
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, params));
    }
    let mut kept = Vec::new();
    for (key, value) in key_values(conninfo)? {
        match key.as_str() {
            "sslmode" => params.sslmode = Some(value),
            "sslrootcert" => params.sslrootcert = Some(value),
            _ => kept.push(format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            )),
        }
    }
    Ok((kept.join(" "), params))
}

/// The pairs of a libpq `key=value` string (values bare or in single quotes, with `\`
/// escapes).
fn key_values(text: &str) -> Result<Vec<(String, String)>, Failure> {
    let bad = || {
        Failure::new(
            CONFIG,
            "invalid connection string: expected key=value pairs",
        )
    };
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') || key.is_empty() {
            return Err(bad());
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.push(chars.next().ok_or_else(bad)?),
                    Some(c) => value.push(c),
                    None => return Err(bad()),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.push(chars.next().ok_or_else(bad)?);
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// `%XX` decoding of a URL query part.
fn percent_decode(text: &str) -> Result<String, Failure> {
    let bad = || Failure::new(CONFIG, format!("invalid percent-encoding in `{text}`"));
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).ok_or_else(bad)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
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

/// The password for `config` from the password file (`PGPASSFILE`, else `~/.pgpass`),
/// as libpq reads it: `host:port:database:user:password`, `*` matches anything, `\`
/// escapes `:` and `\`.
fn pgpass_password(config: &Config, env: &dyn Env) -> Option<String> {
    let path = env
        .var("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| env.var("HOME").map(|home| Path::new(&home).join(".pgpass")))?;
    let text = std::fs::read_to_string(path).ok()?;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        // libpq matches a socket directory as `localhost`.
        Some(Host::Unix(_)) | None => "localhost".to_owned(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default();
    let dbname = config.get_dbname().unwrap_or(user);
    pgpass_lookup(&text, [&host, &port, dbname, user])
}

/// The first line of a password file matching `wanted` (host, port, database, user).
fn pgpass_lookup(text: &str, wanted: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let mut fields = vec![String::new()];
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(next) = chars.next() {
                        fields.last_mut()?.push(next);
                    }
                }
                ':' if fields.len() < 5 => fields.push(String::new()),
                c => fields.last_mut()?.push(c),
            }
        }
        if fields.len() != 5 {
            continue;
        }
        let matches = wanted
            .iter()
            .zip(&fields)
            .all(|(want, field)| field == "*" || field == want);
        if matches {
            return fields.pop();
        }
    }
    None
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

/// A pool of at most `size` connections to `target`, each open bounded by its connect
/// timeout. Does no I/O.
pub(crate) fn pool(target: &Target, size: usize, application_name: &str) -> Result<Pool, Failure> {
    let mut config = target.config.clone();
    config.application_name(application_name);
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match tls::connector(target)? {
        Some(connector) => Manager::from_config(config, connector, manager_config),
        None => Manager::from_config(config, NoTls, manager_config),
    };
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(target.connect_timeout))
        .build()
        .map_err(|error| {
            Failure::new(
                SOFTWARE,
                format!("could not build the connection pool: {error}"),
            )
        })
}

/// Opens one connection (it goes back to the pool for the lock), so a wrong password or
/// a dead server is reported before anything else happens.
pub(crate) async fn check(pool: &Pool, target: &Target) -> Result<(), Failure> {
    match pool.get().await {
        Ok(client) => {
            drop(client);
            Ok(())
        }
        Err(error) => Err(pool_failure(&error, target)),
    }
}

/// The failure for a connection that could not be opened.
pub(crate) fn pool_failure(error: &PoolError, target: &Target) -> Failure {
    let shown = &target.shown;
    match error {
        PoolError::Backend(error) => connect_failure(error, shown),
        PoolError::Timeout(_) => Failure::new(
            UNAVAILABLE,
            format!(
                "cannot connect to {shown}: no answer within {}",
                crate::duration::show(target.connect_timeout)
            ),
        ),
        other => Failure::new(UNAVAILABLE, format!("cannot connect to {shown}: {other}")),
    }
}

/// The failure for a driver error while connecting, by SQLSTATE and error source.
pub(crate) fn connect_failure(error: &tokio_postgres::Error, shown: &str) -> Failure {
    if let Some(db) = error.as_db_error() {
        let code = db.code().code();
        let exit = match code {
            // invalid_authorization_specification (no such role, pg_hba rejects),
            // invalid_password; insufficient_privilege (no CONNECT on the database)
            code if code.starts_with("28") || code == "42501" => NOPERM,
            // invalid_catalog_name: no such database
            "3D000" => CONFIG,
            // too_many_connections, cannot_connect_now, admin_shutdown, …
            _ => UNAVAILABLE,
        };
        return Failure::new(exit, format!("cannot connect to {shown}: {}", db.message()));
    }
    let text = chain(error);
    let exit = if tls_source(error) {
        CONFIG
    } else {
        UNAVAILABLE
    };
    Failure::new(exit, format!("cannot connect to {shown}: {text}"))
}

/// Whether a certificate problem is among the causes of `error`.
fn tls_source(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(cause) = source {
        if let Some(rustls_error) = cause.downcast_ref::<rustls::Error>() {
            return matches!(
                rustls_error,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            );
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && tls_source(inner)
        {
            return true;
        }
        source = cause.source();
    }
    false
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
    fn the_password_file_is_read_like_libpq() {
        let text = "# comment\nother:*:*:*:no\ndb.example:5432:*:app:pa\\:ss\n*:*:*:*:fallback\n";
        assert_eq!(
            pgpass_lookup(text, ["db.example", "5432", "app", "app"]).as_deref(),
            Some("pa:ss")
        );
        assert_eq!(
            pgpass_lookup(text, ["x", "1", "d", "u"]).as_deref(),
            Some("fallback")
        );
        assert_eq!(pgpass_lookup("h:1:d:u\n", ["h", "1", "d", "u"]), None);
    }
}
