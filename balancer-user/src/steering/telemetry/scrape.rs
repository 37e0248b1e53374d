//! Scraping a backend's metrics pages: HTTP/1.1 GET (kept alive between intervals) with a
//! timeout and a cap on the page size.
//! A failure (no answer, bad status, oversized or malformed page) is an error for the caller to
//! count, never a crash.

use std::net::SocketAddr;
use std::time::Duration;

use super::page;
use super::signals::{Signals, Valid, extract, is_vllm, vllm_query};
use crate::base::http_client::HttpClient;

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

/// What the loop knows of each page (by address and path) that was vLLM's: whether to ask it
/// for only the samples the signals read ([`vllm_query`]). A page seen to be vLLM's is asked
/// so from the next scrape on; one that answers such a request with anything but a vLLM page
/// (an error, another page) is asked for whole at once, and from then on; a page that stops
/// being vLLM's is asked for whole again.
#[derive(Debug, Default)]
pub struct VllmPages(std::sync::Mutex<std::collections::HashMap<(SocketAddr, String), Filter>>);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Filter {
    /// vLLM's page: ask for the samples read.
    Use,
    /// The server did not answer the filtered request with its page: never again.
    Refused,
}

impl VllmPages {
    fn filters(&self, addr: SocketAddr, path: &str) -> bool {
        !path.contains('?')
            && self
                .0
                .lock()
                .is_ok_and(|p| p.get(&(addr, path.to_string())) == Some(&Filter::Use))
    }

    fn seen(&self, addr: SocketAddr, path: &str, vllm: bool) {
        if let Ok(mut p) = self.0.lock() {
            let key = (addr, path.to_string());
            match (vllm, p.get(&key)) {
                (_, Some(Filter::Refused)) => {}
                (true, _) => {
                    p.insert(key, Filter::Use);
                }
                (false, _) => {
                    p.remove(&key);
                }
            }
        }
    }

    fn refused(&self, addr: SocketAddr, path: &str) {
        if let Ok(mut p) = self.0.lock() {
            p.insert((addr, path.to_string()), Filter::Refused);
        }
    }
}

/// Scrapes every page of a backend through `client` (plain or HTTPS, with its token) and
/// merges their signals (the first page wins a conflict). A page `vllm` knows to be vLLM's
/// is asked for only the samples read. A page whose figures are out of range
/// ([`Signals::validate`]) is an error naming the page and the figure.
pub async fn scrape(
    client: &HttpClient,
    address: std::net::IpAddr,
    pages: &[(u16, String)],
    vllm: &VllmPages,
    timeout: Duration,
    max_body: usize,
) -> Result<Valid, String> {
    let mut merged: Option<Signals> = None;
    for (port, path) in pages {
        let addr = SocketAddr::new(address, *port);
        let mut filtered = None;
        if vllm.filters(addr, path) {
            let url = format!("{path}{}", vllm_query());
            let answer = client.get(addr, &url, timeout, max_body).await;
            let signals = answer.ok().and_then(|page| {
                let samples = page::parse(&page).ok()?;
                is_vllm(&samples).then(|| extract(&samples))
            });
            if signals.is_none() {
                tracing::info!(page = %format!("{addr}{path}"), "the page did not answer a request for the samples read with vLLM's page; reading it whole from now on");
                vllm.refused(addr, path);
            }
            filtered = signals;
        }
        let signals = match filtered {
            Some(s) => s,
            None => {
                let page = client.get(addr, path, timeout, max_body).await?;
                let samples = page::parse(&page).map_err(|e| format!("{addr}{path}: {e}"))?;
                vllm.seen(addr, path, is_vllm(&samples));
                extract(&samples)
            }
        };
        let signals = signals
            .validate()
            .map_err(|e| format!("{addr}{path}: {e}"))?
            .into_inner();
        match &mut merged {
            Some(m) => m.merge(signals),
            None => merged = Some(signals),
        }
    }
    merged
        .ok_or_else(|| "no pages to scrape".to_string())?
        .validate()
        .map_err(|e| format!("the pages together: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::http_client::AccessNames;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `times` scrapes of `addr`'s `/metrics` as one loop makes them (one client, one memory
    /// of vLLM pages); each must succeed.
    async fn scrapes_of_one_loop(addr: SocketAddr, times: usize) -> Vec<Signals> {
        let pages = [(addr.port(), "/metrics".to_string())];
        let client = HttpClient::new().unwrap();
        let vllm = VllmPages::default();
        let mut out = Vec::new();
        for _ in 0..times {
            let t = Duration::from_secs(2);
            out.push(
                scrape(&client, addr.ip(), &pages, &vllm, t, 1 << 20)
                    .await
                    .unwrap()
                    .into_inner(),
            );
        }
        out
    }

    /// A metrics fixture's text, and a listener on a loopback port to serve it.
    async fn fixture_and_listener(name: &str) -> (String, tokio::net::TcpListener, SocketAddr) {
        let page = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/metrics")
                .join(name),
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (page, listener, addr)
    }

    /// One scrape by a loop that knows no vLLM page yet, pages up to 1 MiB.
    async fn scrape_afresh(
        client: &HttpClient,
        ip: std::net::IpAddr,
        pages: &[(u16, String)],
        timeout: Duration,
    ) -> Result<Valid, String> {
        scrape(client, ip, pages, &VllmPages::default(), timeout, 1 << 20).await
    }

    /// Reads a request's head from `s`; its first line.
    async fn request_line(s: &mut tokio::net::TcpStream) -> String {
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended early");
            request.extend_from_slice(&buf[..n]);
        }
        let request = String::from_utf8(request).unwrap();
        request.lines().next().unwrap().to_string()
    }

    #[tokio::test]
    async fn a_real_vllm_page_as_vllm_serves_it() {
        let (page, listener, addr) = fixture_and_listener("vllm-0.32.0-queueing.prom").await;
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
            let mut request_lines = Vec::new();
            for reply in replies {
                let (mut s, _) = listener.accept().await.unwrap();
                request_lines.push(request_line(&mut s).await);
                s.write_all(reply.as_bytes()).await.unwrap();
            }
            request_lines
        });
        let want = extract(&page::parse(&page).unwrap());
        for got in scrapes_of_one_loop(addr, 2).await {
            assert_eq!(got, want);
            assert_eq!((got.running, got.waiting), (Some(4.0), Some(4.0)));
        }
        // The first page showed a vLLM server: the second scrape asked for the samples read
        // (this server ignores the query and serves its whole page, which reads the same).
        let lines = server.await.unwrap();
        assert_eq!(lines[0], "GET /metrics HTTP/1.1");
        assert!(
            lines[1].starts_with(&format!("GET /metrics{} ", vllm_query())),
            "{}",
            lines[1]
        );
    }

    #[tokio::test]
    async fn a_server_that_refuses_the_filter_is_read_whole() {
        let (page, listener, addr) = fixture_and_listener("vllm-0.32.0-busy.prom").await;
        let whole = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{page}",
            page.len()
        );
        let server = tokio::spawn(async move {
            let mut request_lines = Vec::new();
            // The whole page; a 404 for the filtered request, then the whole page at once;
            // the whole page again (not asked with the filter any more).
            for _ in 0..4 {
                let (mut s, _) = listener.accept().await.unwrap();
                let line = request_line(&mut s).await;
                let reply = if line.contains('?') {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string()
                } else {
                    whole.clone()
                };
                request_lines.push(line);
                s.write_all(reply.as_bytes()).await.unwrap();
            }
            request_lines
        });
        let want = extract(&page::parse(&page).unwrap());
        for got in scrapes_of_one_loop(addr, 3).await {
            assert_eq!(got, want);
        }
        let lines = server.await.unwrap();
        let filtered: Vec<bool> = lines.iter().map(|l| l.contains('?')).collect();
        assert_eq!(filtered, [false, true, false, false], "{lines:?}");
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
        let ok = scrape(&client, addr.ip(), &pages, &VllmPages::default(), t, 1024)
            .await
            .unwrap();
        assert_eq!(ok.running, Some(3.0));
        assert!(
            scrape(&client, addr.ip(), &pages, &VllmPages::default(), t, 1024)
                .await
                .unwrap_err()
                .contains("status 500")
        );
        assert!(
            scrape(&client, addr.ip(), &pages, &VllmPages::default(), t, 1024)
                .await
                .unwrap_err()
                .contains("line 1")
        );
        assert!(
            scrape(&client, addr.ip(), &pages, &VllmPages::default(), t, 1024)
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
        let pki = crate::base::tls::test_pki::Pki::new(&format!("scrape-{}", page.len()));
        let other = crate::base::tls::test_pki::Pki::new(&format!("scrape-other-{}", page.len()));
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
        let config = rustls::ServerConfig::builder_with_provider(crate::base::tls::provider())
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
        let access = |ca: &str, token: Option<&str>| crate::base::config::ScrapeAccess {
            https: true,
            ca: Some(e.dir.join(ca)),
            identity: None,
            bearer_token_file: token.map(|f| e.dir.join(f)),
        };
        let client =
            HttpClient::with_access(&access("ca.pem", Some("token")), &AccessNames::TELEMETRY)
                .unwrap();
        for _ in 0..3 {
            let s = scrape_afresh(&client, e.addr.ip(), &pages, t)
                .await
                .unwrap();
            assert_eq!((s.running, s.waiting), (Some(3.0), Some(1.0)));
        }
        // Three gzip pages over one kept-alive TLS connection.
        assert_eq!(e.connections.load(std::sync::atomic::Ordering::SeqCst), 1);

        let err = |access: crate::base::config::ScrapeAccess| {
            let pages = pages.clone();
            async move {
                let client = HttpClient::with_access(&access, &AccessNames::TELEMETRY)?;
                scrape_afresh(&client, e.addr.ip(), &pages, t).await
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
        assert!(scrape_afresh(&plain, e.addr.ip(), &pages, t).await.is_err());
        let _ = std::fs::remove_dir_all(&e.dir);
    }
}
