//! The HTTP client of scrapes, model discovery and `balancer report`: reqwest (hyper
//! underneath) with a connection pool, so a backend scraped every interval keeps one
//! keep-alive connection instead of a new TCP connection per page; gzip and chunked answers
//! are decoded; each exchange is bounded in time and body size. HTTPS through rustls (the
//! ring provider, as the etcd client's): a CA file or the system's roots, an optional client
//! certificate, and a bearer token from a file. Why reqwest rather than hyper alone: pooling,
//! timeouts, decompression and TLS in one maintained crate.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::base::config::ScrapeAccess;
use crate::base::error_text::error_chain;
use crate::base::tls;

/// Why a probe of a backend gave no success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// It failed: counts against the backend.
    Failed(String),
    /// It could not be made for a shortage on this host (descriptors, buffers, memory, local
    /// ports): says nothing of the backend.
    NotMade(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Failed(why) => f.write_str(why),
            ProbeError::NotMade(why) => write!(f, "{why} (a shortage on this host)"),
        }
    }
}

/// Whether an I/O error is this host running short (descriptors, buffers, memory, local
/// ports) rather than anything the peer did.
pub fn is_local_io_shortage(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL)
    )
}

/// Whether an error, or any error it wraps, is [`is_local_io_shortage`].
fn is_local_shortage(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(is_local_io_shortage)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The names of the settings a client was made from, for error messages.
#[derive(Clone, Copy, Debug)]
pub struct AccessNames {
    pub tls: tls::Settings,
    pub token: &'static str,
}

impl AccessNames {
    /// A VIP's `telemetry` (scrapes).
    pub const TELEMETRY: AccessNames = AccessNames {
        tls: tls::Settings {
            ca: "telemetry.ca",
            cert: "telemetry.cert",
            key: "telemetry.key",
        },
        token: "telemetry.bearer_token_file",
    };
    /// A `[[pool]]` (model discovery).
    pub const POOL: AccessNames = AccessNames {
        tls: tls::Settings {
            ca: "pool.ca",
            cert: "pool.cert",
            key: "pool.key",
        },
        token: "pool.bearer_token_file",
    };
}

/// A pooled client for GETs of small pages (metrics, model lists). Its `Debug` leaves the
/// token out.
#[derive(Clone)]
pub struct HttpClient {
    client: reqwest::Client,
    scheme: &'static str,
    /// `Bearer <token>`, when a token file is set.
    authorization: Option<String>,
    /// The token's setting, named when a page wants credentials.
    token_setting: &'static str,
    /// The URLs of the pages fetched so far, parsed once: a page is fetched every interval,
    /// and parsing its URL (a vLLM page's is long, with its `name[]` filter) was a good part of
    /// the client's own work.
    urls: std::sync::Arc<std::sync::Mutex<Urls>>,
}

/// Parsed URLs by address and path (and query).
type Urls = std::collections::HashMap<SocketAddr, std::collections::HashMap<String, reqwest::Url>>;

/// More pages than this in the cache of parsed URLs starts it afresh (a scrape's pages are a
/// handful per backend; only a long churn of backends could reach it).
const MAX_CACHED_URLS: usize = 4096;

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("scheme", &self.scheme)
            .field("token", &self.authorization.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A plain-HTTP client.
    pub fn new() -> Result<HttpClient, String> {
        HttpClient::with_access(&ScrapeAccess::default(), &AccessNames::TELEMETRY)
    }

    /// A client reaching pages as `access` says; its files are read now, and an unreadable
    /// or unusable one is an error naming it.
    pub fn with_access(access: &ScrapeAccess, names: &AccessNames) -> Result<HttpClient, String> {
        let mut builder = base_builder()
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(2);
        if access.https {
            let identity = access
                .identity
                .as_ref()
                .map(|(c, k)| (c.as_path(), k.as_path()));
            builder = builder.use_preconfigured_tls(tls::client_config(
                access.ca.as_deref(),
                identity,
                names.tls,
            )?);
        } else {
            builder = builder.use_preconfigured_tls(tls::plain_http_client_config()?);
        }
        let client = builder
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let authorization = match &access.bearer_token_file {
            None => None,
            Some(path) => {
                let token = crate::base::files::read_secret(path)
                    .map_err(|e| format!("reading {} {}: {e}", names.token, path.display()))?;
                let token = token.trim();
                if token.is_empty() || token.chars().any(|c| c.is_control() || c == ' ') {
                    return Err(format!(
                        "{} {}: not one token (empty, or spaces inside)",
                        names.token,
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
            token_setting: names.token,
            urls: Default::default(),
        })
    }

    /// A client for health checks: a new connection per probe (a pooled one would hide a
    /// backend that stopped accepting), HTTPS when `https`, trusting `ca` (`health.ca`) or the
    /// system's roots.
    pub fn for_health(https: bool, ca: Option<&Path>) -> Result<HttpClient, String> {
        let mut builder = base_builder().pool_max_idle_per_host(0);
        if https {
            builder = builder.use_preconfigured_tls(tls::client_config(
                ca,
                None,
                tls::Settings {
                    ca: "health.ca",
                    cert: "health.cert",
                    key: "health.key",
                },
            )?);
        } else {
            builder = builder.use_preconfigured_tls(tls::plain_http_client_config()?);
        }
        let client = builder
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(HttpClient {
            client,
            scheme: if https { "https" } else { "http" },
            authorization: None,
            token_setting: "",
            urls: Default::default(),
        })
    }

    /// The status of `GET path` from `addr` within `timeout` (the body is not read).
    pub async fn status(
        &self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<u16, ProbeError> {
        let url = format!("{}://{addr}{path}", self.scheme);
        let attempt = async {
            let response = self.client.get(&url).send().await.map_err(|e| {
                if is_local_shortage(&e) {
                    ProbeError::NotMade(error_chain(&e))
                } else {
                    ProbeError::Failed(error_chain(&e))
                }
            })?;
            Ok(response.status().as_u16())
        };
        tokio::time::timeout(timeout, attempt).await.map_err(|_| {
            ProbeError::Failed(format!("no answer within {} ms", timeout.as_millis()))
        })?
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
        // Errors name the page, not a long query (as the `name[]` filter of a vLLM page).
        let page = || match path.split_once('?') {
            Some((page, _)) => format!("{page}?..."),
            None => path.to_string(),
        };
        let shown = || format!("{}://{addr}{}", self.scheme, page());
        let url = self
            .url(addr, path)
            .map_err(|e| format!("{}: {e}", shown()))?;
        let attempt = async {
            let mut request = self.client.get(url).header("accept", "text/plain");
            if let Some(auth) = &self.authorization {
                request = request.header("authorization", auth);
            }
            let mut response = request
                .send()
                .await
                .map_err(|e| format!("{}: {}", shown(), error_chain(&e)))?;
            let status = response.status().as_u16();
            if status == 401 || status == 403 {
                let hint = if self.authorization.is_some() {
                    "the bearer token was refused".to_string()
                } else {
                    format!("it wants credentials: set {}", self.token_setting)
                };
                return Err(format!("{} answered status {status} ({hint})", shown()));
            }
            if status != 200 {
                return Err(format!("{} answered status {status}", shown()));
            }
            // Sized once when the length is known (a chunked page grows as it comes).
            let known = response.content_length().unwrap_or(0).min(max_body as u64);
            let mut body = Vec::with_capacity(known as usize);
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| format!("{addr}{}: {}", page(), error_chain(&e)))?
            {
                if body.len() + chunk.len() > max_body {
                    return Err(format!(
                        "page from {addr}{} larger than {max_body} bytes",
                        page()
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            String::from_utf8(body).map_err(|_| format!("page from {addr}{} is not UTF-8", page()))
        };
        tokio::time::timeout(timeout, attempt).await.map_err(|_| {
            format!(
                "{addr}{}: no complete answer within {} ms",
                page(),
                timeout.as_millis()
            )
        })?
    }

    /// The URL of `path` at `addr`, parsed the first time it is asked for.
    fn url(&self, addr: SocketAddr, path: &str) -> Result<reqwest::Url, String> {
        let mut urls = self.urls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(url) = urls.get(&addr).and_then(|pages| pages.get(path)) {
            return Ok(url.clone());
        }
        let url = reqwest::Url::parse(&format!("{}://{addr}{path}", self.scheme))
            .map_err(|e| format!("not a valid URL: {e}"))?;
        if urls.values().map(|pages| pages.len()).sum::<usize>() >= MAX_CACHED_URLS {
            urls.clear();
        }
        urls.entry(addr)
            .or_default()
            .insert(path.to_string(), url.clone());
        Ok(url)
    }
}

/// What every client shares: no proxy, no redirects, no Nagle delay; the ring provider.
fn base_builder() -> reqwest::ClientBuilder {
    tls::install_default_provider();
    reqwest::Client::builder()
        .user_agent("balancer")
        .no_proxy()
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
}
