//! The simulated inference server's HTTP side, OpenAI-compatible as vLLM serves it:
//! `POST /v1/completions` and `/v1/chat/completions` (streamed as server-sent events, one event
//! per token, the last one with its `finish_reason`, then a usage chunk when the request asks
//! for one, then `[DONE]`; or whole), `POST /tokenize` and `/v1/completions/render`,
//! `/v1/chat/completions/render` (vLLM's: vllm-router's cache_aware policy routes on their token
//! ids), `GET /get_load` (SGLang's: the L7 routers' power-of-two policies poll it), `/v1/models`, `/health`, `/version`, and `/metrics`
//! with vLLM's names, labels and content type.
//!
//! Prompts are tokenized one token per whitespace-separated word (`engine::tokenize`); a prompt
//! given as token ids is taken as it is. A chat's messages are tokenized as `role content` in
//! turn. Generated tokens are the words `tok1 tok2 ...`, so a client that sends a conversation's
//! answers back in its next prompt reuses the blocks they filled (multi-turn prefix hits).
//!
//! Every answer carries `x-served-by: NAME`, so load generators can tell backends apart.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

mod metrics;

use metrics::*;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use super::engine::{Engine, Profile, RequestId, Token, tokenize};

/// What the engine tells a request's handler.
enum Event {
    /// A token was generated: the count so far, and whether it is the last.
    Token(u64, bool),
}

/// A request's outlet, when it arrived, was first scheduled, got its first token and its last.
struct Sink {
    tx: mpsc::UnboundedSender<Event>,
    arrived: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache when admitted.
    cached_tokens: usize,
}

struct Shared {
    name: String,
    model: String,
    engine: Mutex<Engine>,
    work: Notify,
    sinks: Mutex<HashMap<RequestId, Sink>>,
    next_id: Mutex<RequestId>,
    histograms: Mutex<Histograms>,
}

/// Runs a simulated server on a free loopback port, on a thread and runtime of its own, until
/// the process ends (for tests and tools in one process); its address once it listens.
pub fn spawn_local(name: &str, model: &str, profile: Profile) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    drop(listener);
    let (name, model) = (name.to_string(), model.to_string());
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .and_then(|rt| rt.block_on(serve(addr, name, model, profile)))
    });
    for _ in 0..500 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(addr);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the simulated server on {addr} did not listen within 5 s"),
    ))
}

/// Runs a simulated server on `addr` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    name: String,
    model: String,
    profile: Profile,
) -> std::io::Result<()> {
    let prompt_buckets = token_buckets(profile.max_model_len() as usize);
    let shared = Arc::new(Shared {
        name,
        model,
        engine: Mutex::new(Engine::new(profile)),
        work: Notify::new(),
        sinks: Mutex::new(HashMap::new()),
        next_id: Mutex::new(1),
        histograms: Mutex::new(Histograms {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            queue: Histogram::new(PHASE_BUCKETS),
            prefill: Histogram::new(PHASE_BUCKETS),
            prompt_tokens: Histogram::new(&prompt_buckets),
            computed_tokens: Histogram::new(&prompt_buckets),
        }),
    });
    tokio::spawn(drive(shared.clone()));
    let app = axum::Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/tokenize", post(tokenize_route))
        .route("/v1/completions/render", post(render_completion))
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/get_load", get(get_load))
        .route("/v1/models", get(models))
        .route(
            "/version",
            get(|| async { axum::Json(json!({"version": "sim-llm"})) }),
        )
        .route("/health", get(|| async { "" }))
        .route("/metrics", get(metrics))
        .with_state(shared);
    // Tokens leave as they are made, as vLLM's server (uvicorn) sends them: without
    // TCP_NODELAY a token written while the last is unacknowledged waits for the ACK.
    let listener = tokio::net::TcpListener::bind(addr).await?.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    axum::serve(listener, app).await
}

/// Steps the engine, sleeping each step's duration, and hands out its tokens.
async fn drive(shared: Arc<Shared>) {
    loop {
        let step = shared
            .engine
            .lock()
            .map(|mut e| e.step())
            .unwrap_or_default();
        if step.duration.is_zero() {
            shared.work.notified().await;
            continue;
        }
        let began = Instant::now();
        if !step.admitted.is_empty() {
            let mut sinks = shared.sinks.lock().expect("sinks");
            for (id, cached) in &step.admitted {
                if let Some(s) = sinks.get_mut(id) {
                    s.admitted = Some(began);
                    s.cached_tokens = *cached;
                }
            }
        }
        tokio::time::sleep(step.duration).await;
        let now = Instant::now();
        let mut gone = Vec::new();
        {
            let mut sinks = shared.sinks.lock().expect("sinks");
            let mut h = shared.histograms.lock().expect("histograms");
            for (id, n) in &step.tokens {
                let last = step.finished.contains(id);
                let Some(sink) = sinks.get_mut(id) else {
                    continue;
                };
                match sink.last_token {
                    None => {
                        h.ttft
                            .observe(now.duration_since(sink.arrived).as_secs_f64());
                        sink.first_token = Some(now);
                    }
                    Some(t) => h.itl.observe(now.duration_since(t).as_secs_f64()),
                }
                sink.last_token = Some(now);
                if sink.tx.send(Event::Token(*n, last)).is_err() {
                    gone.push(*id);
                }
            }
            for id in &step.finished {
                if let Some(sink) = sinks.remove(id) {
                    h.e2e
                        .observe(now.duration_since(sink.arrived).as_secs_f64());
                    let admitted = sink.admitted.unwrap_or(sink.arrived);
                    h.queue
                        .observe(admitted.duration_since(sink.arrived).as_secs_f64());
                    if let Some(first) = sink.first_token {
                        h.prefill
                            .observe(first.duration_since(admitted).as_secs_f64());
                    }
                    h.prompt_tokens.observe(sink.prompt_tokens as f64);
                    h.computed_tokens
                        .observe(sink.prompt_tokens.saturating_sub(sink.cached_tokens) as f64);
                }
            }
            for id in &gone {
                sinks.remove(id);
            }
        }
        if !gone.is_empty() {
            let mut e = shared.engine.lock().expect("engine");
            for id in gone {
                e.cancel(id);
            }
        }
    }
}

/// A prompt's tokens: a text's words, a list of token ids, or a list of texts.
fn prompt_tokens(prompt: &Value) -> Vec<Token> {
    match prompt {
        Value::String(s) => tokenize(s),
        Value::Array(items) => items
            .iter()
            .flat_map(|i| match i.as_u64() {
                Some(id) => vec![id as Token],
                None => prompt_tokens(i),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A chat's tokens: each message's role, then its content (text, or a list of text parts).
fn chat_tokens(messages: &[Value]) -> Vec<Token> {
    let mut tokens = Vec::new();
    for m in messages {
        tokens.extend(tokenize(
            m.get("role").and_then(Value::as_str).unwrap_or("user"),
        ));
        match m.get("content") {
            Some(Value::Array(parts)) => {
                for p in parts {
                    tokens.extend(tokenize(
                        p.get("text").and_then(Value::as_str).unwrap_or(""),
                    ));
                }
            }
            Some(c) => tokens.extend(prompt_tokens(c)),
            None => {}
        }
    }
    tokens
}

fn error(status: StatusCode, message: String) -> Response {
    let body = json!({"object": "error", "message": message, "type": "BadRequestError", "code": status.as_u16()});
    (status, axum::Json(body)).into_response()
}

fn bad(status: StatusCode, message: String) -> Box<Response> {
    Box::new(error(status, message))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One request's parameters, from either endpoint.
struct Ask {
    prompt: Vec<Token>,
    max_tokens: u64,
    stream: bool,
    include_usage: bool,
    chat: bool,
}

fn parse_json(body: &Bytes) -> Result<Value, Box<Response>> {
    serde_json::from_slice(body)
        .map_err(|e| bad(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

fn check_model(shared: &Shared, v: &Value) -> Result<(), Box<Response>> {
    match v.get("model").and_then(Value::as_str) {
        Some(m) if m != shared.model => Err(bad(
            StatusCode::NOT_FOUND,
            format!("The model `{m}` does not exist."),
        )),
        _ => Ok(()),
    }
}

/// The tokens of a request body: its `messages` (chat) or its `prompt`.
fn body_tokens(v: &Value, chat: bool) -> Result<Vec<Token>, Box<Response>> {
    if chat {
        let messages = v.get("messages").and_then(Value::as_array).ok_or_else(|| {
            bad(
                StatusCode::BAD_REQUEST,
                "\"messages\" must be a list".into(),
            )
        })?;
        Ok(chat_tokens(messages))
    } else {
        let p = v
            .get("prompt")
            .ok_or_else(|| bad(StatusCode::BAD_REQUEST, "\"prompt\" is required".into()))?;
        Ok(prompt_tokens(p))
    }
}

fn parse_ask(shared: &Shared, body: &Bytes, chat: bool) -> Result<Ask, Box<Response>> {
    let v = parse_json(body)?;
    check_model(shared, &v)?;
    let prompt = body_tokens(&v, chat)?;
    let max_tokens = v
        .get("max_completion_tokens")
        .or_else(|| v.get("max_tokens"))
        .map_or(Some(16), Value::as_u64)
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            bad(
                StatusCode::BAD_REQUEST,
                "\"max_tokens\" must be a positive integer".into(),
            )
        })?;
    Ok(Ask {
        prompt,
        max_tokens,
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: v
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        chat,
    })
}

async fn completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    served_by(&shared, answer(&shared, body, false).await)
}

async fn chat(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    served_by(&shared, answer(&shared, body, true).await)
}

fn served_by(shared: &Shared, mut response: Response) -> Response {
    if let Ok(v) = HeaderValue::from_str(&shared.name) {
        response.headers_mut().insert("x-served-by", v);
    }
    response
}

/// `POST /tokenize` as vLLM answers it: `{"count", "max_model_len", "tokens"}`.
async fn tokenize_route(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let result = parse_json(&body).and_then(|v| {
        check_model(&shared, &v)?;
        body_tokens(&v, v.get("messages").is_some())
    });
    match result {
        Ok(tokens) => {
            axum::Json(json!({"count": tokens.len(), "max_model_len": max_model_len(&shared), "tokens": tokens, "token_strs": null}))
                .into_response()
        }
        Err(r) => *r,
    }
}

/// The token ids of a request body (vLLM's render endpoints, which vllm-router's cache_aware
/// policy asks of every worker before it routes a request).
fn render(shared: &Shared, body: &Bytes, chat: bool) -> Result<Vec<Token>, Box<Response>> {
    let v = parse_json(body)?;
    check_model(shared, &v)?;
    body_tokens(&v, chat)
}

/// `POST /v1/completions/render`: a list with one `{"token_ids"}` per prompt, as vLLM answers.
async fn render_completion(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    match render(&shared, &body, false) {
        Ok(t) => axum::Json(json!([{"token_ids": t}])).into_response(),
        Err(r) => *r,
    }
}

/// `POST /v1/chat/completions/render`: `{"token_ids"}`.
async fn render_chat(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    match render(&shared, &body, true) {
        Ok(t) => axum::Json(json!({"token_ids": t})).into_response(),
        Err(r) => *r,
    }
}

/// `GET /get_load` as SGLang answers it (one data-parallel rank).
async fn get_load(State(shared): State<Arc<Shared>>) -> Response {
    let e = shared.engine.lock().expect("engine");
    let v = json!([{
        "dp_rank": 0,
        "num_reqs": e.running() + e.waiting(),
        "num_waiting_reqs": e.waiting(),
        "num_tokens": e.tokens_in_flight(),
    }]);
    axum::Json(v).into_response()
}

/// A request handed to the engine, with the sink its tokens come back on.
fn submit(
    shared: &Shared,
    prompt: Vec<Token>,
    max_tokens: u64,
) -> Result<(u64, mpsc::UnboundedReceiver<Event>), String> {
    let id = {
        let mut n = shared.next_id.lock().expect("ids");
        *n += 1;
        *n
    };
    let (tx, rx) = mpsc::unbounded_channel();
    shared.sinks.lock().expect("sinks").insert(
        id,
        Sink {
            tx,
            arrived: Instant::now(),
            admitted: None,
            first_token: None,
            last_token: None,
            prompt_tokens: prompt.len(),
            cached_tokens: 0,
        },
    );
    if let Err(e) = shared
        .engine
        .lock()
        .expect("engine")
        .submit(id, prompt, max_tokens)
    {
        shared.sinks.lock().expect("sinks").remove(&id);
        return Err(e);
    }
    Ok((id, rx))
}

async fn answer(shared: &Arc<Shared>, body: Bytes, chat: bool) -> Response {
    let ask = match parse_ask(shared, &body, chat) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let prompt_len = ask.prompt.len() as u64;
    let (id, mut rx) = match submit(shared, ask.prompt, ask.max_tokens) {
        Ok(submitted) => submitted,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    shared.work.notify_one();
    let rid = format!("{}-{id}", if chat { "chatcmpl" } else { "cmpl" });
    let model = shared.model.clone();
    let created = unix_now();
    let usage = move |completion: u64| json!({"prompt_tokens": prompt_len, "completion_tokens": completion, "total_tokens": prompt_len + completion});
    if !ask.stream {
        let mut n = 0;
        while let Some(Event::Token(k, last)) = rx.recv().await {
            n = k;
            if last {
                break;
            }
        }
        let text: String = (1..=n).map(|k| format!(" tok{k}")).collect();
        let v = if ask.chat {
            json!({"id": rid, "object": "chat.completion", "created": created, "model": model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                   "usage": usage(n)})
        } else {
            json!({"id": rid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}],
                   "usage": usage(n)})
        };
        return axum::Json(v).into_response();
    }
    let chunk = move |n: u64, last: bool| -> String {
        let text = format!(" tok{n}");
        let finish = if last { json!("length") } else { Value::Null };
        let v = if ask.chat {
            json!({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": finish}]})
        } else {
            json!({"id": rid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null}]})
        };
        let mut out = format!("data: {v}\n\n");
        if last {
            if ask.include_usage {
                let u = json!({"id": rid, "object": v["object"], "created": created, "model": model,
                               "choices": [], "usage": usage(n)});
                out.push_str(&format!("data: {u}\n\n"));
            }
            out.push_str("data: [DONE]\n\n");
        }
        out
    };
    let stream = futures_util::stream::unfold((rx, false), move |(mut rx, ended)| {
        let chunk = chunk.clone();
        async move {
            if ended {
                return None;
            }
            rx.recv().await.map(|Event::Token(n, last)| {
                (Ok::<_, Infallible>(Bytes::from(chunk(n, last))), (rx, last))
            })
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    r.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    r
}

/// The longest context the server's profile takes, tokens.
fn max_model_len(shared: &Shared) -> u64 {
    shared
        .engine
        .lock()
        .expect("engine")
        .profile
        .max_model_len()
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let v = json!({"object": "list", "data": [{"id": shared.model, "object": "model", "created": unix_now(), "owned_by": "sim-llm", "root": shared.model, "max_model_len": max_model_len(&shared)}]});
    axum::Json(v).into_response()
}

#[cfg(test)]
mod tests;
