//! One HTTP exchange over a fresh TCP connection, for the daemon's small clients (metrics
//! scrapes, etcd's JSON gateway): send a request that makes the server close the connection
//! after its answer (`Connection: close` or HTTP/1.0), read the answer up to a cap.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` to `addr` and reads the answer to its end: (status, body). An answer over
/// `max_answer` bytes, or one that is not HTTP, is an error. The caller bounds the time.
pub async fn exchange(
    addr: SocketAddr,
    request: &str,
    max_answer: usize,
) -> Result<(u16, Vec<u8>), String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
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
        if reply.len() > max_answer {
            return Err(format!("answer from {addr} larger than {max_answer} bytes"));
        }
    }
    split_response(&reply).ok_or_else(|| format!("no HTTP answer from {addr}"))
}

/// Status and body of an HTTP/1.1 response (plain or chunked).
pub fn split_response(reply: &[u8]) -> Option<(u16, Vec<u8>)> {
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
