//! The CLI's client for the control API: HTTP/1.1 (hyper) with JSON bodies over the daemon's
//! Unix socket, or over TCP with a bearer token, optionally in TLS (rustls). Blocking for its
//! callers: each request runs on a small runtime of its own, one connection per request.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::base::error_text::error_chain;
use crate::base::tls;
use crate::state::wire::ErrorBody;

/// Where the daemon listens. Its `Debug` leaves the token out.
#[derive(Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp {
        /// `host:port`; the host is also the name the daemon's certificate must hold.
        addr: String,
        token: String,
        tls: Option<ClientTls>,
    },
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(path) => f.debug_tuple("Unix").field(path).finish(),
            Endpoint::Tcp { addr, tls, .. } => f
                .debug_struct("Tcp")
                .field("addr", addr)
                .field("token", &"<redacted>")
                .field("tls", tls)
                .finish(),
        }
    }
}

/// TLS to the daemon's TCP listener.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// The CA of the daemon's certificate; None: the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate and key, for a listener that wants one (`api.client_ca`).
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// The CLI's names of the TLS settings, for error messages.
const CLI_SETTINGS: tls::Settings = tls::Settings {
    ca: "--ca",
    cert: "--cert",
    key: "--key",
};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the daemon at {target}: {source} (is `balancer run` running?)")]
    Connect {
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with the daemon at {target} failed: {reason}")]
    Tls { target: String, reason: String },
    #[error("{message}")]
    Api { status: u16, message: String },
    #[error("unexpected answer from the daemon: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client of one daemon.
pub struct Client {
    endpoint: Endpoint,
    timeout: Duration,
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

impl Client {
    pub fn new(endpoint: Endpoint) -> Client {
        Client {
            endpoint,
            // Changes may wait for neighbour resolution (seconds) and the kernel.
            timeout: Duration::from_secs(30),
        }
    }

    fn describe(&self) -> String {
        match &self.endpoint {
            Endpoint::Unix(p) => p.display().to_string(),
            Endpoint::Tcp { addr, .. } => addr.clone(),
        }
    }

    /// Sends a request and returns the status and body.
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let size = body.map_or(0, <[u8]>::len);
        if size > super::server::MAX_BODY {
            return Err(ClientError::Api {
                status: 413,
                message: format!(
                    "the request body ({size} bytes) is larger than the API accepts ({} bytes)",
                    super::server::MAX_BODY
                ),
            });
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Protocol(format!("starting the client runtime: {e}")))?;
        runtime.block_on(async {
            tokio::time::timeout(self.timeout, self.exchange(method, path, body))
                .await
                .map_err(|_| {
                    ClientError::Protocol(format!(
                        "no answer from {} within {} s",
                        self.describe(),
                        self.timeout.as_secs()
                    ))
                })?
        })
    }

    async fn connect(&self) -> Result<Box<dyn Stream>, ClientError> {
        let connect = |e| ClientError::Connect {
            target: self.describe(),
            source: e,
        };
        match &self.endpoint {
            Endpoint::Unix(path) => Ok(Box::new(
                tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(connect)?,
            )),
            Endpoint::Tcp { addr, tls, .. } => {
                let tcp = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(connect)?;
                let _ = tcp.set_nodelay(true);
                let Some(tls) = tls else {
                    return Ok(Box::new(tcp));
                };
                let failed = |reason: String| ClientError::Tls {
                    target: addr.clone(),
                    reason,
                };
                let identity = tls
                    .identity
                    .as_ref()
                    .map(|(c, k)| (c.as_path(), k.as_path()));
                let config = tls::client_config(tls.ca.as_deref(), identity, CLI_SETTINGS)
                    .map_err(failed)?;
                let name = server_name(addr).map_err(failed)?;
                let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
                    .connect(name, tcp)
                    .await
                    .map_err(|e| failed(error_chain(&e)))?;
                Ok(Box::new(stream))
            }
        }
    }

    async fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let protocol = |e: &dyn std::fmt::Display| ClientError::Protocol(e.to_string());
        let stream = self.connect().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| protocol(&e))?;
        let driver = tokio::spawn(connection);
        let body = body.unwrap_or_default();
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "balancer")
            .header("accept", "application/json");
        if !body.is_empty() {
            request = request.header("content-type", "application/json");
        }
        if let Endpoint::Tcp { token, .. } = &self.endpoint {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|e| protocol(&e))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| match self.endpoint {
                // A TLS listener that wants a client certificate closes the connection at
                // the first request of a client without one (TLS 1.3 checks it late).
                Endpoint::Tcp { tls: Some(_), .. } => ClientError::Tls {
                    target: self.describe(),
                    reason: format!(
                        "{} (a listener with api.client_ca wants --cert and --key)",
                        error_chain(&e)
                    ),
                },
                _ => protocol(&error_chain(&e)),
            })?;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| protocol(&e))?
            .to_bytes();
        driver.abort();
        Ok((status, bytes.to_vec()))
    }

    /// `GET path` as JSON.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call("GET", path, None::<&()>)
    }

    /// A request with an optional JSON body, answered with JSON.
    pub fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let bytes = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (status, reply) = self.raw(method, path, bytes.as_deref())?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<ErrorBody>(&reply)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&reply).into_owned());
            return Err(ClientError::Api { status, message });
        }
        serde_json::from_slice(&reply)
            .map_err(|e| ClientError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&reply))))
    }
}

/// The name the daemon's certificate must hold: the host of `host:port` (an IP address, or a
/// DNS name; `[v6]:port` unbracketed).
fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => return Err(format!("{addr:?} is not host:port")),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is not a host name or address: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_debug_output_holds_a_token() {
        let endpoint = Endpoint::Tcp {
            addr: "127.0.0.1:9180".into(),
            token: "secret-token-0123456789".into(),
            tls: None,
        };
        let shown = format!("{endpoint:?}");
        assert!(!shown.contains("secret-token"), "{shown}");
        assert!(shown.contains("127.0.0.1:9180"), "{shown}");
    }

    #[test]
    fn the_server_name_is_the_host_of_the_address() {
        assert_eq!(
            server_name("127.0.0.1:9180").unwrap(),
            rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap()
        );
        assert_eq!(
            server_name("[::1]:9180").unwrap(),
            rustls::pki_types::ServerName::try_from("::1").unwrap()
        );
        assert_eq!(
            server_name("lb1.example.net:9180").unwrap(),
            rustls::pki_types::ServerName::try_from("lb1.example.net").unwrap()
        );
        assert!(server_name("127.0.0.1").unwrap_err().contains("host:port"));
    }
}
