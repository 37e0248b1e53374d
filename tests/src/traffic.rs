//! Client-side traffic used by the tests and the demo: HTTP requests (one connection each),
//! UDP request/response, and a bidirectional TCP stream with verified bytes. Call these from
//! inside the client namespace (`Netns::run_in`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

/// One HTTP GET on a fresh connection; returns the body (the backend's name).
pub fn http_get(addr: SocketAddr, timeout: Duration) -> Result<String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n")?;
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .with_context(|| format!("reading the reply from {addr}"))?;
    let Some((head, body)) = reply.split_once("\r\n\r\n") else {
        bail!("malformed HTTP reply from {addr}: {reply:?}");
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!("HTTP status from {addr}: {head:?}");
    }
    Ok(body.trim().to_string())
}

/// Sends one datagram and returns the reply text.
pub fn udp_request(addr: SocketAddr, payload: &str, timeout: Duration) -> Result<String> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let sock = UdpSocket::bind(bind)?;
    sock.connect(addr)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.send(payload.as_bytes())?;
    let mut buf = [0u8; 2048];
    let n = sock
        .recv(&mut buf)
        .with_context(|| format!("no UDP reply from {addr}"))?;
    Ok(String::from_utf8_lossy(&buf[..n]).to_string())
}

/// The byte at `offset` of a test stream: a pattern that exposes reordering and corruption.
pub fn pattern_byte(offset: usize) -> u8 {
    let x = offset as u64;
    (x.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (x >> 8) as u8
}

/// Sends `bytes` to an echo server on one connection while reading them back; fails unless
/// every byte returns intact.
pub fn echo_stream(addr: SocketAddr, bytes: usize, timeout: Duration) -> Result<()> {
    let stream =
        TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut writer = stream.try_clone()?;
    let sender = std::thread::spawn(move || -> Result<()> {
        let mut sent = 0;
        let mut chunk = vec![0u8; 16 * 1024];
        while sent < bytes {
            let n = chunk.len().min(bytes - sent);
            for (i, b) in chunk[..n].iter_mut().enumerate() {
                *b = pattern_byte(sent + i);
            }
            writer.write_all(&chunk[..n]).context("sending")?;
            sent += n;
        }
        writer.shutdown(std::net::Shutdown::Write)?;
        Ok(())
    });
    let mut reader = stream;
    let mut received = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while received < bytes {
        let n = reader
            .read(&mut buf)
            .with_context(|| format!("receiving after {received} bytes"))?;
        if n == 0 {
            bail!("connection closed after {received} of {bytes} bytes");
        }
        for (i, b) in buf[..n].iter().enumerate() {
            if *b != pattern_byte(received + i) {
                bail!(
                    "byte {} differs: got {b}, sent {}",
                    received + i,
                    pattern_byte(received + i)
                );
            }
        }
        received += n;
    }
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    Ok(())
}
