//! TLS as libpq's `sslmode` says, against a throwaway PostgreSQL with `ssl = on` and a
//! certificate from a test CA ([`throwaway_pg::testing::TestCa`]).

use std::process::{Output, Stdio};
use std::time::Duration;

use throwaway_pg::testing::TestCa;
use tokio::process::Command;

const SOON: Duration = Duration::from_secs(30);

async fn pglock(url: &str, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pglock"));
    for name in [
        "DATABASE_URL",
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGHOST",
        "PGPORT",
        "PGUSER",
    ] {
        command.env_remove(name);
    }
    command
        .env("HOME", "/nonexistent")
        .arg("--url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(SOON, command.output())
        .await
        .expect("pglock finished in time")
        .expect("pglock ran")
}

fn described(output: &Output) -> String {
    format!(
        "{:?}: {}{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn sslmodes_connect_verify_and_refuse_as_libpq_does() {
    let test_ca = TestCa::new("pglock-tls");
    let pg = test_ca.server(false);
    let port = pg.port();
    let ca = test_ca.path("ca.pem").display().to_string();
    let other = test_ca.path("other.pem").display().to_string();
    let conninfo = |host: &str, mode: &str, root: &str| {
        format!(
            "host={host} hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres \
             sslmode={mode} sslrootcert='{root}'"
        )
    };
    // The command reports whether its lock session is encrypted, asked over the same lock's
    // connection settings (pg_stat_ssl of the session named after pglock's holder id).
    let ssl_of_lock_session = "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
        WHERE a.application_name LIKE 'locks:pglock@%'";

    let require = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=require");
    let psql = pg.bin_dir().join("psql").display().to_string();
    let script = format!(
        "{psql} -X -A -t -h 127.0.0.1 -p {port} -U postgres -d postgres -c \"{ssl_of_lock_session}\""
    );
    let encrypted = pglock(&require, &["run", "tls-require", "-c", &script]).await;
    assert_eq!(
        encrypted.status.code(),
        Some(0),
        "{}",
        described(&encrypted)
    );
    assert_eq!(
        String::from_utf8_lossy(&encrypted.stdout).trim(),
        "t",
        "{}",
        described(&encrypted)
    );

    let full = pglock(
        &conninfo("localhost", "verify-full", &ca),
        &["run", "tls-full", "--", "true"],
    )
    .await;
    assert_eq!(full.status.code(), Some(0), "{}", described(&full));

    // The certificate names localhost, not 127.0.0.1: verify-full refuses, verify-ca does not.
    let wrong_name = pglock(
        &conninfo("127.0.0.1", "verify-full", &ca),
        &["run", "tls-name", "--", "true"],
    )
    .await;
    assert_eq!(
        wrong_name.status.code(),
        Some(78),
        "{}",
        described(&wrong_name)
    );
    let chain_only = pglock(
        &conninfo("127.0.0.1", "verify-ca", &ca),
        &["run", "tls-ca", "--", "true"],
    )
    .await;
    assert_eq!(
        chain_only.status.code(),
        Some(0),
        "{}",
        described(&chain_only)
    );

    let wrong_ca = pglock(
        &conninfo("localhost", "verify-full", &other),
        &["run", "tls-other", "--", "true"],
    )
    .await;
    assert_eq!(wrong_ca.status.code(), Some(78), "{}", described(&wrong_ca));
    let message = String::from_utf8_lossy(&wrong_ca.stderr);
    assert!(
        message.starts_with("pglock: cannot connect to postgres@localhost"),
        "{message}"
    );
    assert_eq!(message.lines().count(), 1, "{message}");

    let missing = pglock(
        &conninfo("localhost", "verify-full", "/nonexistent/ca.pem"),
        &["run", "tls-missing", "--", "true"],
    )
    .await;
    assert_eq!(missing.status.code(), Some(78), "{}", described(&missing));
    drop(pg);
}

/// `sslmode=require` against a server without TLS is a setting to fix (78, saying so in the
/// driver's words), with or without a password: never "the server asks for a password"
/// (77, which sends the operator after credentials), nor "unreachable" (69, retried).
#[tokio::test]
async fn require_against_a_server_without_tls_is_bad_settings() {
    let pg = throwaway_pg::ThrowawayPostgres::builder()
        .setting("ssl", "off")
        .start()
        .expect("a server without TLS");
    let port = pg.port();
    for user in ["postgres", "postgres:not-needed"] {
        let url = format!("postgres://{user}@127.0.0.1:{port}/postgres?sslmode=require");
        let refused = pglock(&url, &["run", "tls-none", "--", "true"]).await;
        assert_eq!(refused.status.code(), Some(78), "{}", described(&refused));
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(message.contains("TLS"), "{message}");
        assert!(!message.contains("password"), "{message}");
        assert!(!message.contains("not-needed"), "{message}");
        assert_eq!(message.lines().count(), 1, "{message}");
    }
    drop(pg);
}
