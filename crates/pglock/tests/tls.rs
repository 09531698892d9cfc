//! TLS as libpq's `sslmode` says, against a throwaway PostgreSQL with `ssl = on` and a
//! certificate from a test CA made here (rcgen).

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use throwaway_pg::ThrowawayPostgres;
use tokio::process::Command;

const SOON: Duration = Duration::from_secs(30);

/// A CA, a server certificate for `localhost` signed by it, and an unrelated CA, as PEM
/// files in `dir`.
fn certificates(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let ca_params = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
    };
    let write = |name: &str, text: String| std::fs::write(dir.join(name), text).expect("write");

    let ca_key = KeyPair::generate().expect("key");
    let ca = ca_params("pglock test CA")
        .self_signed(&ca_key)
        .expect("CA");
    write("ca.pem", ca.pem());
    let other_key = KeyPair::generate().expect("key");
    let other = ca_params("other CA").self_signed(&other_key).expect("CA");
    write("other.pem", other.pem());

    let issuer = Issuer::new(ca_params("pglock test CA"), ca_key);
    let server_key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.is_ca = IsCa::ExplicitNoCa;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = params
        .signed_by(&server_key, &issuer)
        .expect("server certificate");
    write("server.crt", server.pem());
    write("server.key", server_key.serialize_pem());

    // The server reads its key as the user it runs as, and wants it private.
    let key = dir.join("server.key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    if nix::unistd::geteuid().is_root() {
        let status = std::process::Command::new("chown")
            .arg("postgres")
            .arg(&key)
            .status()
            .expect("chown");
        assert!(status.success());
    }
}

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
    let dir = std::env::temp_dir().join(format!("pglock-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("folder");
    certificates(&dir);
    let quoted = |name: &str| format!("'{}'", dir.join(name).display());
    let pg = ThrowawayPostgres::builder()
        .setting("ssl", "on")
        .setting("ssl_cert_file", quoted("server.crt"))
        .setting("ssl_key_file", quoted("server.key"))
        .start()
        .expect("a throwaway PostgreSQL with TLS");
    let port = pg.port();
    let ca = dir.join("ca.pem").display().to_string();
    let other = dir.join("other.pem").display().to_string();
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
    let _ = std::fs::remove_dir_all(&dir);
}
