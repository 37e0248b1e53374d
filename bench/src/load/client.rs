//! The load generator: plays a workload's conversations against an OpenAI-compatible address
//! (the balancer's VIP, an L7 router, or a server) as streamed completions over real TCP, each
//! request from its conversation's client address, and records per request its time to first
//! token, inter-token latency, end-to-end latency, tokens and the backend that served it
//! (`x-served-by`). A multi-turn conversation sends each turn a think time after the answer to
//! the one before, with the whole conversation so far (earlier messages and the answers as they
//! came) before the new message. Every request carries `x-session-id: conversation-<id>`, what L7
//! routers' session-affinity policies key on (an L4 balancer cannot read it). Call it from
//! inside the client's network namespace.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::workload::Conversation;
use balancer_tests::openai::{Event, ResponseDecoder};

/// Where requests go.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub model: String,
}

/// How requests travel.
#[derive(Clone, Copy, Debug)]
pub struct ClientOptions {
    /// Give up on a request after this long.
    pub timeout: Duration,
    /// Keep a conversation's connection open between its turns (else a connection per
    /// request, each balanced on its own).
    pub keep_alive: bool,
    /// Send from each conversation's address (the rack gives the client those addresses).
    pub bind_sources: bool,
    /// Stop the run early once its p99 TTFT is certainly over a line (None: play it all).
    pub give_up: Option<GiveUp>,
}

/// When a run may stop early: once more than `late` requests got their first token after
/// `ttft`. The requests not finished then fail with [`STOPPED`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GiveUp {
    pub ttft: Duration,
    pub late: usize,
}

impl GiveUp {
    /// The line a p99 TTFT over `requests` requests must keep: with more than this many
    /// requests past it, the p99 (nearest rank) is past it too.
    pub fn p99_over(ttft: Duration, requests: usize) -> GiveUp {
        let rank = (0.99 * requests as f64).ceil() as usize;
        GiveUp {
            ttft,
            late: requests.saturating_sub(rank),
        }
    }
}

/// The error of the requests a run stopped early did not finish.
pub const STOPPED: &str = "stopped: the run's p99 TTFT was already over the line";

/// Counts the requests past a [`GiveUp`]'s line, and says when there are too many.
struct Late {
    give_up: GiveUp,
    count: AtomicUsize,
    over: tokio::sync::Notify,
}

impl Late {
    fn first_token(&self, ttft: f64) {
        if ttft > self.give_up.ttft.as_secs_f64()
            && self.count.fetch_add(1, Ordering::Relaxed) == self.give_up.late
        {
            // Stored for the waiter even if it is not waiting yet.
            self.over.notify_one();
        }
    }
}

/// What happened to one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub conversation: usize,
    pub turn: usize,
    /// Sent at, seconds after the start.
    pub sent: f64,
    pub ttft: Option<f64>,
    pub e2e: Option<f64>,
    /// Mean gap between its tokens after the first, seconds.
    pub itl: Option<f64>,
    pub tokens: u32,
    /// Words of the prompt sent.
    pub prompt_words: usize,
    pub backend: Option<String>,
    /// Why it failed: refused, timed out, HTTP error, a broken stream.
    pub error: Option<String>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.e2e.is_some()
    }
}

/// Plays `workload` against `target`; the outcome of every request, by conversation and turn.
pub fn run(target: &Target, workload: &[Conversation], opts: ClientOptions) -> Vec<Outcome> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let target = target.clone();
    let workload = workload.to_vec();
    let late = opts.give_up.map(|give_up| {
        Arc::new(Late {
            give_up,
            count: AtomicUsize::new(0),
            over: tokio::sync::Notify::new(),
        })
    });
    runtime.block_on(async move {
        let start = Instant::now();
        let tasks: Vec<_> = workload
            .into_iter()
            .map(|c| {
                let (id, turns) = (c.id, c.turns.len());
                let task = conversation(target.clone(), c, opts, start, late.clone());
                (id, turns, tokio::spawn(task))
            })
            .collect();
        let over = async {
            match &late {
                Some(l) => l.over.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(over);
        let mut stopped = false;
        let mut out = Vec::new();
        for (id, turns, mut t) in tasks {
            if !stopped {
                tokio::select! {
                    r = &mut t => {
                        out.extend(r.unwrap_or_default());
                        continue;
                    }
                    () = &mut over => stopped = true,
                }
            }
            // Stopped: what finished counts, the rest fails.
            t.abort();
            match t.await {
                Ok(v) => out.extend(v),
                Err(_) => out.extend((0..turns).map(|turn| Outcome {
                    conversation: id,
                    turn,
                    error: Some(STOPPED.into()),
                    ..Outcome::default()
                })),
            }
        }
        out
    })
}

async fn conversation(
    target: Target,
    c: Conversation,
    opts: ClientOptions,
    start: Instant,
    late: Option<Arc<Late>>,
) -> Vec<Outcome> {
    tokio::time::sleep_until((start + Duration::from_secs_f64(c.start)).into()).await;
    let mut history = String::new();
    let mut stream: Option<TcpStream> = None;
    let mut outcomes = Vec::with_capacity(c.turns.len());
    for (i, turn) in c.turns.iter().enumerate() {
        if turn.think > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(turn.think)).await;
        }
        if !history.is_empty() {
            history.push(' ');
        }
        history.push_str(&turn.message);
        let prompt = history.clone();
        let sent = start.elapsed().as_secs_f64();
        let source = opts.bind_sources.then_some(c.source);
        let attempt = tokio::time::timeout(
            opts.timeout,
            request(
                &target,
                &mut stream,
                source,
                Ask {
                    session: c.id,
                    prompt: &prompt,
                    max_tokens: turn.output_tokens,
                },
                opts.keep_alive,
                late.as_deref(),
            ),
        )
        .await;
        let mut o = match attempt {
            Ok(Ok((o, answer))) => {
                history.push_str(&answer);
                o
            }
            Ok(Err(e)) => Outcome {
                error: Some(e),
                ..Outcome::default()
            },
            Err(_) => Outcome {
                error: Some("timed out".into()),
                ..Outcome::default()
            },
        };
        if !o.ok() || !opts.keep_alive {
            stream = None;
        }
        o.conversation = c.id;
        o.turn = i;
        o.sent = sent;
        o.prompt_words = prompt.split_whitespace().count();
        outcomes.push(o);
    }
    outcomes
}

async fn connect(addr: SocketAddr, source: Option<IpAddr>) -> Result<TcpStream, String> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|e| format!("socket: {e}"))?;
    if let Some(src) = source {
        socket
            .bind(SocketAddr::new(src, 0))
            .map_err(|e| format!("bind {src}: {e}"))?;
    }
    let s = socket
        .connect(addr)
        .await
        .map_err(|e| format!("refused: {e}"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// What one request asks: its conversation (the session), prompt and output tokens.
struct Ask<'a> {
    session: usize,
    prompt: &'a str,
    max_tokens: u32,
}

/// Sends one streamed completion and reads it to its end: the outcome and the answer's text.
async fn request(
    target: &Target,
    stream: &mut Option<TcpStream>,
    source: Option<IpAddr>,
    ask: Ask<'_>,
    keep_alive: bool,
    late: Option<&Late>,
) -> Result<(Outcome, String), String> {
    let t0 = Instant::now();
    if stream.is_none() {
        *stream = Some(connect(target.addr, source).await?);
    }
    let s = stream.as_mut().expect("connected");
    send(s, target, &ask, keep_alive).await?;
    let Streamed {
        decoder,
        answer,
        first,
        last,
        chunks,
        usage_tokens,
    } = read_stream(s, t0, late).await?;
    let mut out = Outcome {
        backend: decoder.header("x-served-by").map(str::to_string),
        tokens: usage_tokens.map_or(chunks, |t| t as u32),
        ttft: first,
        e2e: Some(t0.elapsed().as_secs_f64()),
        ..Outcome::default()
    };
    if let Some(f) = first
        && out.tokens > 1
    {
        out.itl = Some((last - f) / f64::from(out.tokens - 1));
    }
    let closing = decoder
        .header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
    if !decoder.ended() || closing {
        // Closed (or closing) on the server's side: this connection is done.
        *stream = None;
    }
    Ok((out, answer))
}

/// Writes the request: a streamed completion with usage, on a kept-alive or closing
/// connection.
async fn send(
    s: &mut TcpStream,
    target: &Target,
    ask: &Ask<'_>,
    keep_alive: bool,
) -> Result<(), String> {
    let Ask {
        session,
        prompt,
        max_tokens,
    } = *ask;
    let body = serde_json::json!({
        "model": target.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nx-session-id: conversation-{session}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        target.addr,
        body.len(),
        if keep_alive { "keep-alive" } else { "close" }
    );
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    s.write_all(body.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    Ok(())
}

/// What a streamed answer brought: its text, when its first and last tokens came (seconds
/// from the request), its chunks, and the tokens its usage counts.
struct Streamed {
    decoder: ResponseDecoder,
    answer: String,
    first: Option<f64>,
    last: f64,
    chunks: u32,
    usage_tokens: Option<u64>,
}

/// Reads a streamed answer to its end (`[DONE]`); an HTTP error or a stream cut short is an
/// error.
async fn read_stream(
    s: &mut TcpStream,
    t0: Instant,
    late: Option<&Late>,
) -> Result<Streamed, String> {
    let mut decoder = ResponseDecoder::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut answer = String::new();
    let (mut first, mut last) = (None::<f64>, 0.0f64);
    let mut chunks = 0u32;
    let mut usage_tokens = None;
    let mut done = false;
    loop {
        let n = s.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
        let events = if n == 0 {
            decoder.close()?
        } else {
            decoder.feed(&buf[..n])?
        };
        let now = t0.elapsed().as_secs_f64();
        for e in events {
            match e {
                Event::Done => done = true,
                Event::Chunk(c) => {
                    if let Some(u) = c.get("usage").filter(|u| !u.is_null()) {
                        usage_tokens = u.get("completion_tokens").and_then(|v| v.as_u64());
                    }
                    let text = c
                        .pointer("/choices/0/text")
                        .or_else(|| c.pointer("/choices/0/delta/content"))
                        .and_then(|t| t.as_str())
                        .unwrap_or_default();
                    if !text.is_empty() {
                        if first.is_none()
                            && let Some(l) = late
                        {
                            l.first_token(now);
                        }
                        first.get_or_insert(now);
                        last = now;
                        chunks += 1;
                        answer.push_str(text);
                    }
                }
            }
        }
        if decoder.status != 0 && decoder.status != 200 && (decoder.ended() || n == 0) {
            return Err(format!(
                "HTTP {}: {}",
                decoder.status,
                decoder.body_text().chars().take(200).collect::<String>()
            ));
        }
        if decoder.ended() || n == 0 {
            break;
        }
    }
    if !done {
        return Err(format!(
            "the stream ended without [DONE] after {chunks} chunks"
        ));
    }
    Ok(Streamed {
        decoder,
        answer,
        first,
        last,
        chunks,
        usage_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::workload::Turn;

    #[test]
    fn the_give_up_line_is_where_the_p99_is_past_it() {
        let late = |n| GiveUp::p99_over(Duration::from_secs(5), n).late;
        assert_eq!([late(40), late(100), late(101), late(320)], [0, 1, 1, 3]);
    }

    #[test]
    fn a_run_stops_once_its_p99_is_certainly_over_the_line() {
        // One request at a time, each about 0.4 s: 30 sent at once queue for 12 s.
        let profile =
            balancer_sim::engine::Profile::parse("one:kv=65536:prefill=20000:decode=50:batch=1")
                .unwrap();
        let addr = balancer_sim::server::spawn_local("gpu1", "m", profile).unwrap();
        let work: Vec<Conversation> = (0..30)
            .map(|id| Conversation {
                id,
                start: 0.0,
                source: IpAddr::from([127, 0, 0, 1]),
                turns: vec![Turn {
                    message: "a short prompt".into(),
                    output_tokens: 20,
                    think: 0.0,
                }],
            })
            .collect();
        let target = Target {
            addr,
            model: "m".into(),
        };
        let opts = ClientOptions {
            timeout: Duration::from_secs(60),
            keep_alive: false,
            bind_sources: false,
            give_up: Some(GiveUp {
                ttft: Duration::from_millis(500),
                late: 2,
            }),
        };
        let t0 = Instant::now();
        let out = run(&target, &work, opts);
        let wall = t0.elapsed().as_secs_f64();
        assert_eq!(out.len(), 30);
        let stopped = out
            .iter()
            .filter(|o| o.error.as_deref() == Some(STOPPED))
            .count();
        // The late ones may be stopped while they decode: only the stop is certain.
        assert!(stopped >= 15, "{stopped} stopped of 30");
        assert!(
            out.iter()
                .all(|o| o.ok() || o.error.as_deref() == Some(STOPPED))
        );
        assert!(wall < 8.0, "{wall} s");
    }
}
