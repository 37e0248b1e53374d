//! The project's own load: closed-loop workers for new connections, keep-alive requests and UDP
//! request/reply, each on a thread.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Load {
    Connections,
    KeepAlive,
    Udp,
}

/// Runs one phase from the client namespace: (operations per second, errors, latencies µs).
pub(super) fn run_phase(
    topo: &Topology,
    opts: &Options,
    targets: &[IpAddr],
    load: Load,
) -> Result<(f64, u64, Vec<u32>)> {
    let duration = Duration::from_secs_f64(opts.seconds);
    let workers = match load {
        Load::Udp => opts.udp_sockets,
        _ => opts.connections,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin_cpu = opts.pin.then_some(cpus - 1);
    let window = opts.udp_window;
    let start = Instant::now() + Duration::from_millis(50);
    let mut handles = Vec::new();
    for w in 0..workers {
        // Worker w starts on target w and (new connections) rotates through them.
        let mut targets = targets.to_vec();
        let first = w % targets.len();
        targets.rotate_left(first);
        handles.push(topo.client.spawn_in(move || {
            if let Some(cpu) = pin_cpu {
                pin_thread(cpu);
            }
            while Instant::now() < start {
                std::thread::sleep(Duration::from_millis(1));
            }
            let until = start + duration;
            match load {
                Load::Connections => connections(&targets, until),
                Load::KeepAlive => keepalive(targets[0], until),
                Load::Udp => udp(targets[0], until, window, w),
            }
        })?);
    }
    let (mut ops, mut errors, mut lat) = (0u64, 0u64, Vec::new());
    for h in handles {
        let w = h
            .join()
            .map_err(|_| anyhow::anyhow!("a generator thread panicked"))???;
        ops += w.ops;
        errors += w.errors;
        lat.extend(w.latencies_us);
    }
    Ok((ops as f64 / duration.as_secs_f64(), errors, lat))
}

#[derive(Default)]
pub(super) struct Worker {
    ops: u64,
    errors: u64,
    latencies_us: Vec<u32>,
}

pub(super) const REQUEST_CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n";

pub(super) const REQUEST_KEEP: &[u8] = b"GET / HTTP/1.1\r\nHost: vip\r\n\r\n";

pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// One request per connection until `until`, to each of `targets` in turn.
pub(super) fn connections(targets: &[IpAddr], until: Instant) -> Result<Worker> {
    let mut w = Worker::default();
    let mut buf = [0u8; 1024];
    for target in targets.iter().cycle() {
        if Instant::now() >= until {
            break;
        }
        let addr = SocketAddr::new(*target, HTTP_PORT);
        let t = Instant::now();
        let ok = (|| -> std::io::Result<bool> {
            let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_nodelay(true)?;
            s.write_all(REQUEST_CLOSE)?;
            let mut got = Vec::new();
            loop {
                match s.read(&mut buf)? {
                    0 => break,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
            Ok(got.starts_with(b"HTTP/1.1 200"))
        })();
        match ok {
            Ok(true) => {
                w.ops += 1;
                w.latencies_us.push(t.elapsed().as_micros() as u32);
            }
            _ => w.errors += 1,
        }
    }
    Ok(w)
}

/// Requests on one keep-alive connection until `until` (reconnecting after an error).
pub(super) fn keepalive(target: IpAddr, until: Instant) -> Result<Worker> {
    let addr = SocketAddr::new(target, HTTP_PORT);
    let mut w = Worker::default();
    while Instant::now() < until {
        let Ok(mut s) = TcpStream::connect_timeout(&addr, IO_TIMEOUT) else {
            w.errors += 1;
            continue;
        };
        let _ = s.set_read_timeout(Some(IO_TIMEOUT));
        let _ = s.set_nodelay(true);
        let mut pending = Vec::with_capacity(1024);
        let mut buf = [0u8; 1024];
        while Instant::now() < until {
            let t = Instant::now();
            if s.write_all(REQUEST_KEEP).is_err() {
                w.errors += 1;
                break;
            }
            match read_response(&mut s, &mut pending, &mut buf) {
                Ok(()) => {
                    w.ops += 1;
                    w.latencies_us.push(t.elapsed().as_micros() as u32);
                }
                Err(_) => {
                    w.errors += 1;
                    break;
                }
            }
        }
        let _ = s.shutdown(Shutdown::Both);
    }
    Ok(w)
}

/// Reads one HTTP response (head with Content-Length, then the body).
pub(super) fn read_response(
    s: &mut TcpStream,
    pending: &mut Vec<u8>,
    buf: &mut [u8],
) -> std::io::Result<()> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| std::io::Error::other("no content-length"))?;
            let total = end + 4 + length;
            if pending.len() >= total {
                if !pending.starts_with(b"HTTP/1.1 200") {
                    return Err(std::io::Error::other("not 200"));
                }
                pending.drain(..total);
                return Ok(());
            }
        }
        match s.read(buf)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// Small datagrams with `window` in flight; a reply releases the next one. Lost ones are
/// counted as errors when the socket goes quiet.
pub(super) fn udp(target: IpAddr, until: Instant, window: usize, worker: usize) -> Result<Worker> {
    let sock = UdpSocket::bind(SocketAddr::new(CLIENT4.into(), 0))?;
    sock.connect(SocketAddr::new(target, UDP_PORT))?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let payload = format!("e2e-{worker:04}-0123456789abcdef");
    let mut w = Worker::default();
    let mut buf = [0u8; 256];
    let mut in_flight = 0usize;
    while Instant::now() < until {
        while in_flight < window {
            sock.send(payload.as_bytes())?;
            in_flight += 1;
        }
        match sock.recv(&mut buf) {
            Ok(_) => {
                w.ops += 1;
                in_flight -= 1;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                w.errors += in_flight as u64;
                in_flight = 0;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(w)
}

pub(super) fn pin_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET and sched_setaffinity on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
