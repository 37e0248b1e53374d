//! The HTTP client of scrapes, model discovery and `balancer report`: reqwest (hyper
//! underneath) with a connection pool, so a backend scraped every interval keeps one
//! keep-alive connection instead of a new TCP connection per page; gzip answers are
//! decoded; each exchange is bounded in time and body size. Why reqwest rather than hyper
//! alone: pooling, timeouts and decompression (and TLS when it is wanted) in one maintained
//! crate.

use std::net::SocketAddr;
use std::time::Duration;

/// A pooled client for GETs of small pages (metrics, model lists).
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: reqwest::Client,
}

impl HttpClient {
    pub fn new() -> Result<HttpClient, String> {
        let client = reqwest::Client::builder()
            .user_agent("balancer")
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(2)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(HttpClient { client })
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
        let url = format!("http://{addr}{path}");
        let attempt = async {
            let mut response = self
                .client
                .get(&url)
                .header("accept", "text/plain")
                .send()
                .await
                .map_err(|e| format!("{addr}{path}: {}", describe(&e)))?;
            let status = response.status().as_u16();
            if status != 200 {
                return Err(format!("{addr}{path} answered status {status}"));
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
