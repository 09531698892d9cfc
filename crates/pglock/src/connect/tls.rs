//! TLS with rustls, as libpq's `sslmode` says (see docs/adr for the choice).

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::connect::{SslChoice, Target};
use crate::exit::{CONFIG, Failure};

/// The TLS connector for `target`, or `None` for `sslmode=disable`.
pub(crate) fn connector(target: &Target) -> Result<Option<MakeRustlsConnect>, Failure> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| Failure::new(CONFIG, format!("TLS set-up failed: {error}")))?;
    let config = match target.ssl {
        SslChoice::Disable => return Ok(None),
        SslChoice::Prefer | SslChoice::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient {
                chain: None,
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        SslChoice::VerifyCa | SslChoice::VerifyFull => {
            let roots = Arc::new(roots(target.root_cert.as_deref())?);
            let algorithms = provider.signature_verification_algorithms;
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|error| Failure::new(CONFIG, format!("TLS set-up failed: {error}")))?;
            if target.ssl == SslChoice::VerifyFull {
                builder.with_webpki_verifier(webpki).with_no_client_auth()
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Lenient {
                        chain: Some(webpki),
                        algorithms,
                    }))
                    .with_no_client_auth()
            }
        }
    };
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// The root certificates: the `sslrootcert` file, else libpq's `~/.postgresql/root.crt`,
/// else (or for `sslrootcert=system`) the system's store.
fn roots(root_cert: Option<&str>) -> Result<RootCertStore, Failure> {
    let mut store = RootCertStore::empty();
    let default_file = std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".postgresql/root.crt"))
        .filter(|path| path.is_file());
    let file = match root_cert {
        Some("system") => None,
        Some(path) => Some(Path::new(path).to_path_buf()),
        None => default_file,
    };
    if let Some(file) = file {
        let shown = file.display();
        let certs = CertificateDer::pem_file_iter(&file).map_err(|error| {
            Failure::new(CONFIG, format!("cannot read sslrootcert {shown}: {error}"))
        })?;
        for cert in certs {
            let cert = cert.map_err(|error| {
                Failure::new(CONFIG, format!("cannot read sslrootcert {shown}: {error}"))
            })?;
            store.add(cert).map_err(|error| {
                Failure::new(CONFIG, format!("unusable certificate in {shown}: {error}"))
            })?;
        }
        if store.is_empty() {
            return Err(Failure::new(
                CONFIG,
                format!("no certificate in sslrootcert {shown}"),
            ));
        }
        return Ok(store);
    }
    let native = rustls_native_certs::load_native_certs();
    let (added, _ignored) = store.add_parsable_certificates(native.certs);
    if added == 0 {
        return Err(Failure::new(
            CONFIG,
            "no root certificates found in the system store: set sslrootcert (PGSSLROOTCERT)",
        ));
    }
    Ok(store)
}

/// The certificate check of `prefer`/`require` (none: encrypted, the handshake's
/// signatures checked, the certificate itself not, as in libpq) and of `verify-ca` (the
/// chain must lead to a root certificate; the host name is not compared).
#[derive(Debug)]
struct Lenient {
    /// `None`: any certificate; `Some`: the chain is checked.
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The chain is checked before the name: a name error means the chain was good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
