//! The simulated inference server's HTTP side, OpenAI-compatible as vLLM serves it:
//! `POST /v1/completions` and `/v1/chat/completions` (streamed as server-sent events, one
//! event per token, or whole), `GET /v1/models`, `/health`, and `/metrics` in vLLM's names.
//! Every answer carries `x-served-by: NAME`, so load generators can tell backends apart.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use super::engine::{Engine, Profile, RequestId};

/// What the engine tells a request's handler.
enum Event {
    /// A token was generated (the count so far).
    Token(u64),
    Done,
}

/// Upper bounds of the time-to-first-token histogram, as vLLM's.
const TTFT_BUCKETS: [f64; 15] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
];

/// A request's outlet, when it arrived, and whether its first token went out.
struct Sink {
    tx: mpsc::UnboundedSender<Event>,
    arrived: Instant,
    first_sent: bool,
}

struct Shared {
    name: String,
    model: String,
    engine: Mutex<Engine>,
    work: Notify,
    sinks: Mutex<HashMap<RequestId, Sink>>,
    next_id: Mutex<RequestId>,
    /// TTFT histogram: counts per bucket (+Inf last), sum, count.
    ttft: Mutex<(Vec<u64>, f64, u64)>,
}

/// Runs a simulated server on `addr` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    name: String,
    model: String,
    profile: Profile,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared {
        name,
        model,
        engine: Mutex::new(Engine::new(profile)),
        work: Notify::new(),
        sinks: Mutex::new(HashMap::new()),
        next_id: Mutex::new(1),
        ttft: Mutex::new((vec![0; TTFT_BUCKETS.len() + 1], 0.0, 0)),
    });
    tokio::spawn(drive(shared.clone()));
    let app = axum::Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .with_state(shared);
    let listener = tokio::net::TcpListener::bind(addr).await?;
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
        if step.tokens.is_empty() {
            shared.work.notified().await;
            continue;
        }
        tokio::time::sleep(step.duration).await;
        let now = Instant::now();
        let mut gone = Vec::new();
        {
            let mut sinks = shared.sinks.lock().expect("sinks");
            for (id, n) in &step.tokens {
                if let Some(sink) = sinks.get_mut(id) {
                    if !sink.first_sent {
                        sink.first_sent = true;
                        let ttft = now.duration_since(sink.arrived).as_secs_f64();
                        let mut h = shared.ttft.lock().expect("ttft");
                        let bucket = TTFT_BUCKETS
                            .iter()
                            .position(|b| ttft <= *b)
                            .unwrap_or(TTFT_BUCKETS.len());
                        h.0[bucket] += 1;
                        h.1 += ttft;
                        h.2 += 1;
                    }
                    if sink.tx.send(Event::Token(*n)).is_err() {
                        gone.push(*id);
                    }
                }
            }
            for id in &step.finished {
                if let Some(sink) = sinks.remove(id) {
                    let _ = sink.tx.send(Event::Done);
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

/// Tokens of a prompt: its whitespace-separated words (a list of token ids counts each).
fn prompt_tokens(prompt: &Value) -> u64 {
    match prompt {
        Value::String(s) => s.split_whitespace().count() as u64,
        Value::Array(items) => items
            .iter()
            .map(|i| if i.is_number() { 1 } else { prompt_tokens(i) })
            .sum(),
        _ => 0,
    }
    .max(1)
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
    prompt: u64,
    max_tokens: u64,
    stream: bool,
    chat: bool,
}

fn parse_ask(shared: &Shared, body: &Bytes, chat: bool) -> Result<Ask, Box<Response>> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?;
    if let Some(m) = v.get("model").and_then(Value::as_str)
        && m != shared.model
    {
        return Err(bad(
            StatusCode::NOT_FOUND,
            format!("The model `{m}` does not exist."),
        ));
    }
    let prompt = if chat {
        let messages = v.get("messages").and_then(Value::as_array).ok_or_else(|| {
            bad(
                StatusCode::BAD_REQUEST,
                "\"messages\" must be a list".into(),
            )
        })?;
        messages
            .iter()
            .map(|m| m.get("content").map_or(0, prompt_tokens))
            .sum::<u64>()
            .max(1)
    } else {
        let p = v
            .get("prompt")
            .ok_or_else(|| bad(StatusCode::BAD_REQUEST, "\"prompt\" is required".into()))?;
        prompt_tokens(p)
    };
    let max_tokens = v
        .get("max_completion_tokens")
        .or_else(|| v.get("max_tokens"))
        .map_or(Some(16), Value::as_u64)
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
        chat,
    })
}

async fn completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    answer(shared, body, false).await
}

async fn chat(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    answer(shared, body, true).await
}

async fn answer(shared: Arc<Shared>, body: Bytes, chat: bool) -> Response {
    let ask = match parse_ask(&shared, &body, chat) {
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
            first_sent: false,
        },
    );
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
    let (prompt, max_tokens) = (ask.prompt, ask.max_tokens);
    let usage = move |completion: u64| json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
    let mut response = if ask.stream {
        let chunk = move |n: Option<u64>, done: bool| -> Bytes {
            let text = n.map(|n| format!(" tok{n}")).unwrap_or_default();
            let finish = if done { json!("length") } else { Value::Null };
            let v = if ask.chat {
                json!({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})
            } else {
                json!({"id": rid, "object": "text_completion", "created": created, "model": model,
                       "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]})
            };
            let mut v = v;
            if done {
                v["usage"] = usage(max_tokens);
            }
            Bytes::from(format!("data: {v}\n\n"))
        };
        let stream = futures_util::stream::unfold((rx, false), move |(mut rx, ended)| {
            let chunk = chunk.clone();
            async move {
                if ended {
                    return None;
                }
                match rx.recv().await {
                    Some(Event::Token(n)) => {
                        Some((Ok::<_, Infallible>(chunk(Some(n), false)), (rx, false)))
                    }
                    Some(Event::Done) | None => {
                        let mut last = chunk(None, true).to_vec();
                        last.extend_from_slice(b"data: [DONE]\n\n");
                        Some((Ok(Bytes::from(last)), (rx, true)))
                    }
                }
            }
        });
        let mut r = Response::new(Body::from_stream(stream));
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        r.headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        r
    } else {
        let mut n = 0;
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Token(k) => n = k,
                Event::Done => break,
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
        axum::Json(v).into_response()
    };
    if let Ok(v) = HeaderValue::from_str(&shared.name) {
        response.headers_mut().insert("x-served-by", v);
    }
    response
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let v = json!({"object": "list", "data": [{"id": shared.model, "object": "model", "created": unix_now(), "owned_by": "sim-llm"}]});
    axum::Json(v).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let (running, waiting, kv, prompt_total, gen_total, kv_tokens) = {
        let e = shared.engine.lock().expect("engine");
        (
            e.running(),
            e.waiting(),
            e.kv_usage(),
            e.prompt_tokens_total,
            e.generation_tokens_total,
            e.profile.kv_tokens,
        )
    };
    let m = &shared.model;
    let l = format!("engine=\"0\",model_name=\"{m}\"");
    let mut page = format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{l}}} {running}\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{l}}} {waiting}\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{l}}} {kv}\n\
         # HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n\
         # TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{{l}}} {prompt_total}\n\
         # HELP vllm:generation_tokens_total Number of generation tokens processed.\n\
         # TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{{l}}} {gen_total}\n\
         # HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0\n\
         # HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n\
         # TYPE vllm:time_to_first_token_seconds histogram\n",
        kv_tokens / 16
    );
    let (buckets, sum, count) = shared.ttft.lock().expect("ttft").clone();
    let mut cumulative = 0;
    for (i, b) in TTFT_BUCKETS.iter().enumerate() {
        cumulative += buckets[i];
        page.push_str(&format!(
            "vllm:time_to_first_token_seconds_bucket{{{l},le=\"{b}\"}} {cumulative}\n"
        ));
    }
    cumulative += buckets[TTFT_BUCKETS.len()];
    page.push_str(&format!(
        "vllm:time_to_first_token_seconds_bucket{{{l},le=\"+Inf\"}} {cumulative}\n\
         vllm:time_to_first_token_seconds_sum{{{l}}} {sum}\nvllm:time_to_first_token_seconds_count{{{l}}} {count}\n"
    ));
    ([("content-type", "text/plain; version=0.0.4")], page).into_response()
}
