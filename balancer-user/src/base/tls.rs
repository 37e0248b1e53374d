//! rustls settings shared by every TLS link the daemon and the CLI open or serve: the HTTPS
//! scrapes and health checks, the control API's TCP listener and the CLI's client of it. All
//! use the ring provider (the one etcd-client's tonic uses) and PEM files; an unreadable or
//! unusable file is an error naming the setting it came from (`setting`, e.g. `"api.cert"`).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The crypto provider of every link.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Installs ring as the process-wide provider, once (reqwest wants one even for plain HTTP;
/// one already installed stays).
pub fn install_default_provider() {
    static PROVIDER: std::sync::Once = std::sync::Once::new();
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The certificates of a PEM file (at least one).
pub fn read_certs(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("reading {setting} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{setting} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn read_key(path: &Path, setting: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("reading {setting} {}: {e}", path.display()))
}

/// Roots from a CA file (`ca_setting` names it), or the system's when `ca` is None.
pub fn roots(ca: Option<&Path>, ca_setting: &str) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(ca) => {
            let (added, _) = roots.add_parsable_certificates(read_certs(ca, ca_setting)?);
            if added == 0 {
                return Err(format!(
                    "{ca_setting} {}: no usable CA certificate",
                    ca.display()
                ));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(format!("no system CA certificates: set {ca_setting}"));
            }
        }
    }
    Ok(roots)
}

/// Where a client's TLS settings come from, for error messages: the settings' names.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub ca: &'static str,
    pub cert: &'static str,
    pub key: &'static str,
}

impl Settings {
    /// A certificate and key that do not go together (or that rustls refuses), both named.
    fn pair_error(&self, cert: &Path, key: &Path, e: &rustls::Error) -> String {
        format!(
            "{} {} and {} {}: {e}",
            self.cert,
            cert.display(),
            self.key,
            key.display()
        )
    }
}

/// A client configuration: trust `ca` (or the system's roots), and present `identity` (a
/// certificate chain and key file) when given.
pub fn client_config(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    names: Settings,
) -> Result<rustls::ClientConfig, String> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_root_certificates(roots(ca, names.ca)?);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = read_certs(cert, names.cert)?;
            let key_der = read_key(key, names.key)?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| names.pair_error(cert, key, &e))
        }
    }
}

/// The configuration of a client that only ever speaks plain HTTP: it trusts no root. (A
/// reqwest client gets a TLS configuration whatever its use; the default one loads the
/// system's roots, milliseconds of CPU each time a scrape loop or health checker starts.)
pub fn plain_http_client_config() -> Result<rustls::ClientConfig, String> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}

/// A server configuration: serve `cert` with `key`; with `client_ca`, every client must
/// present a certificate that CA signed. HTTP/1.1 only (ALPN).
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    names: Settings,
) -> Result<rustls::ServerConfig, String> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(Some(ca), names.ca)?),
                provider(),
            )
            .build()
            .map_err(|e| format!("{} {}: {e}", names.ca, ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let chain = read_certs(cert, names.cert)?;
    let key_der = read_key(key, names.key)?;
    let mut config = builder
        .with_single_cert(chain, key_der)
        .map_err(|e| names.pair_error(cert, key, &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Certificates made at run time for tests: a CA, and leaves it signs.
#[cfg(test)]
pub mod test_pki {
    use std::path::{Path, PathBuf};

    pub struct Pki {
        /// A fresh directory for the files of one test.
        pub dir: PathBuf,
        pub ca_pem: String,
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    }

    impl Pki {
        pub fn new(tag: &str) -> Pki {
            let dir =
                std::env::temp_dir().join(format!("balancer-pki-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, format!("{tag} test CA"));
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            Pki {
                dir,
                ca_pem: cert.pem(),
                issuer: rcgen::Issuer::new(params, key),
            }
        }

        /// A certificate (PEM) and its key for `name` (an IP address or a DNS name), for a
        /// server or, with `client`, a client.
        pub fn leaf(&self, name: &str, client: bool) -> (String, String) {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            params.subject_alt_names.push(match name.parse() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => rcgen::SanType::DnsName(name.try_into().unwrap()),
            });
            params.extended_key_usages = vec![if client {
                rcgen::ExtendedKeyUsagePurpose::ClientAuth
            } else {
                rcgen::ExtendedKeyUsagePurpose::ServerAuth
            }];
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        }
    }

    /// Writes `text` to `dir/name`.
    pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}
