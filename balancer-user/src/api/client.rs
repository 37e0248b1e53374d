//! The CLI's client for the control API: HTTP/1.1 with JSON bodies over the daemon's Unix
//! socket, or over TCP with a bearer token. Blocking, one request per connection.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::types::ErrorBody;

/// Where the daemon listens.
#[derive(Clone, Debug)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp { addr: String, token: String },
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the daemon at {target}: {source} (is `balancer run` running?)")]
    Connect {
        target: String,
        #[source]
        source: std::io::Error,
    },
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
        let connect = |e| ClientError::Connect {
            target: self.describe(),
            source: e,
        };
        let mut stream: Box<dyn ReadWrite> = match &self.endpoint {
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path).map_err(connect)?;
                s.set_read_timeout(Some(self.timeout)).map_err(connect)?;
                Box::new(s)
            }
            Endpoint::Tcp { addr, .. } => {
                let s = std::net::TcpStream::connect(addr).map_err(connect)?;
                s.set_read_timeout(Some(self.timeout)).map_err(connect)?;
                Box::new(s)
            }
        };
        let body = body.unwrap_or_default();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: balancer\r\nConnection: close\r\nAccept: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        if !body.is_empty() {
            request.push_str("Content-Type: application/json\r\n");
        }
        if let Endpoint::Tcp { token, .. } = &self.endpoint {
            request.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        request.push_str("\r\n");
        let io = |e: std::io::Error| ClientError::Protocol(e.to_string());
        // The daemon may answer (413, 400) and close before the whole body is sent: keep the
        // write error, but read the answer first.
        let written = stream
            .write_all(request.as_bytes())
            .and_then(|()| stream.write_all(body));
        let mut reply = Vec::new();
        let read = stream.read_to_end(&mut reply);
        if reply.is_empty() {
            written.map_err(io)?;
            read.map_err(io)?;
        }
        parse_response(&reply)
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

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Splits an HTTP/1.1 response into status and body (Content-Length or chunked).
fn parse_response(reply: &[u8]) -> Result<(u16, Vec<u8>), ClientError> {
    let end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| ClientError::Protocol("no HTTP header in the answer".into()))?;
    let head = String::from_utf8_lossy(&reply[..end]);
    let status: u16 = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ClientError::Protocol(format!("bad status line in {head:?}")))?;
    let body = &reply[end + 4..];
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    if !chunked {
        return Ok((status, body.to_vec()));
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| ClientError::Protocol("truncated chunked body".into()))?;
        let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..line_end]).trim(), 16)
            .map_err(|_| ClientError::Protocol("bad chunk size".into()))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok((status, out));
        }
        if rest.len() < size + 2 {
            return Err(ClientError::Protocol("truncated chunk".into()));
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_answers() {
        let plain = b"HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(parse_response(plain).unwrap(), (404, b"hello".to_vec()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (200, b"abcde".to_vec()));
        assert!(parse_response(b"garbage").is_err());
    }
}
