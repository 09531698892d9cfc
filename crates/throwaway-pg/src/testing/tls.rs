//! A test CA and a throwaway PostgreSQL that speaks TLS with its certificate: what the
//! TLS tests of the adapter and of `pglock` share.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::ThrowawayPostgres;

/// A CA made for one test, and in a folder of its own (removed on drop):
///
/// | file | what |
/// | --- | --- |
/// | `ca.pem` | the CA's certificate |
/// | `server.crt`, `server.key` | a certificate for `localhost` signed by the CA, and its key (mode 0600, owned by `postgres` when the tests run as root, as the server wants it) |
/// | `other.pem` | an unrelated CA's certificate, which does not verify the server |
///
/// ```no_run
/// use throwaway_pg::testing::TestCa;
///
/// let ca = TestCa::new("my-tls-test");
/// let pg = ca.server(true); // TLS connections only
/// let url = format!(
///     "host=localhost hostaddr=127.0.0.1 port={} user=postgres sslmode=verify-full sslrootcert={}",
///     pg.port(),
///     ca.path("ca.pem").display()
/// );
/// # drop(url);
/// ```
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
    ca_der: Vec<u8>,
}

impl TestCa {
    /// Makes the CA, the server's certificate and the unrelated CA in a new folder named
    /// after `name` under the temporary directory.
    #[must_use]
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(super::unique(name));
        std::fs::create_dir_all(&dir).expect("a folder for the test CA");
        let write = |file: &str, text: String| {
            std::fs::write(dir.join(file), text).expect("write a PEM file");
        };
        let ca_key = KeyPair::generate().expect("a key");
        let ca = ca_params("locks test CA")
            .self_signed(&ca_key)
            .expect("the CA");
        write("ca.pem", ca.pem());
        let other_key = KeyPair::generate().expect("a key");
        let other = ca_params("other CA")
            .self_signed(&other_key)
            .expect("the other CA");
        write("other.pem", other.pem());

        let issuer = Issuer::new(ca_params("locks test CA"), ca_key);
        let server_key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = params
            .signed_by(&server_key, &issuer)
            .expect("the server's certificate");
        write("server.crt", server.pem());
        write("server.key", server_key.serialize_pem());
        // The server reads its key as the user it runs as, and wants it private.
        let key = dir.join("server.key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod the key");
        if crate::process::is_root() {
            let status = std::process::Command::new("chown")
                .arg("postgres")
                .arg(&key)
                .status()
                .expect("chown the key");
            assert!(status.success(), "chown postgres {}", key.display());
        }
        Self {
            dir,
            ca_der: ca.der().to_vec(),
        }
    }

    /// The path of one of the CA's files (see the table above).
    #[must_use]
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The folder that holds the files.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA's certificate, DER-encoded (for a client's root store).
    #[must_use]
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    /// A throwaway PostgreSQL with `ssl = on` and the server's certificate; with
    /// `tls_only`, `pg_hba.conf` accepts TCP connections over TLS only (`hostssl` lines; the
    /// Unix socket stays open, with `trust`).
    #[must_use]
    pub fn server(&self, tls_only: bool) -> ThrowawayPostgres {
        let quoted = |file: &str| format!("'{}'", self.path(file).display());
        let pg = ThrowawayPostgres::builder()
            .setting("ssl", "on")
            .setting("ssl_cert_file", quoted("server.crt"))
            .setting("ssl_key_file", quoted("server.key"))
            .start()
            .expect("a throwaway PostgreSQL with TLS");
        if tls_only {
            std::fs::write(
                pg.data_dir().join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\n\
                 hostssl all all ::1/128 trust\n",
            )
            .expect("pg_hba.conf");
            pg.psql("SELECT pg_reload_conf()").expect("reload");
        }
        pg
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The parameters of a CA named `name` (the same name gives the same issuer).
fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}
