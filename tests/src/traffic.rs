//! Client-side traffic used by the tests and the demo: HTTP requests (one connection each),
//! UDP request/response, and a bidirectional TCP stream with verified bytes. Call these from
//! inside the client namespace (`Netns::run_in`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

/// One HTTP GET on a fresh connection; returns the body (the backend's name).
pub fn http_get(addr: SocketAddr, timeout: Duration) -> Result<String> {
    get_name(connect(addr, timeout)?, addr, timeout)
}

/// Sends `GET /` on `stream` and returns the body of a 200 answer (the backend's name).
fn get_name(mut stream: TcpStream, addr: SocketAddr, timeout: Duration) -> Result<String> {
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

/// `GET path` on a fresh connection; the body, whatever the status.
pub fn http_get_path(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String> {
    http_get_status(addr, path, timeout).map(|(_, body)| body)
}

/// `GET path` on a fresh connection; the status code and the body.
pub fn http_get_status(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let mut stream = connect(addr, timeout)?;
    stream.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .with_context(|| format!("malformed HTTP reply from {addr}{path}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in the reply from {addr}{path}: {head:?}"))?;
    Ok((status, body.to_string()))
}

/// One HTTP GET on a fresh connection from the local address `src` (which must be assigned
/// to an interface of the namespace); returns the body.
pub fn http_get_from(src: std::net::IpAddr, addr: SocketAddr, timeout: Duration) -> Result<String> {
    use socket2::{Domain, Socket, Type};
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let socket = Socket::new(domain, Type::STREAM, None)?;
    socket
        .bind(&SocketAddr::new(src, 0).into())
        .with_context(|| format!("bind {src}"))?;
    socket
        .connect_timeout(&addr.into(), timeout)
        .with_context(|| format!("connect {addr} from {src}"))?;
    get_name(socket.into(), addr, timeout)
}

/// An open connection to an echo server (its greeting read): the backend's name and the
/// stream, kept open until dropped.
pub fn echo_open(addr: SocketAddr, timeout: Duration) -> Result<(String, TcpStream)> {
    let mut stream = connect(addr, timeout)?;
    let backend = read_greeting(&mut stream)?;
    Ok((backend, stream))
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

/// Reads the echo server's greeting: its name and a newline.
fn read_greeting(stream: &mut TcpStream) -> Result<String> {
    let mut name = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        stream
            .read_exact(&mut byte)
            .context("reading the echo server's greeting")?;
        name.push(byte[0]);
        if name.len() > 64 {
            bail!("echo server greeting too long");
        }
    }
    Ok(String::from_utf8_lossy(&name).trim().to_string())
}

fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let stream =
        TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// Sends `bytes` to an echo server on one connection while reading them back; fails unless
/// every byte returns intact. Returns the name of the backend that served it.
pub fn echo_stream(addr: SocketAddr, bytes: usize, timeout: Duration) -> Result<String> {
    let mut stream = connect(addr, timeout)?;
    let backend = read_greeting(&mut stream)?;
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
    let mut received = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while received < bytes {
        let n = match stream.read(&mut buf) {
            // A signal to this thread, not the connection's end: read again (`read` does not,
            // unlike `read_exact`).
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => r.with_context(|| format!("receiving after {received} bytes"))?,
        };
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
    Ok(backend)
}

/// A long-lived connection to an echo server that keeps data flowing until `until`, checking
/// every byte. Returns the backend's name and the bytes echoed.
pub fn echo_until(addr: SocketAddr, until: Instant, timeout: Duration) -> Result<(String, usize)> {
    let mut stream = connect(addr, timeout)?;
    let backend = read_greeting(&mut stream)?;
    let mut offset = 0usize;
    let mut chunk = vec![0u8; 8 * 1024];
    let mut back = vec![0u8; 8 * 1024];
    while Instant::now() < until {
        for (i, b) in chunk.iter_mut().enumerate() {
            *b = pattern_byte(offset + i);
        }
        stream
            .write_all(&chunk)
            .with_context(|| format!("sending to {backend} after {offset} bytes"))?;
        stream
            .read_exact(&mut back)
            .with_context(|| format!("echo from {backend} after {offset} bytes"))?;
        if back != chunk {
            bail!("echo from {backend} corrupted after {offset} bytes");
        }
        offset += chunk.len();
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok((backend, offset))
}
