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

/// Scrapes every page of a backend and merges their signals (the first page wins a conflict).
pub async fn scrape(
    address: std::net::IpAddr,
    pages: &[(u16, String)],
    timeout: Duration,
    max_body: usize,
) -> Result<Signals, String> {
    let mut merged: Option<Signals> = None;
    for (port, path) in pages {
        let page = http_get(SocketAddr::new(address, *port), path, timeout, max_body).await?;
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
        let want = extract(&exposition::parse(&page).unwrap());
        for _ in 0..2 {
            let got = scrape(addr.ip(), &pages, Duration::from_secs(2), 1 << 20)
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
        let t = Duration::from_millis(300);
        let ok = scrape(addr.ip(), &pages, t, 1024).await.unwrap();
        assert_eq!(ok.running, Some(3.0));
        assert!(
            scrape(addr.ip(), &pages, t, 1024)
                .await
                .unwrap_err()
                .contains("status 500")
        );
        assert!(
            scrape(addr.ip(), &pages, t, 1024)
                .await
                .unwrap_err()
                .contains("line 1")
        );
        assert!(
            scrape(addr.ip(), &pages, t, 1024)
                .await
                .unwrap_err()
                .contains("no complete answer")
        );
        server.abort();
    }
}
