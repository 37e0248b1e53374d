//! Independent load generators from Debian, so `bench e2e`'s ratios do not rest on the
//! project's own client alone: `wrk` for new TCP connections per second (one request per
//! connection, `Connection: close`), and `trafgen` (netsniff-ng) for small UDP packets at the
//! highest rate the machine sends them.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::netns::Netns;

/// What one `wrk` run reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WrkResult {
    pub requests_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Socket errors (connect, read, write, timeout) and non-2xx/3xx responses.
    pub errors: u64,
}

/// Runs `wrk` from `ns` against `http://target:port/` with `connections` connections (one
/// thread) for `seconds`, each request on a new connection.
pub fn wrk(
    ns: &Netns,
    target: IpAddr,
    port: u16,
    connections: usize,
    seconds: f64,
) -> Result<WrkResult> {
    let host = match target {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    };
    let url = format!("http://{host}:{port}/");
    let (c, d) = (
        connections.max(1).to_string(),
        format!("{}s", seconds.ceil().max(1.0)),
    );
    let out = ns.exec(&[
        "wrk",
        "-t1",
        "-c",
        &c,
        "-d",
        &d,
        "--latency",
        "-H",
        "Connection: close",
        &url,
    ])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "wrk failed ({}): {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_wrk(&text).with_context(|| format!("reading wrk's output:\n{text}"))
}

/// Reads wrk's report (with `--latency`).
pub fn parse_wrk(text: &str) -> Result<WrkResult> {
    let mut r = WrkResult::default();
    let mut rate = None;
    for line in text.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            rate = Some(v.trim().parse::<f64>().context("Requests/sec")?);
        } else if let Some(v) = line.strip_prefix("50%") {
            r.p50_us = duration_us(v.trim())?;
        } else if let Some(v) = line.strip_prefix("99%") {
            r.p99_us = duration_us(v.trim())?;
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for part in v.split(',') {
                if let Some(n) = part.split_whitespace().nth(1) {
                    r.errors += n.parse::<u64>().context("socket errors")?;
                }
            }
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            r.errors += v.trim().parse::<u64>().context("non-2xx responses")?;
        }
    }
    r.requests_per_s = rate.context("no Requests/sec line")?;
    Ok(r)
}

/// wrk's durations: "812.00us", "1.23ms", "2.00s".
fn duration_us(text: &str) -> Result<f64> {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .with_context(|| format!("a duration without a unit: {text:?}"))?;
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().with_context(|| format!("duration {text:?}"))?;
    Ok(match unit {
        "us" => n,
        "ms" => n * 1e3,
        "s" => n * 1e6,
        "m" => n * 60e6,
        other => bail!("duration unit {other:?} in {text:?}"),
    })
}

/// One kind of packet trafgen sends: to `dst` (an IPv4 address) through the next hop `mac`.
pub struct UdpTarget {
    pub mac: [u8; 6],
    pub dst: std::net::Ipv4Addr,
}

/// trafgen's packet configuration: one UDP packet per target (sent in turn), from `src` and
/// `src_mac`, to `port`, the source port counting up over 1024..65000 (so a balancer sees
/// many flows), `payload` bytes of payload; UDP checksums computed.
pub fn trafgen_config(
    src_mac: [u8; 6],
    src: std::net::Ipv4Addr,
    targets: &[UdpTarget],
    port: u16,
    payload: usize,
) -> String {
    let mac = |m: [u8; 6]| {
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    targets
        .iter()
        .map(|t| {
            format!(
                "{{\n  eth(da={}, sa={}),\n  ipv4(sa={src}, da={}, ttl=64),\n  udp(sp=dinc(1024, 65000), dp={port}),\n  fill(0x61, {payload})\n}}\n",
                mac(t.mac),
                mac(src_mac),
                t.dst
            )
        })
        .collect()
}

/// The host's default socket send buffer while it lives (restored when dropped).
struct SendBuffer {
    before: String,
}

const WMEM_DEFAULT: &str = "/proc/sys/net/core/wmem_default";

impl SendBuffer {
    fn raise(bytes: u64) -> Result<SendBuffer> {
        let before = std::fs::read_to_string(WMEM_DEFAULT)
            .with_context(|| format!("reading {WMEM_DEFAULT}"))?;
        std::fs::write(WMEM_DEFAULT, bytes.to_string())
            .with_context(|| format!("writing {WMEM_DEFAULT}"))?;
        Ok(SendBuffer { before })
    }
}

impl Drop for SendBuffer {
    fn drop(&mut self) {
        let _ = std::fs::write(WMEM_DEFAULT, self.before.trim());
    }
}

/// Runs trafgen in `ns` on `dev` with `config` (see [`trafgen_config`]) for `duration`, on one
/// CPU, through the qdisc.
///
/// trafgen's socket gets a 4 MiB send buffer: with the default 208 KiB, the few hundred small
/// frames a busy veth path holds exhaust it and trafgen gives up ("Flushing TX_RING failed:
/// Resource temporarily unavailable") long before any peer is saturated. trafgen would raise
/// it itself, but inside a network namespace `net.core.wmem_default` is the host's and read
/// only: the host's is raised for the run and put back after (`--no-sock-mem` keeps trafgen
/// from trying). Should it still give up, it is started again at once until `duration` is
/// over. Returns how many times it was.
pub fn trafgen(ns: &Netns, dev: &str, config: &std::path::Path, duration: Duration) -> Result<u32> {
    let _buffer = SendBuffer::raise(4 << 20)?;
    let until = std::time::Instant::now() + duration;
    let conf = config.to_string_lossy();
    let mut restarts = 0;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left < Duration::from_millis(10) {
            return Ok(restarts);
        }
        let secs = format!("{:.3}", left.as_secs_f64());
        let out = ns
            .command("timeout")
            .args([
                "-s",
                "INT",
                &secs,
                "trafgen",
                "--dev",
                dev,
                "--conf",
                &conf,
                "--cpus",
                "1",
                "--no-sock-mem",
                "--qdisc-path",
            ])
            .output()
            .context("running trafgen")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        match out.status.code() {
            // `timeout` stopped it: it ran until the end.
            Some(124) => return Ok(restarts),
            Some(1) if text.contains("Resource temporarily unavailable") => restarts += 1,
            _ => bail!("trafgen failed ({}): {text}", out.status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_reports_are_read() {
        let text = "Running 2s test @ http://10.111.1.1:80/\n  1 threads and 16 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency     1.05ms  409.05us   9.02ms   81.23%\n    Req/Sec     7.52k   612.09     8.43k    70.00%\n  Latency Distribution\n     50%  812.00us\n     75%    1.23ms\n     90%    1.61ms\n     99%    2.50ms\n  14971 requests in 2.00s, 2.21MB read\n  Socket errors: connect 0, read 3, write 0, timeout 1\n  Non-2xx or 3xx responses: 2\nRequests/sec:   7483.12\nTransfer/sec:      1.10MB\n";
        let r = parse_wrk(text).unwrap();
        assert_eq!(
            r,
            WrkResult {
                requests_per_s: 7483.12,
                p50_us: 812.0,
                p99_us: 2500.0,
                errors: 6,
            }
        );
        assert!(parse_wrk("nothing").is_err());
        assert_eq!(duration_us("2.00s").unwrap(), 2e6);
        assert!(duration_us("12").is_err());
    }

    #[test]
    fn trafgen_configs_name_every_target() {
        let c = trafgen_config(
            [2, 0, 0, 0, 0, 0x10],
            "10.111.0.10".parse().unwrap(),
            &[UdpTarget {
                mac: [2, 0, 0, 0, 0, 2],
                dst: "10.111.1.1".parse().unwrap(),
            }],
            5353,
            18,
        );
        assert_eq!(
            c,
            "{\n  eth(da=02:00:00:00:00:02, sa=02:00:00:00:00:10),\n  ipv4(sa=10.111.0.10, da=10.111.1.1, ttl=64),\n  udp(sp=dinc(1024, 65000), dp=5353),\n  fill(0x61, 18)\n}\n"
        );
    }
}
