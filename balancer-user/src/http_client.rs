//! The HTTP client of scrapes, model discovery and `balancer report`: reqwest (hyper
//! underneath) with a connection pool, so a backend scraped every interval keeps one
//! keep-alive connection instead of a new TCP connection per page; gzip and chunked answers
//! are decoded; each exchange is bounded in time and body size. HTTPS through rustls (the
//! ring provider, as the etcd client's): a CA file or the system's roots, an optional client
//! certificate, and a bearer token from a file. Why reqwest rather than hyper alone: pooling,
//! timeouts, decompression and TLS in one maintained crate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ScrapeAccess;

/// A pooled client for GETs of small pages (metrics, model lists).
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: reqwest::Client,
    scheme: &'static str,
    /// `Bearer <token>`, when a token file is set.
    authorization: Option<String>,
}

impl HttpClient {
    /// A plain-HTTP client.
    pub fn new() -> Result<HttpClient, String> {
        HttpClient::with_access(&ScrapeAccess::default())
    }

    /// A client reaching pages as `access` says; its files are read now, and an unreadable
    /// or unusable one is an error naming it.
    pub fn with_access(access: &ScrapeAccess) -> Result<HttpClient, String> {
        // reqwest wants a process-wide rustls provider even for plain HTTP: ring, the one
        // every TLS link of the daemon uses (one already installed stays).
        static PROVIDER: std::sync::Once = std::sync::Once::new();
        PROVIDER.call_once(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
        let mut builder = reqwest::Client::builder()
            .user_agent("balancer")
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(2)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none());
        if access.https {
            builder = builder.use_preconfigured_tls(tls_config(access)?);
        }
        let client = builder
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let authorization = match &access.bearer_token_file {
            None => None,
            Some(path) => {
                let token = std::fs::read_to_string(path)
                    .map_err(|e| format!("reading bearer_token_file {}: {e}", path.display()))?;
                let token = token.trim();
                if token.is_empty() || token.chars().any(|c| c.is_control() || c == ' ') {
                    return Err(format!(
                        "bearer_token_file {}: not one token (empty, or spaces inside)",
                        path.display()
                    ));
                }
                Some(format!("Bearer {token}"))
            }
        };
        Ok(HttpClient {
            client,
            scheme: if access.https { "https" } else { "http" },
            authorization,
        })
    }

    /// `GET path` from `addr`: the body of a 200 answer, at most `max_body` bytes, within
    /// `timeout`.
    pub async fn get(
        &self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
        max_body: usize,
    ) -> Result<String, String> {
        let url = format!("{}://{addr}{path}", self.scheme);
        let attempt = async {
            let mut request = self.client.get(&url).header("accept", "text/plain");
            if let Some(auth) = &self.authorization {
                request = request.header("authorization", auth);
            }
            let mut response = request
                .send()
                .await
                .map_err(|e| format!("{url}: {}", describe(&e)))?;
            let status = response.status().as_u16();
            if status == 401 || status == 403 {
                let hint = if self.authorization.is_some() {
                    "the bearer token was refused"
                } else {
                    "it wants credentials: set telemetry.bearer_token_file"
                };
                return Err(format!("{url} answered status {status} ({hint})"));
            }
            if status != 200 {
                return Err(format!("{url} answered status {status}"));
            }
            let mut body = Vec::new();
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| format!("{addr}{path}: {}", describe(&e)))?
            {
                if body.len() + chunk.len() > max_body {
                    return Err(format!(
                        "page from {addr}{path} larger than {max_body} bytes"
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            String::from_utf8(body).map_err(|_| format!("page from {addr}{path} is not UTF-8"))
        };
        tokio::time::timeout(timeout, attempt).await.map_err(|_| {
            format!(
                "{addr}{path}: no complete answer within {} ms",
                timeout.as_millis()
            )
        })?
    }
}

/// rustls settings for `access`: its CA (or the system's roots) and client certificate.
fn tls_config(access: &ScrapeAccess) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match &access.ca {
        Some(ca) => {
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("reading telemetry.ca {}: {e}", ca.display()))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "telemetry.ca {}: no usable certificate",
                    ca.display()
                ));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err("HTTPS scrapes: no system CA certificates; set telemetry.ca".into());
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_root_certificates(roots);
    match &access.identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("reading telemetry.cert {}: {e}", cert.display()))?;
            let key_der = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("reading telemetry.key {}: {e}", key.display()))?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                format!(
                    "telemetry.cert {} and telemetry.key {}: {e}",
                    cert.display(),
                    key.display()
                )
            })
        }
    }
}

/// reqwest's error with its sources (the useful part is often the innermost).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
