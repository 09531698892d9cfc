//! Opening connections: the pool the lock manager uses, the first connection that checks
//! the target, and the exit code and message for a connection that could not be opened.

use locks_postgres::deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
};
use locks_postgres::tokio_postgres::{self, NoTls};

use super::Target;
use super::tls;
use crate::exit::{CONFIG, Failure, NOPERM, SOFTWARE, UNAVAILABLE, causes};
use crate::text::Say;

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

/// One connection named `pglock`, for the commands that look at locks or end sessions
/// (`who`, `list`, `break`) rather than take a lock.
pub(crate) async fn one_client(target: &Target, say: Say) -> Result<Object, Failure> {
    say.say(format!("connecting to {}", target.shown));
    let pool = pool(target, 1, "pglock")?;
    pool.get()
        .await
        .map_err(|error| pool_failure(&error, target))
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
        PoolError::Backend(error) => connect_failure(error, target),
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
pub(crate) fn connect_failure(error: &tokio_postgres::Error, target: &Target) -> Failure {
    let shown = &target.shown;
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
    let text = causes(error);
    let exit = if tls_source(error) || tls_refused(error) {
        CONFIG
    } else if target.config.get_password().is_none()
        && std::error::Error::source(error).is_some()
        && !error.is_closed()
        && !io_source(error)
    {
        // The server answered, asked for a password (the driver's configuration error,
        // before anything is sent), and none is set: missing credentials, not a network
        // problem to retry.
        return Failure::new(
            NOPERM,
            format!(
                "cannot connect to {shown}: the server asks for a password and none is set \
                 (PGPASSWORD, ~/.pgpass or PGPASSFILE, or the URL)"
            ),
        );
    } else {
        UNAVAILABLE
    };
    Failure::new(exit, format!("cannot connect to {shown}: {text}"))
}

/// Whether an I/O error (a refused or broken connection) is among the causes of `error`.
fn io_source(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Whether the driver gave up on TLS before any I/O error: `sslmode=require` (or
/// `verify-*`) and a server that answers that it has no TLS. A setting to fix, not a
/// password to give (it has a source and is no I/O error, as a missing password is), nor a
/// network to retry. The driver does not expose its error's kind, only its text.
fn tls_refused(error: &tokio_postgres::Error) -> bool {
    error
        .to_string()
        .starts_with("error performing TLS handshake")
        && !io_source(error)
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
