//! Scraping a backend's metrics pages: HTTP/1.1 GET (kept alive between intervals) with a
//! timeout and a cap on the page size.
//! A failure (no answer, bad status, oversized or malformed page) is an error for the caller to
//! count, never a crash.

use std::net::SocketAddr;
use std::time::Duration;

use super::exposition;
use super::signals::{Signals, extract};
use crate::http_client::HttpClient;

/// `GET path` from `addr`; the body, at most `max_body` bytes, on the process's pooled client
/// (one keep-alive connection per backend page between intervals, per thread).
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<String, String> {
    // One client per thread: a pooled connection belongs to the runtime that opened it, and
    // tests run one runtime per thread; the daemon's few worker threads share its runtime.
    thread_local! {
        static CLIENT: Result<HttpClient, String> = HttpClient::new();
    }
    let client = CLIENT.with(|c| c.clone())?;
    client.get(addr, path, timeout, max_body).await
}

/// Scrapes every page of a backend through `client` (plain or HTTPS, with its token) and
/// merges their signals (the first page wins a conflict).
pub async fn scrape(
    client: &HttpClient,
    address: std::net::IpAddr,
    pages: &[(u16, String)],
    timeout: Duration,
    max_body: usize,
) -> Result<Signals, String> {
    let mut merged: Option<Signals> = None;
    for (port, path) in pages {
        let page = client
            .get(SocketAddr::new(address, *port), path, timeout, max_body)
            .await?;
        let samples = exposition::parse(&page)
            .map_err(|e| format!("{}{path}: {e}", SocketAddr::new(address, *port)))?;
        let signals = extract(&samples);
        match &mut merged {
            Some(m) => m.merge(signals),
            None => merged = Some(signals),
        }
    }
    merged.ok_or_else(|| "no pages to scrape".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_client::AccessNames;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_real_vllm_page_as_vllm_serves_it() {
        let page = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/metrics/vllm-0.32.0-queueing.prom"),
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let body = page.clone();
        let server = tokio::spawn(async move {
            // As uvicorn answers: the Prometheus 1.0.0 text type, sized, then chunked.
            let head = "HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: text/plain; version=1.0.0; charset=utf-8\r\n";
            let replies = [
                format!("{head}content-length: {}\r\n\r\n{body}", body.len()),
                format!(
                    "{head}transfer-encoding: chunked\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
                    body.len() / 2,
                    &body[..body.len() / 2],
                    body.len() - body.len() / 2,
                    &body[body.len() / 2..]
                ),
            ];
            for reply in replies {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                s.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        let pages = [(addr.port(), "/metrics".to_string())];
        let client = HttpClient::new().unwrap();
        let want = extract(&exposition::parse(&page).unwrap());
        for _ in 0..2 {
            let got = scrape(&client, addr.ip(), &pages, Duration::from_secs(2), 1 << 20)
                .await
                .unwrap();
            assert_eq!(got, want);
            assert_eq!((got.running, got.waiting), (Some(4.0), Some(4.0)));
        }
        server.await.unwrap();
    }

    #[tokio::test]
    async fn bad_pages_are_errors() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for reply in [
                "HTTP/1.1 200 OK\r\nContent-Length: 27\r\n\r\nvllm:num_requests_running 3",
                "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n",
                "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot valid",
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                s.write_all(reply.as_bytes()).await.unwrap();
            }
            // One that never answers.
            let (_s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
        });
        let pages = [(addr.port(), "/metrics".to_string())];
        let client = HttpClient::new().unwrap();
        let t = Duration::from_millis(300);
        let ok = scrape(&client, addr.ip(), &pages, t, 1024).await.unwrap();
        assert_eq!(ok.running, Some(3.0));
        assert!(
            scrape(&client, addr.ip(), &pages, t, 1024)
                .await
                .unwrap_err()
                .contains("status 500")
        );
        assert!(
            scrape(&client, addr.ip(), &pages, t, 1024)
                .await
                .unwrap_err()
                .contains("line 1")
        );
        assert!(
            scrape(&client, addr.ip(), &pages, t, 1024)
                .await
                .unwrap_err()
                .contains("no complete answer")
        );
        server.abort();
    }

    /// An HTTPS metrics endpoint behind a bearer token, as a gateway in front of vLLM serves
    /// it: a certificate for 127.0.0.1 from a CA made here, gzip pages, keep-alive.
    struct HttpsEndpoint {
        addr: SocketAddr,
        dir: std::path::PathBuf,
        connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    async fn https_endpoint(page: &'static str, token: &'static str) -> HttpsEndpoint {
        use rustls::pki_types::pem::PemObject as _;
        use std::io::Write as _;
        let pki = crate::tls::test_pki::Pki::new(&format!("scrape-{}", page.len()));
        let other = crate::tls::test_pki::Pki::new(&format!("scrape-other-{}", page.len()));
        let dir = pki.dir.clone();
        let (cert_pem, key_pem) = pki.leaf("127.0.0.1", false);
        std::fs::write(dir.join("ca.pem"), &pki.ca_pem).unwrap();
        std::fs::write(dir.join("other-ca.pem"), &other.ca_pem).unwrap();
        let _ = std::fs::remove_dir_all(&other.dir);
        std::fs::write(dir.join("token"), format!("{token}\n")).unwrap();
        std::fs::write(dir.join("wrong-token"), "not-it\n").unwrap();
        let chain =
            vec![rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap()];
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(page.as_bytes()).unwrap();
        let body = gz.finish().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, body) = (acceptor.clone(), body.clone());
                let counted = counted.clone();
                tokio::spawn(async move {
                    // A client that refused the certificate never gets here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mut request = Vec::new();
                    let mut buf = [0u8; 2048];
                    loop {
                        let Ok(n) = tls.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        request.extend_from_slice(&buf[..n]);
                        let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                        request.drain(..end + 4);
                        let authorized = head.contains(&format!("authorization: bearer {token}"));
                        let reply = if authorized {
                            let mut r = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend_from_slice(&body);
                            r
                        } else {
                            b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n".to_vec()
                        };
                        if tls.write_all(&reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        HttpsEndpoint {
            addr,
            dir,
            connections,
        }
    }

    #[tokio::test]
    async fn https_scrapes_verify_the_certificate_send_the_token_and_keep_the_connection() {
        let page = "vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n";
        let e = https_endpoint(page, "s3cret-token").await;
        let pages = [(e.addr.port(), "/metrics".to_string())];
        let t = Duration::from_secs(2);
        let access = |ca: &str, token: Option<&str>| crate::config::ScrapeAccess {
            https: true,
            ca: Some(e.dir.join(ca)),
            identity: None,
            bearer_token_file: token.map(|f| e.dir.join(f)),
        };
        let client =
            HttpClient::with_access(&access("ca.pem", Some("token")), &AccessNames::TELEMETRY)
                .unwrap();
        for _ in 0..3 {
            let s = scrape(&client, e.addr.ip(), &pages, t, 1 << 20)
                .await
                .unwrap();
            assert_eq!((s.running, s.waiting), (Some(3.0), Some(1.0)));
        }
        // Three gzip pages over one kept-alive TLS connection.
        assert_eq!(e.connections.load(std::sync::atomic::Ordering::SeqCst), 1);

        let err = |access: crate::config::ScrapeAccess| {
            let pages = pages.clone();
            async move {
                let client = HttpClient::with_access(&access, &AccessNames::TELEMETRY)?;
                scrape(&client, e.addr.ip(), &pages, t, 1 << 20).await
            }
        };
        let wrong = err(access("ca.pem", Some("wrong-token")))
            .await
            .unwrap_err();
        assert!(
            wrong.contains("401") && wrong.contains("token was refused"),
            "{wrong}"
        );
        let none = err(access("ca.pem", None)).await.unwrap_err();
        assert!(none.contains("set telemetry.bearer_token_file"), "{none}");
        let other = err(access("other-ca.pem", Some("token")))
            .await
            .unwrap_err();
        assert!(other.contains("certificate"), "{other}");
        let missing = err(access("no-such-ca.pem", Some("token")))
            .await
            .unwrap_err();
        assert!(
            missing.contains("telemetry.ca") && missing.contains("no-such-ca.pem"),
            "{missing}"
        );
        let plain = HttpClient::new().unwrap();
        assert!(
            scrape(&plain, e.addr.ip(), &pages, t, 1 << 20)
                .await
                .is_err()
        );
        let _ = std::fs::remove_dir_all(&e.dir);
    }
}
