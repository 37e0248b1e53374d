//! A trace-driven LLM load generator: requests from a `TIMESTAMP,ContextTokens,GeneratedTokens`
//! trace (or a synthetic heavy-tailed one), replayed at a chosen rate as streamed OpenAI
//! completions over real TCP, one connection per request or per-client keep-alive sessions.
//! Records per request: time to first token, end-to-end latency, tokens, and the backend that
//! served it (`x-served-by`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request of a workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRequest {
    /// Seconds after the first request.
    pub at: f64,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// Reads a trace in the Azure LLM inference trace format.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let mut first: Option<(i64, f64)> = None;
    for (n, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        let [ts, ctx, gen_tokens] = fields[..] else {
            bail!(
                "{}:{}: expected TIMESTAMP,ContextTokens,GeneratedTokens",
                path.display(),
                n + 1
            );
        };
        let t = parse_timestamp(ts)
            .with_context(|| format!("{}:{}: timestamp {ts:?}", path.display(), n + 1))?;
        let base = *first.get_or_insert(t);
        out.push(TraceRequest {
            at: (t.0 - base.0) as f64 * 86_400.0 + (t.1 - base.1),
            prompt_tokens: ctx
                .trim()
                .parse()
                .with_context(|| format!("{}:{}: context tokens", path.display(), n + 1))?,
            output_tokens: gen_tokens
                .trim()
                .parse()
                .with_context(|| format!("{}:{}: generated tokens", path.display(), n + 1))?,
        });
    }
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    Ok(out)
}

/// A `YYYY-MM-DD HH:MM:SS.fffffff` timestamp as (days since an arbitrary epoch, seconds of the
/// day): only differences matter, kept apart for precision.
fn parse_timestamp(ts: &str) -> Result<(i64, f64)> {
    let (date, time) = ts
        .trim()
        .split_once(' ')
        .context("no space between date and time")?;
    let d: Vec<u32> = date.split('-').map(str::parse).collect::<Result<_, _>>()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<u32> = hms.split(':').map(str::parse).collect::<Result<_, _>>()?;
    if d.len() != 3 || t.len() != 3 {
        bail!("not YYYY-MM-DD HH:MM:SS");
    }
    // Days from a civil date (proleptic Gregorian), enough for differences within a trace.
    let (y, m) = if d[1] <= 2 {
        (d[0] as i64 - 1, d[1] + 9)
    } else {
        (d[0] as i64, d[1] - 3)
    };
    let days = 365 * y + y / 4 - y / 100 + y / 400 + (153 * m as i64 + 2) / 5 + d[2] as i64;
    let frac: f64 = format!("0.{frac}").parse()?;
    Ok((days, f64::from(t[0] * 3600 + t[1] * 60 + t[2]) + frac))
}

/// A small deterministic generator (splitmix64), so synthetic workloads repeat exactly.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Log-normal with the given median and shape.
    pub fn log_normal(&mut self, median: f64, sigma: f64) -> f64 {
        let (u1, u2) = (self.unit(), self.unit());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        median * (sigma * z).exp()
    }
}

/// A synthetic workload shaped like the conversation trace: Poisson arrivals at `rate`,
/// heavy-tailed (log-normal) prompt and output lengths with similar medians and tails.
pub fn synthetic(n: usize, rate: f64, seed: u64) -> Vec<TraceRequest> {
    let mut rng = Rng::new(seed);
    let mut at = 0.0;
    (0..n)
        .map(|_| {
            at += -rng.unit().ln() / rate;
            TraceRequest {
                at,
                prompt_tokens: rng.log_normal(1000.0, 0.8).clamp(16.0, 14_000.0) as u32,
                output_tokens: rng.log_normal(130.0, 0.9).clamp(4.0, 1000.0) as u32,
            }
        })
        .collect()
}

/// The first `n` requests of `trace`, replayed at `rate` requests per second on average.
pub fn at_rate(trace: &[TraceRequest], n: usize, rate: f64) -> Vec<TraceRequest> {
    let slice = &trace[..n.min(trace.len())];
    let span = slice.last().map_or(0.0, |r| r.at).max(1e-9);
    let native = slice.len() as f64 / span;
    let scale = native / rate;
    slice
        .iter()
        .map(|r| TraceRequest {
            at: r.at * scale,
            ..*r
        })
        .collect()
}

/// What happened to one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Sent at (seconds after the start).
    pub sent: f64,
    pub ttft: Option<f64>,
    pub e2e: Option<f64>,
    pub tokens: u32,
    pub backend: Option<String>,
    /// Why it failed: refused, timed out, HTTP error.
    pub error: Option<String>,
}

/// How requests travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connections {
    /// A new TCP connection per request (each one balanced on its own).
    PerRequest,
    /// This many keep-alive client sessions, each sending its requests in turn on one
    /// connection (the balancer places the session, not the request).
    Sessions(usize),
}

/// Replays `workload` against `addr` (call from inside the client's network namespace) and
/// returns the outcome of every request, in workload order.
pub fn replay(
    addr: SocketAddr,
    model: &str,
    workload: &[TraceRequest],
    how: Connections,
    timeout: Duration,
) -> Vec<Outcome> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let model = model.to_string();
    let workload = workload.to_vec();
    runtime.block_on(async move {
        let start = Instant::now();
        match how {
            Connections::PerRequest => {
                let mut tasks = Vec::with_capacity(workload.len());
                for r in workload {
                    let model = model.clone();
                    tasks.push(tokio::spawn(async move {
                        tokio::time::sleep_until((start + Duration::from_secs_f64(r.at)).into())
                            .await;
                        let sent = start.elapsed().as_secs_f64();
                        let mut out = match tokio::time::timeout(timeout, async {
                            let mut stream = TcpStream::connect(addr)
                                .await
                                .map_err(|e| format!("refused: {e}"))?;
                            let _ = stream.set_nodelay(true);
                            one_request(&mut stream, &model, &r, Instant::now(), false).await
                        })
                        .await
                        {
                            Ok(Ok(o)) => o,
                            Ok(Err(e)) => Outcome {
                                error: Some(e),
                                ..Outcome::default()
                            },
                            Err(_) => Outcome {
                                error: Some("timed out".into()),
                                ..Outcome::default()
                            },
                        };
                        out.sent = sent;
                        out
                    }));
                }
                let mut outcomes = Vec::with_capacity(tasks.len());
                for t in tasks {
                    outcomes.push(t.await.unwrap_or_default());
                }
                outcomes
            }
            Connections::Sessions(k) => {
                let k = k.max(1);
                let mut tasks = Vec::new();
                for s in 0..k {
                    let mine: Vec<(usize, TraceRequest)> = workload
                        .iter()
                        .copied()
                        .enumerate()
                        .filter(|(i, _)| i % k == s)
                        .collect();
                    let model = model.clone();
                    tasks.push(tokio::spawn(async move {
                        let mut stream: Option<TcpStream> = None;
                        let mut outs = Vec::new();
                        for (i, r) in mine {
                            tokio::time::sleep_until(
                                (start + Duration::from_secs_f64(r.at)).into(),
                            )
                            .await;
                            let sent = start.elapsed().as_secs_f64();
                            let result = tokio::time::timeout(timeout, async {
                                if stream.is_none() {
                                    let s = TcpStream::connect(addr)
                                        .await
                                        .map_err(|e| format!("refused: {e}"))?;
                                    let _ = s.set_nodelay(true);
                                    stream = Some(s);
                                }
                                let s = stream.as_mut().expect("connected");
                                one_request(s, &model, &r, Instant::now(), true).await
                            })
                            .await;
                            let mut o = match result {
                                Ok(Ok(o)) => o,
                                Ok(Err(e)) => {
                                    stream = None;
                                    Outcome {
                                        error: Some(e),
                                        ..Outcome::default()
                                    }
                                }
                                Err(_) => {
                                    stream = None;
                                    Outcome {
                                        error: Some("timed out".into()),
                                        ..Outcome::default()
                                    }
                                }
                            };
                            o.sent = sent;
                            outs.push((i, o));
                        }
                        outs
                    }));
                }
                let mut outcomes = vec![Outcome::default(); workload.len()];
                for t in tasks {
                    for (i, o) in t.await.unwrap_or_default() {
                        outcomes[i] = o;
                    }
                }
                outcomes
            }
        }
    })
}

/// Sends one streamed completion on `stream` and reads it to the end.
async fn one_request(
    stream: &mut TcpStream,
    model: &str,
    r: &TraceRequest,
    t0: Instant,
    keep_alive: bool,
) -> Result<Outcome, String> {
    // A prompt of `prompt_tokens` words (the simulator counts words; real servers tokenize).
    let prompt = "w ".repeat(r.prompt_tokens.max(1) as usize);
    let body = format!(
        "{{\"model\":\"{model}\",\"prompt\":\"{}\",\"max_tokens\":{},\"stream\":true,\"ignore_eos\":true}}",
        prompt.trim_end(),
        r.output_tokens.max(1)
    );
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: vip\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        body.len(),
        if keep_alive { "keep-alive" } else { "close" }
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    stream
        .write_all(body.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen: Vec<u8> = Vec::new();
    let mut out = Outcome::default();
    let mut header_done = false;
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            if out.e2e.is_none() {
                return Err(if header_done {
                    "closed mid-stream".into()
                } else {
                    "closed before answering".into()
                });
            }
            return Ok(out);
        }
        seen.extend_from_slice(&buf[..n]);
        if !header_done {
            let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&seen[..end]).to_string();
            let status = head.lines().next().unwrap_or_default().to_string();
            if !status.contains(" 200") {
                return Err(format!("HTTP {status}"));
            }
            out.backend = head.lines().find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("x-served-by:")
                    .map(|v| v.trim().to_string())
            });
            seen.drain(..end + 4);
            header_done = true;
        }
        // Count token events in what arrived; keep a tail in case a marker straddles reads.
        let text = String::from_utf8_lossy(&seen);
        let tokens = text.matches("\"text\":\" tok").count() as u32;
        if tokens > 0 && out.ttft.is_none() {
            out.ttft = Some(t0.elapsed().as_secs_f64());
        }
        out.tokens += tokens;
        if text.contains("data: [DONE]") {
            out.e2e = Some(t0.elapsed().as_secs_f64());
            if !keep_alive || text.contains("\r\n0\r\n\r\n") {
                return Ok(out);
            }
        }
        let keep = seen.len().min(32);
        let cut = seen.len() - keep;
        // Drop what was counted, keeping a tail that cannot hold a whole marker.
        if tokens > 0 || cut > 0 {
            let last = text
                .rfind("\"text\":\" tok")
                .map_or(cut, |i| i + 1)
                .max(cut);
            seen.drain(..last.min(seen.len()));
        }
    }
}

/// Percentile `p` (0..100) of `values` (sorted in place), by nearest rank.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil().max(1.0) as usize;
    values[rank.min(values.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_parse_and_rescale() {
        let dir = std::env::temp_dir().join("balancer-trace-test.csv");
        std::fs::write(
            &dir,
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:56.6805900,10,1\n",
        )
        .unwrap();
        let t = read_trace(&dir).unwrap();
        assert_eq!(t.len(), 3);
        assert!((t[1].at - 4.314579).abs() < 1e-6);
        assert_eq!((t[0].prompt_tokens, t[0].output_tokens), (374, 44));
        // 3 requests over 10 s, replayed at 3 req/s: a third of the time.
        let fast = at_rate(&t, 3, 3.0);
        assert!((fast[2].at - 10.0 * 0.1).abs() < 1e-6, "{fast:?}");
        std::fs::write(
            &dir,
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,x,1\n",
        )
        .unwrap();
        assert!(
            read_trace(&dir)
                .unwrap_err()
                .to_string()
                .contains("context tokens")
        );
        let _ = std::fs::remove_file(dir);
    }

    #[test]
    fn synthetic_workloads_repeat_and_are_heavy_tailed() {
        let a = synthetic(2000, 5.0, 7);
        assert_eq!(a, synthetic(2000, 5.0, 7));
        let mut prompts: Vec<f64> = a.iter().map(|r| f64::from(r.prompt_tokens)).collect();
        let p50 = percentile(&mut prompts, 50.0);
        let p99 = percentile(&mut prompts, 99.0);
        assert!(
            (700.0..1400.0).contains(&p50) && p99 > 4.0 * p50,
            "p50 {p50} p99 {p99}"
        );
        let rate = a.len() as f64 / a.last().unwrap().at;
        assert!((4.5..5.5).contains(&rate), "{rate}");
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), 50.0);
        assert_eq!(percentile(&mut v, 99.0), 99.0);
        assert_eq!(percentile(&mut v, 100.0), 100.0);
    }
}
