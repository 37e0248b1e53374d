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

use crate::config::ApiTls;
use crate::tls;

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

/// Serves `app` in TLS on `listener` until the task is dropped.
pub async fn serve_tls(listener: TcpListener, config: Arc<rustls::ServerConfig>, app: Router) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!("API listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::info!(%peer, "API listener: TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::info!(%peer, "API listener: no TLS handshake within 10 s");
                    return;
                }
            };
            let service = TowerToHyperService::new(app);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, "API connection: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::client::{Client, ClientTls, Endpoint};
    use crate::tls::test_pki::{Pki, write};

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
            let app = crate::api::server::token_guard(
                Router::new().route(
                    "/v1/status",
                    axum::routing::get(|| async { axum::Json(serde_json::json!({"ok": true})) }),
                ),
                token.clone(),
            );
            tokio::spawn(serve_tls(listener, server_config(&files).unwrap(), app));
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
}
