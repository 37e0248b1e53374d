//! The API's TCP listener in TLS (`api.cert`, `api.key`, optionally `api.client_ca`): rustls
//! in front of the same routes, HTTP/1.1 by hyper. A connection whose handshake fails (a
//! client that does not trust the certificate, or one without the client certificate asked
//! for) is logged and closed; the listener goes on.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::base::config::ApiTls;
use crate::base::tls;

/// Longest a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The rustls settings of the listener, from its files (read now; an unusable one is named).
pub fn server_config(tls_files: &ApiTls) -> Result<Arc<rustls::ServerConfig>, String> {
    tls::server_config(
        &tls_files.cert,
        &tls_files.key,
        tls_files.client_ca.as_deref(),
        tls::Settings {
            ca: "api.client_ca",
            cert: "api.cert",
            key: "api.key",
        },
    )
    .map(Arc::new)
}

/// What one listener allows its connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the kernel's backlog until one ends.
    pub max: usize,
    /// Longest a client may take to send a request's head (the first, or the next on a kept
    /// connection): a connection that says nothing is closed.
    pub header_timeout: Duration,
    /// Longest a connection is kept: then it is asked to close once its request is answered.
    pub lifetime: Duration,
}

/// The API's TCP listener: operators' CLIs and every GPU host's `balancer report --push`.
pub const API_LIMITS: ConnectionLimits = ConnectionLimits {
    max: 256,
    header_timeout: Duration::from_secs(10),
    lifetime: Duration::from_secs(300),
};

/// The metrics listener: a few Prometheus servers.
pub const METRICS_LIMITS: ConnectionLimits = ConnectionLimits {
    max: 64,
    header_timeout: Duration::from_secs(10),
    lifetime: Duration::from_secs(300),
};

/// How long a connection past its lifetime has to finish the request under way.
const CLOSING_GRACE: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` (in TLS when `tls` is set) within `limits`, until the task is
/// dropped; `what` names the listener in the log.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    limits: ConnectionLimits,
    what: &'static str,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!("{what} listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let Some(acceptor) = acceptor else {
                return serve_connection(tcp, app, limits, what, peer).await;
            };
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => serve_connection(stream, app, limits, what, peer).await,
                Ok(Err(e)) => tracing::info!(%peer, "{what} listener: TLS handshake failed: {e}"),
                Err(_) => tracing::info!(%peer, "{what} listener: no TLS handshake within 10 s"),
            }
        });
    }
}

/// One connection's requests, HTTP/1.1, within `limits`.
async fn serve_connection<S>(
    stream: S,
    app: Router,
    limits: ConnectionLimits,
    what: &'static str,
    peer: std::net::SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Handlers and the role guard see where the connection comes from.
    let service =
        TowerToHyperService::new(app.layer(axum::Extension(axum::extract::ConnectInfo(peer))));
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => ended,
        _ = tokio::time::sleep(limits.lifetime) => {
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(CLOSING_GRACE, connection).await.unwrap_or(Ok(()))
        }
    };
    if let Err(e) = ended {
        tracing::debug!(%peer, "{what} connection: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::tls::test_pki::{Pki, write};
    use crate::serve::api::client::{Client, ClientTls, Endpoint};

    /// A TLS listener with client certificates, in front of a token-guarded route.
    #[test]
    fn the_cli_client_reaches_a_tls_listener_and_each_missing_piece_is_named() {
        let pki = Pki::new("api-listener");
        let server = pki.leaf("127.0.0.1", false);
        let client_id = pki.leaf("balancer-cli", true);
        let other = Pki::new("api-listener-other");
        let dir = pki.dir.clone();
        let files = ApiTls {
            cert: write(&dir, "server.pem", &server.0),
            key: write(&dir, "server-key.pem", &server.1),
            client_ca: Some(write(&dir, "ca.pem", &pki.ca_pem)),
        };
        let client_cert = write(&dir, "client.pem", &client_id.0);
        let client_key = write(&dir, "client-key.pem", &client_id.1);
        let other_ca = write(&dir, "other-ca.pem", &other.ca_pem);
        let _ = std::fs::remove_dir_all(&other.dir);
        let token = "0123456789abcdef-token".to_string();

        let runtime = tokio::runtime::Runtime::new().unwrap();
        let addr = runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let app = crate::serve::api::server::token_guard(
                Router::new().route(
                    "/v1/status",
                    axum::routing::get(|| async { axum::Json(serde_json::json!({"ok": true})) }),
                ),
                token.clone(),
            );
            tokio::spawn(serve(
                listener,
                Some(server_config(&files).unwrap()),
                app,
                API_LIMITS,
                "API",
            ));
            addr
        });
        let client = |ca: &std::path::Path, identity: bool, token: &str| {
            Client::new(Endpoint::Tcp {
                addr: addr.to_string(),
                token: token.into(),
                tls: Some(ClientTls {
                    ca: Some(ca.to_path_buf()),
                    identity: identity.then(|| (client_cert.clone(), client_key.clone())),
                }),
            })
            .get::<serde_json::Value>("/v1/status")
        };
        let ca = files.client_ca.clone().unwrap();
        assert_eq!(
            client(&ca, true, &token).unwrap(),
            serde_json::json!({"ok": true})
        );
        let wrong_token = client(&ca, true, "not-the-token-0123").unwrap_err();
        assert_eq!(wrong_token.status(), Some(401), "{wrong_token}");
        let no_cert = client(&ca, false, &token).unwrap_err().to_string();
        assert!(
            no_cert.contains("TLS") && no_cert.contains("--cert"),
            "{no_cert}"
        );
        let untrusted = client(&other_ca, true, &token).unwrap_err().to_string();
        assert!(
            untrusted.contains("TLS") && untrusted.contains("UnknownIssuer"),
            "{untrusted}"
        );
        let missing_ca = client(&dir.join("none.pem"), true, &token)
            .unwrap_err()
            .to_string();
        assert!(
            missing_ca.contains("--ca") && missing_ca.contains("none.pem"),
            "{missing_ca}"
        );
        // Plain HTTP to the TLS port gets no answer it can read; the listener goes on.
        let plain = Client::new(Endpoint::Tcp {
            addr: addr.to_string(),
            token: token.clone(),
            tls: None,
        })
        .get::<serde_json::Value>("/v1/status");
        assert!(plain.is_err());
        assert!(client(&ca, true, &token).is_ok());
        // An unusable key file is named when the listener is set up.
        let bad = ApiTls {
            key: write(&dir, "bad-key.pem", "not a key"),
            ..files.clone()
        };
        let err = server_config(&bad).unwrap_err();
        assert!(
            err.contains("api.key") && err.contains("bad-key.pem"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A flood of connections that send nothing holds at most `max` slots, each only until
    /// its header timeout: a real request behind them is answered.
    #[test]
    fn a_flood_of_silent_connections_cannot_keep_a_request_out() {
        use std::io::{Read as _, Write as _};
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let limits = ConnectionLimits {
            max: 4,
            header_timeout: Duration::from_millis(300),
            lifetime: Duration::from_secs(30),
        };
        let addr = runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let app = Router::new().route("/ok", axum::routing::get(|| async { "ok" }));
            tokio::spawn(serve(listener, None, app, limits, "test"));
            addr
        });
        let silent: Vec<std::net::TcpStream> = (0..40)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let started = std::time::Instant::now();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
            "{answer}"
        );
        // Ten rounds of four silent connections closed at their header timeout.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(15), "answered after {took:?}");
        // The silent connections were closed by the listener, not left open.
        for mut c in silent {
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut buf = [0u8; 256];
            let n = c.read(&mut buf).unwrap_or(0);
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
        }
    }
}
