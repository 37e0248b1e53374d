//! A backend server for tests and the demo: answers HTTP with its name, echoes TCP streams and
//! UDP datagrams (prefixed with its name). Listens on all addresses, so also on a VIP held on
//! `lo`; UDP answers come from the address the request was sent to, as the client expects.
//! With `--metrics-file`, `GET /metrics` serves that file as it is at the time of the request
//! (a simulated inference server's page that a test rewrites; 404 while the file is absent).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::thread;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Test backend: HTTP name server, TCP echo, UDP echo")]
struct Args {
    /// Name reported in every answer.
    #[arg(long)]
    name: String,
    /// HTTP port (any path answers 200 with the name).
    #[arg(long, default_value_t = 80)]
    http_port: u16,
    /// TCP echo port (the server first sends its name and a newline, then echoes).
    #[arg(long, default_value_t = 9000)]
    echo_port: u16,
    /// UDP echo port.
    #[arg(long, default_value_t = 5353)]
    udp_port: u16,
    /// Addresses to answer UDP on (a UDP reply must come from the address the client used).
    #[arg(long = "udp-addr")]
    udp_addrs: Vec<IpAddr>,
    /// File served at `/metrics` on the HTTP port.
    #[arg(long)]
    metrics_file: Option<PathBuf>,
    /// File listing (comma-separated) the models answered at `GET /v1/models` (OpenAI
    /// format); read at each request, none while absent.
    #[arg(long)]
    models_file: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let any = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let http = TcpListener::bind(SocketAddr::new(any, args.http_port)).expect("bind HTTP port");
    let echo = TcpListener::bind(SocketAddr::new(any, args.echo_port)).expect("bind echo port");
    let name = args.name.clone();
    let echo_name = name.clone();
    thread::spawn(move || serve(echo, move |s| echo_stream(s, &echo_name)));
    for addr in &args.udp_addrs {
        let sock = UdpSocket::bind(SocketAddr::new(*addr, args.udp_port))
            .unwrap_or_else(|e| panic!("bind UDP {addr}:{}: {e}", args.udp_port));
        let name = name.clone();
        thread::spawn(move || udp_echo(sock, &name));
    }
    eprintln!("test-backend {name} listening");
    let metrics = args.metrics_file.clone();
    let models = args.models_file.clone();
    serve(http, move |s| {
        http_session(s, &name, metrics.as_deref(), models.as_deref())
    });
}

fn serve(listener: TcpListener, handler: impl Fn(TcpStream) + Send + Sync + Clone + 'static) {
    for stream in listener.incoming().flatten() {
        let handler = handler.clone();
        thread::spawn(move || handler(stream));
    }
}

fn echo_stream(mut stream: TcpStream, name: &str) {
    if stream.write_all(format!("{name}\n").as_bytes()).is_err() {
        return;
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// Answers HTTP/1.1 requests on one connection until the client closes or asks to.
/// The OpenAI `GET /v1/models` answer for the models listed in `file`.
fn models_json(file: Option<&Path>) -> String {
    let listed = file
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default();
    let data: Vec<String> = listed
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| format!("{{\"id\":\"{m}\",\"object\":\"model\",\"owned_by\":\"test-backend\"}}"))
        .collect();
    format!("{{\"object\":\"list\",\"data\":[{}]}}", data.join(","))
}

fn http_session(mut stream: TcpStream, name: &str, metrics: Option<&Path>, models: Option<&Path>) {
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Some(end) = find(&pending, b"\r\n\r\n") else {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
            if pending.len() > 64 * 1024 {
                return;
            }
            continue;
        };
        let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
        pending.drain(..end + 4);
        let close = head.contains("connection: close") || head.starts_with("get / http/1.0");
        let wants_metrics = head.starts_with("get /metrics ");
        let (status, body) = match metrics {
            Some(file) if wants_metrics => match std::fs::read_to_string(file) {
                Ok(page) => ("200 OK", page),
                Err(e) => ("404 Not Found", format!("{}: {e}\n", file.display())),
            },
            _ if head.starts_with("get /v1/models ") => ("200 OK", models_json(models)),
            _ => ("200 OK", format!("{name}\n")),
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        if stream.write_all(reply.as_bytes()).is_err() || close {
            return;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn udp_echo(sock: UdpSocket, name: &str) {
    let mut buf = [0u8; 65536];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let mut reply = format!("{name}:").into_bytes();
        reply.extend_from_slice(&buf[..n]);
        let _ = sock.send_to(&reply, from);
    }
}
