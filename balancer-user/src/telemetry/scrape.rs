//! Scraping a backend's metrics pages: HTTP/1.1 GET with a timeout and a cap on the page size.
//! A failure (no answer, bad status, oversized or malformed page) is an error for the caller to
//! count, never a crash.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::exposition;
use super::signals::{Signals, extract};

/// `GET path` from `addr`; the body, at most `max_body` bytes.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<String, String> {
    let attempt = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let host = match addr {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: balancer-telemetry\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("send to {addr}: {e}"))?;
        let mut reply = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = stream
                .read(&mut buf)
                .await
                .map_err(|e| format!("read from {addr}: {e}"))?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
            if reply.len() > max_body + 16 * 1024 {
                return Err(format!(
                    "page from {addr}{path} larger than {max_body} bytes"
                ));
            }
        }
        let (status, body) =
            split_response(&reply).ok_or_else(|| format!("no HTTP answer from {addr}{path}"))?;
        if status != 200 {
            return Err(format!("{addr}{path} answered status {status}"));
        }
        if body.len() > max_body {
            return Err(format!(
                "page from {addr}{path} larger than {max_body} bytes"
            ));
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

/// Status and body of an HTTP/1.1 response (plain or chunked).
fn split_response(reply: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = reply.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&reply[..end]).to_ascii_lowercase();
    let status = head
        .lines()
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let body = &reply[end + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Some((status, body.to_vec()));
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some((status, out));
        }
        out.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
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
        let samples =
            exposition::parse(&page).map_err(|e| format!("{address}:{port}{path}: {e}"))?;
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

    #[test]
    fn responses_split() {
        assert_eq!(
            split_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
            Some((200, b"abc".to_vec()))
        );
        assert_eq!(
            split_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1;x=y\r\nc\r\n0\r\n\r\n"),
            Some((200, b"abc".to_vec()))
        );
        assert_eq!(
            split_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            None
        );
        assert_eq!(split_response(b"garbage"), None);
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
