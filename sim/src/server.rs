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

/// A histogram as vLLM's: cumulative counts per upper bound, sum, count.
struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &[f64]) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, page: &mut String, name: &str, help: &str, labels: &str) {
        use std::fmt::Write as _;
        let _ = writeln!(page, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i];
            let _ = writeln!(page, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}.0");
        }
        cumulative += self.counts[self.bounds.len()];
        let _ = writeln!(
            page,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}.0\n{name}_count{{{labels}}} {}.0\n{name}_sum{{{labels}}} {}",
            self.count, self.sum
        );
    }
}

/// vLLM's bucket bounds for time to first token, inter-token latency and end-to-end latency.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's bounds for the request phase times (queue, prefill).
const PHASE_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's bounds for token counts: 1, 2, 5, 10, 20, 50, ... up to the model's length.
fn token_buckets(max: usize) -> Vec<f64> {
    let mut bounds = Vec::new();
    let mut decade = 1.0;
    loop {
        for m in [1.0, 2.0, 5.0] {
            let b = m * decade;
            if b > max as f64 {
                return bounds;
            }
            bounds.push(b);
        }
        decade *= 10.0;
    }
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

/// vLLM's request histograms: TTFT and inter-token latency as tokens go out; queue, prefill
/// and end-to-end times when a request finishes.
struct Histograms {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    prompt_tokens: Histogram,
    /// Prompt tokens computed (not found in the prefix cache), as a request finishes.
    computed_tokens: Histogram,
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

async fn answer(shared: &Arc<Shared>, body: Bytes, chat: bool) -> Response {
    let ask = match parse_ask(shared, &body, chat) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let id = {
        let mut n = shared.next_id.lock().expect("ids");
        *n += 1;
        *n
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    shared.sinks.lock().expect("sinks").insert(
        id,
        Sink {
            tx,
            arrived: Instant::now(),
            admitted: None,
            first_token: None,
            last_token: None,
            prompt_tokens: ask.prompt.len(),
            cached_tokens: 0,
        },
    );
    let prompt_len = ask.prompt.len() as u64;
    if let Err(e) = shared
        .engine
        .lock()
        .expect("engine")
        .submit(id, ask.prompt, ask.max_tokens)
    {
        shared.sinks.lock().expect("sinks").remove(&id);
        return error(StatusCode::BAD_REQUEST, e);
    }
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

async fn metrics(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> Response {
    use std::fmt::Write as _;
    let (running, waiting, kv, c, profile) = {
        let e = shared.engine.lock().expect("engine");
        (
            e.running(),
            e.waiting(),
            e.kv_usage(),
            e.counters.clone(),
            e.profile.clone(),
        )
    };
    let l = format!("engine=\"0\",model_name=\"{}\"", shared.model);
    let mut page = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, labels: &str, value: String| {
        let _ = writeln!(
            page,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
        );
    };
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        &l,
        format!("{running}.0"),
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        &l,
        format!("{waiting}.0"),
    );
    metric(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Number of requests waiting to be processed, by reason.",
        &format!("{l},reason=\"capacity\""),
        format!("{waiting}.0"),
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        &l,
        format!("{kv}"),
    );
    for (name, help, value) in [
        (
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            c.prefix_queries,
        ),
        (
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            c.prefix_hits,
        ),
        (
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            c.preemptions,
        ),
        (
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            c.prompt_tokens,
        ),
        (
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            c.generation_tokens,
        ),
    ] {
        metric(
            &format!("{name}_total"),
            "counter",
            help,
            &l,
            format!("{value}.0"),
        );
    }
    metric(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        &format!("{l},finished_reason=\"length\""),
        format!("{}.0", c.finished),
    );
    // As vLLM: the cache config has the engine but no model name.
    metric(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
        &format!(
            "block_size=\"{}\",enable_prefix_caching=\"True\",engine=\"0\",kv_cache_size_tokens=\"{}\",num_gpu_blocks=\"{}\"",
            profile.block_tokens,
            profile.kv_tokens(),
            profile.kv_blocks
        ),
        "1.0".into(),
    );
    {
        let h = shared.histograms.lock().expect("histograms");
        h.ttft.render(
            &mut page,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &l,
        );
        h.itl.render(
            &mut page,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &l,
        );
        h.e2e.render(
            &mut page,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &l,
        );
        h.queue.render(
            &mut page,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &l,
        );
        h.prefill.render(
            &mut page,
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &l,
        );
        h.prompt_tokens.render(
            &mut page,
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &l,
        );
        h.computed_tokens.render(
            &mut page,
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            &l,
        );
    }
    let names = requested_names(query.as_deref().unwrap_or(""));
    if !names.is_empty() {
        page = restricted(&page, &names);
    }
    (
        [("content-type", "text/plain; version=1.0.0; charset=utf-8")],
        page,
    )
        .into_response()
}

/// The sample names a metrics request asks for with `name[]` parameters (prometheus_client's
/// filter, which vLLM's `/metrics` honours); none: the whole page.
fn requested_names(query: &str) -> Vec<String> {
    form_urlencoded::parse(query.as_bytes())
        .filter(|(key, _)| key == "name[]")
        .map(|(_, value)| value.into_owned())
        .collect()
}

/// `page` as prometheus_client restricts it: the samples named in `names`, and the HELP and
/// TYPE lines of the families they belong to.
fn restricted(page: &str, names: &[String]) -> String {
    let mut out = String::new();
    for line in page.lines() {
        let keep = match line.strip_prefix("# ") {
            Some(comment) => {
                let family = comment.split(' ').nth(1).unwrap_or("");
                names.iter().any(|n| n.starts_with(family))
            }
            None => names
                .iter()
                .any(|n| n == line.split(['{', ' ']).next().unwrap_or("")),
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use balancer_tests::openai::stream_completion;
    use balancer_tests::traffic::http_get_status;
    use std::time::Duration;

    /// A server on a loopback port of its own runtime thread.
    fn start(profile: Profile) -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(serve(addr, "gpu1".into(), "m".into(), profile))
        });
        for _ in 0..200 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return addr;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the simulated server did not listen");
    }

    fn post(addr: SocketAddr, path: &str, body: &Value) -> Value {
        use std::io::{Read, Write};
        let body = body.to_string();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        serde_json::from_str(reply.split_once("\r\n\r\n").unwrap().1).unwrap()
    }

    #[test]
    fn streams_tokenizes_and_reports_as_vllm_does() {
        let addr = start(Profile::large());
        let prompt = "w ".repeat(600);
        let body = json!({"model": "m", "prompt": prompt, "max_tokens": 5, "stream": true,
                          "stream_options": {"include_usage": true}});
        let c = stream_completion(
            addr,
            "/v1/completions",
            &body,
            Duration::from_secs(10),
            |_| {},
        )
        .unwrap();
        c.check_intact(5).unwrap();
        assert_eq!(c.text, " tok1 tok2 tok3 tok4 tok5");
        assert_eq!(
            c.text_chunks, 5,
            "a chunk per token, the last with its finish reason"
        );
        assert_eq!(c.prompt_tokens, Some(600));
        assert_eq!(
            c.headers
                .iter()
                .find(|(k, _)| k == "x-served-by")
                .map(|(_, v)| v.as_str()),
            Some("gpu1")
        );
        // The same prompt again: its 37 full blocks (592 tokens) are cached.
        stream_completion(
            addr,
            "/v1/completions",
            &body,
            Duration::from_secs(10),
            |_| {},
        )
        .unwrap()
        .check_intact(5)
        .unwrap();
        let t = post(addr, "/tokenize", &json!({"model": "m", "prompt": "a b c"}));
        assert_eq!(t["count"], 3);
        assert_eq!(t["tokens"].as_array().unwrap().len(), 3);
        let (status, load) = http_get_status(addr, "/get_load", Duration::from_secs(2)).unwrap();
        assert_eq!(status, 200);
        let load: Value = serde_json::from_str(&load).unwrap();
        assert_eq!(load[0]["num_reqs"], 0);
        let (_, page) = http_get_status(addr, "/metrics", Duration::from_secs(2)).unwrap();
        let s = balancer::steering::telemetry::signals::extract(
            &balancer::steering::telemetry::page::parse(&page).unwrap(),
        );
        assert_eq!(
            (s.running, s.waiting, s.kv_usage),
            (Some(0.0), Some(0.0), Some(0.0))
        );
        assert_eq!(s.kv_capacity_tokens, Some(65_536.0));
        assert_eq!(s.prefix_cache_counts, Some((592.0, 1200.0)));
        assert_eq!(s.tokens_total, Some(1200.0 + 10.0));
        assert_eq!(s.ttft_sum_count.map(|(_, n)| n), Some(2.0));
        let (prefill, finished) = s.prefill_sum_count.expect("prefill histogram");
        assert_eq!(finished, 2.0);
        assert!(prefill > 0.0 && prefill < s.ttft_sum_count.unwrap().0 + 1e-9);
        assert_eq!(
            s.prompt_sum_count,
            Some((1200.0, 2.0)),
            "two prompts of 600"
        );
        assert_eq!(s.models, vec!["m".to_string()]);
        // Asked for the samples the balancer reads (prometheus_client's `name[]` filter, as
        // vLLM serves it): a small page with the same signals.
        let query = balancer::steering::telemetry::signals::vllm_query();
        let (_, cut) =
            http_get_status(addr, &format!("/metrics{query}"), Duration::from_secs(2)).unwrap();
        assert!(
            cut.len() * 4 < page.len(),
            "{} of {} bytes",
            cut.len(),
            page.len()
        );
        assert!(
            !cut.contains("inter_token_latency")
                && cut.contains("# TYPE vllm:num_requests_running gauge")
        );
        let cut = balancer::steering::telemetry::signals::extract(
            &balancer::steering::telemetry::page::parse(&cut).unwrap(),
        );
        assert_eq!(cut, s);
        // Errors as vLLM words them.
        let e = post(
            addr,
            "/v1/completions",
            &json!({"model": "x", "prompt": "a"}),
        );
        assert!(
            e["message"].as_str().unwrap().contains("does not exist"),
            "{e}"
        );
    }
}
