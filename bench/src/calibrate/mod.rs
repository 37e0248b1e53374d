//! `cargo xtask bench calibrate`: the simulator against the real vLLM, where it matters for
//! routing policies. Both run side by side in a network namespace: the real vLLM (CPU build,
//! the tiny model) with a 32-block x 128-token KV cache and 4 requests at most, and `sim-llm`
//! given the same cache, batch and token budget and the step and prefill times measured on the
//! real one. Each gets the same burst — 8 concurrent streamed requests (the same prompts, sized
//! in the real tokenizer's tokens), then one prompt twice in a row, then a burst of 8 long prompts
//! with short outputs (prefills that share steps) — while its `/metrics` is read every 50 ms. The
//! timelines (running, waiting, KV use, the token, prefix-cache and preemption counters; the
//! requests without a first token as the balancer derives them from the page, against the
//! client's count) and what they show go to `docs/results/llm/calibration.md` with a picture.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod report;

use report::*;

use anyhow::{Context as _, Result, bail};

use super::Figures;
use crate::load::stats::median;
use balancer::steering::telemetry::store::PrefillQueue;
use balancer_sim::engine::Profile;
use balancer_tests::netns::{Netns, PREFIX, sweep};
use balancer_tests::openai::stream_completion;
use balancer_tests::rack::{Process, binary};
use balancer_tests::vllm::{self, VllmEnv, completion_body, prompt};

/// One reading of a server's page.
#[derive(Clone, Debug, Default)]
struct Reading {
    t: f64,
    running: f64,
    waiting: f64,
    kv: f64,
    prompt_tokens: f64,
    generation_tokens: f64,
    prefix_hits: f64,
    preemptions: f64,
    /// Requests that got a first token, and requests that finished (cumulative).
    first_tokens: f64,
    finished: f64,
    /// Requests without a first token: as the balancer derives them from the page
    /// (`PrefillQueue`), and as the client counts them (sent, no first token yet).
    prefilling: f64,
    unanswered: f64,
}

fn read_page(addr: SocketAddr, t: f64) -> Result<Reading> {
    let page = balancer_tests::traffic::http_get_path(addr, "/metrics", Duration::from_secs(5))?;
    let samples = balancer::steering::telemetry::page::parse(&page)?;
    let sum = |name: &str| -> f64 {
        samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    };
    Ok(Reading {
        t,
        running: sum("vllm:num_requests_running"),
        waiting: sum("vllm:num_requests_waiting"),
        kv: sum("vllm:kv_cache_usage_perc"),
        prompt_tokens: sum("vllm:prompt_tokens_total"),
        generation_tokens: sum("vllm:generation_tokens_total"),
        prefix_hits: sum("vllm:prefix_cache_hits_total"),
        preemptions: sum("vllm:num_preemptions_total"),
        first_tokens: sum("vllm:time_to_first_token_seconds_count"),
        finished: sum("vllm:request_prompt_tokens_count"),
        ..Reading::default()
    })
}

/// Reads `addr`'s page every 50 ms until `stop`.
fn poll(addr: SocketAddr, t0: Instant, stop: Arc<AtomicBool>, out: Arc<Mutex<Vec<Reading>>>) {
    while !stop.load(Ordering::SeqCst) {
        if let Ok(r) = read_page(addr, t0.elapsed().as_secs_f64())
            && let Ok(mut v) = out.lock()
        {
            v.push(r);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Prompt tokens of a text by the real server's tokenizer.
fn real_tokens(addr: SocketAddr, model: &str, text: &str) -> Result<u64> {
    use std::io::{Read, Write};
    let body = serde_json::json!({"model": model, "prompt": text}).to_string();
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let v: serde_json::Value =
        serde_json::from_str(reply.split_once("\r\n\r\n").context("reply")?.1)?;
    v["count"]
        .as_u64()
        .context("no count in /tokenize's answer")
}

/// A prompt for the simulator with as many tokens (words) as the real server makes of `text`.
fn sim_prompt(n: u64) -> String {
    (0..n)
        .map(|i| format!("c{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One streamed request: TTFT and the mean gap between tokens.
fn timed(addr: SocketAddr, model: &str, text: &str, max_tokens: u64) -> Result<(f64, f64)> {
    let c = streamed(addr, model, text, max_tokens)?;
    let ttft = c.ttft.context("no token")?;
    Ok((ttft, (c.e2e - ttft) / (max_tokens.max(2) - 1) as f64))
}

/// One streamed request, checked whole.
fn streamed(
    addr: SocketAddr,
    model: &str,
    text: &str,
    max_tokens: u64,
) -> Result<balancer_tests::openai::Completion> {
    let mut body = completion_body(text, max_tokens);
    body["model"] = model.into();
    let c = stream_completion(
        addr,
        "/v1/completions",
        &body,
        Duration::from_secs(300),
        |_| {},
    )?;
    c.check_intact(max_tokens).map_err(anyhow::Error::msg)?;
    Ok(c)
}

/// A request of a burst: when it was sent and when its first token came, seconds from the
/// burst's start.
#[derive(Clone, Copy, Debug)]
struct Sent {
    at: f64,
    first_token: f64,
}

/// Sends `texts` at once (`max_tokens` each), each request timed from `t0`.
fn concurrently(
    addr: SocketAddr,
    t0: Instant,
    texts: &[String],
    max_tokens: u64,
) -> Result<Vec<Sent>> {
    let handles: Vec<_> = texts
        .iter()
        .map(|t| {
            let t = t.clone();
            std::thread::spawn(move || -> Result<Sent> {
                let at = t0.elapsed().as_secs_f64();
                let c = streamed(addr, vllm::MODEL, &t, max_tokens)?;
                Ok(Sent {
                    at,
                    first_token: at + c.ttft.context("no token")?,
                })
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().map_err(|_| anyhow::anyhow!("client thread"))?)
        .collect()
}

/// What the burst did on one server.
struct Timeline {
    readings: Vec<Reading>,
    /// Seconds from the first request to the last token.
    burst: f64,
    /// The second identical prompt's cached tokens (from the hit counter).
    repeat_hits: f64,
    /// The span of the burst of long prompts.
    long_burst: (f64, f64),
}

/// Plays the burst against `addr` (the prompts as `texts`, in the server's tokens), the repeated
/// prompt, then the burst of long prompts (`long`, 16 output tokens each), reading its page
/// meanwhile.
fn burst(addr: SocketAddr, texts: &[String], repeat: &str, long: &[String]) -> Result<Timeline> {
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let readings = Arc::new(Mutex::new(Vec::new()));
    let poller = {
        let (stop, readings) = (stop.clone(), readings.clone());
        std::thread::spawn(move || poll(addr, t0, stop, readings))
    };
    std::thread::sleep(Duration::from_millis(200));
    let started = t0.elapsed().as_secs_f64();
    let mut sent = concurrently(addr, t0, texts, 600)?;
    let burst = t0.elapsed().as_secs_f64() - started;
    std::thread::sleep(Duration::from_millis(300));
    sent.extend(concurrently(addr, t0, &[repeat.to_string()], 4)?);
    let mid = read_page(addr, 0.0)?.prefix_hits;
    sent.extend(concurrently(addr, t0, &[repeat.to_string()], 4)?);
    let after = read_page(addr, 0.0)?.prefix_hits;
    std::thread::sleep(Duration::from_millis(300));
    let long_start = t0.elapsed().as_secs_f64();
    sent.extend(concurrently(addr, t0, long, 16)?);
    let long_burst = (long_start, t0.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let _ = poller.join();
    let mut readings = readings.lock().map(|v| v.clone()).unwrap_or_default();
    let mut queue = PrefillQueue::default();
    for r in &mut readings {
        r.prefilling = queue.update(r.first_tokens, r.finished, r.running, r.waiting);
        r.unanswered = sent
            .iter()
            .filter(|s| s.at <= r.t && r.t < s.first_token)
            .count() as f64;
    }
    Ok(Timeline {
        readings,
        burst,
        repeat_hits: after - mid,
        long_burst,
    })
}

/// The readings while the burst's requests ran (something running or waiting).
fn busy(r: &[Reading]) -> Vec<Reading> {
    r.iter()
        .filter(|x| x.running > 0.0 || x.waiting > 0.0)
        .cloned()
        .collect()
}

/// Share of consecutive busy readings between which `f` moved (per step: nearly all; per
/// completion: a few).
fn moved_share(r: &[Reading], f: impl Fn(&Reading) -> f64) -> f64 {
    let b = busy(r);
    let pairs = b.len().saturating_sub(1).max(1);
    b.windows(2).filter(|w| f(&w[1]) != f(&w[0])).count() as f64 / pairs as f64
}

/// How much a counter grew over the timeline.
fn growth(r: &[Reading], f: impl Fn(&Reading) -> f64) -> f64 {
    match (r.first(), r.last()) {
        (Some(a), Some(b)) => f(b) - f(a),
        _ => 0.0,
    }
}

/// Mean of `f` over the readings while requests were in flight (by the page or the client),
/// those within `span` if given.
fn busy_mean(t: &Timeline, span: Option<(f64, f64)>, f: impl Fn(&Reading) -> f64) -> f64 {
    let v: Vec<f64> = t
        .readings
        .iter()
        .filter(|r| r.running + r.waiting > 0.0 || r.unanswered > 0.0)
        .filter(|r| span.is_none_or(|(a, b)| r.t >= a && r.t <= b))
        .map(f)
        .collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn peak(r: &[Reading], f: impl Fn(&Reading) -> f64) -> f64 {
    r.iter().map(f).fold(0.0, f64::max)
}

/// Seconds from the burst's start until the counter first moves.
fn first_move(r: &[Reading], f: impl Fn(&Reading) -> f64) -> Option<f64> {
    let base = f(r.first()?);
    let t0 = r.first()?.t;
    r.iter().find(|x| f(x) > base).map(|x| x.t - t0)
}

pub fn run(out_dir: &Path) -> Result<Figures> {
    let env = VllmEnv::find()?;
    let version = env.version()?;
    sweep(&format!("{PREFIX}-cal"));
    let ns = Netns::create(&format!("{PREFIX}-cal"))?;
    let log_dir = std::env::temp_dir().join(format!("{PREFIX}-cal-logs"));
    std::fs::create_dir_all(&log_dir)?;
    let opts = vllm::ServerOptions::new("cal", 32, 4, 0);
    println!("calibration: starting vLLM {version} (32 blocks of 128, 4 at once)");
    let mut real = vllm::Server(vllm::spawn(&env, &ns, &opts, &log_dir)?);
    let real_addr: SocketAddr = ([127, 0, 0, 1], vllm::PORT).into();
    vllm::wait_ready(&ns, real_addr, &mut real.0, vllm::VllmRack::START_LIMIT)?;
    let times = ns.run_in(move || real_times(real_addr, vllm::MODEL, 4))??;
    let (step1, step4, prefill) = (times.step_alone, times.step_together, times.prefill);
    let (base, per_seq) = (times.step_base(), times.per_seq());
    println!(
        "real server: step {:.1} ms with 1 request, {:.1} ms with 4 (base {:.1} ms + {:.2} ms per request), prefill {prefill:.0} tokens/s",
        step1 * 1e3,
        step4 * 1e3,
        base * 1e3,
        per_seq * 1e3
    );
    // The same server as a GPU profile for `balancer-bench llm --gpus @FILE`.
    let cpu = profile("cpu_vllm", 32 * vllm::BLOCK_TOKENS, 4, Some(2048), &times)?;
    write_profile(
        &out_dir.join("calibration.profile"),
        &format!("the CPU vLLM {version} of the calibration (32 blocks of 128 tokens, 4 at once)"),
        &cpu,
        &times,
    )?;
    let sim_port = 8001u16;
    let sim = start_sim(&ns, &log_dir, sim_port, prefill, base, per_seq)?;
    let sim_addr: SocketAddr = ([127, 0, 0, 1], sim_port).into();
    // The burst's prompts, and the same numbers of tokens for the simulator.
    let (real_line, sim_line, counts) =
        ns.run_in(move || -> Result<(Timeline, Timeline, Vec<u64>)> {
            let texts: Vec<String> = (0..8).map(|i| prompt(60, 100 + i)).collect();
            let repeat = prompt(400, 200);
            let long: Vec<String> = (0..8).map(|i| prompt(220, 300 + i)).collect();
            let counts: Vec<u64> = texts
                .iter()
                .chain([&repeat])
                .chain(&long)
                .map(|t| real_tokens(real_addr, vllm::MODEL, t))
                .collect::<Result<_>>()?;
            let real_line = burst(real_addr, &texts, &repeat, &long)?;
            let sim_texts: Vec<String> = counts[..8].iter().map(|n| sim_prompt(*n)).collect();
            let sim_long: Vec<String> = counts[9..].iter().map(|n| sim_prompt(*n)).collect();
            let sim_line = burst(sim_addr, &sim_texts, &sim_prompt(counts[8]), &sim_long)?;
            Ok((real_line, sim_line, counts))
        })??;
    drop(sim);
    drop(real);
    drop(ns);
    report(
        out_dir,
        &version,
        (step1, step4, prefill),
        &counts,
        &real_line,
        &sim_line,
    )
}

/// What a server's timed requests showed.
#[derive(Clone, Copy, Debug)]
pub struct Times {
    /// Seconds between tokens with one request in the batch, and with `together`.
    pub step_alone: f64,
    pub step_together: f64,
    pub together: usize,
    /// Prompt tokens per second.
    pub prefill: f64,
}

impl Times {
    /// What each request in a step adds to its time.
    fn per_seq(&self) -> f64 {
        if self.together < 2 {
            return 0.0;
        }
        ((self.step_together - self.step_alone) / (self.together - 1) as f64).max(1e-4)
    }

    /// A step's fixed time.
    fn step_base(&self) -> f64 {
        (self.step_alone - self.per_seq()).max(1e-4)
    }
}

/// A server's step time with one request and with `together` (at most 4) at once, and its
/// prefill speed (tokens/s): a long prompt's TTFT less a short one's, over its tokens (the
/// server's count, from the usage it reports, else its `/tokenize`).
fn real_times(addr: SocketAddr, model: &str, together: usize) -> Result<Times> {
    let together = together.clamp(1, 4);
    timed(addr, model, &prompt(20, 1), 8)?; // warm-up
    let one: Vec<f64> = (0..3)
        .map(|i| timed(addr, model, &prompt(20, 10 + i), 100).map(|x| x.1))
        .collect::<Result<_>>()?;
    let many: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..together as u64)
            .map(|i| s.spawn(move || timed(addr, model, &prompt(20, 20 + i), 100).map(|x| x.1)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("thread"))
            .collect::<Result<Vec<f64>>>()
    })?;
    let long = prompt(600, 30);
    let short_ttft = median(
        &(0..3)
            .map(|i| timed(addr, model, &prompt(8, 40 + i), 2).map(|x| x.0))
            .collect::<Result<Vec<f64>>>()?,
    );
    let c = streamed(addr, model, &long, 2)?;
    let n = match c.prompt_tokens {
        Some(n) => n,
        None => real_tokens(addr, model, &long)?,
    };
    let long_ttft = c.ttft.context("no token for the long prompt")?;
    Ok(Times {
        step_alone: median(&one),
        step_together: median(&many),
        together,
        prefill: n as f64 / (long_ttft - short_ttft).max(1e-3),
    })
}

/// The GPU profile (`sim-llm --profile`, `balancer-bench llm --gpus`) of a server of
/// `kv_tokens` and `batch` that took `times`; checked as `--gpus` checks it, so a measurement
/// out of range is an error naming the field.
pub fn profile(
    name: &str,
    kv_tokens: u64,
    batch: usize,
    step_tokens: Option<u64>,
    times: &Times,
) -> Result<Profile> {
    let mut spec = format!(
        "{name}:kv={kv_tokens}:prefill={:.0}:decode={:.4}:batch={batch}:per_seq_ms={:.4}",
        times.prefill,
        1.0 / times.step_alone,
        times.per_seq() * 1e3,
    );
    if let Some(t) = step_tokens {
        spec.push_str(&format!(":step_tokens={t}"));
    }
    Profile::parse(&spec).map_err(|e| anyhow::anyhow!("the measured profile {spec}: {e}"))
}

/// Writes `profile` to `path`: a comment saying where it came from, then the profile.
pub fn write_profile(path: &Path, what: &str, profile: &Profile, times: &Times) -> Result<()> {
    let text = format!(
        "# balancer-bench calibrate: {what}; a step of {:.1} ms alone and {:.1} ms with {} at once, prefill {:.0} tokens/s.\n\
         # Use: balancer-bench llm --gpus @{}\n{}\n",
        times.step_alone * 1e3,
        times.step_together * 1e3,
        times.together,
        times.prefill,
        path.display(),
        profile.spec()
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "GPU profile {} written to {}",
        profile.spec(),
        path.display()
    );
    Ok(())
}

/// `calibrate --server`: a running OpenAI-compatible server to describe as a GPU profile.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub addr: SocketAddr,
    /// The model to ask for (None: the first of its `/v1/models`).
    pub model: Option<String>,
    /// The most requests in its batch (vLLM's `--max-num-seqs`: no page says it).
    pub batch: usize,
    /// Its KV cache in tokens (None: from its `/metrics`).
    pub kv_tokens: Option<u64>,
    /// Tokens per step at most (vLLM's `--max-num-batched-tokens`; None: the profile's default).
    pub step_tokens: Option<u64>,
    /// The profile's name.
    pub name: String,
}

/// Measures a running server and returns its profile and what was timed. The server must
/// honour `max_tokens` with `ignore_eos` (vLLM, SGLang, `sim-llm`), or the step times read
/// short outputs.
pub fn measure_server(o: &ServerOptions) -> Result<(Profile, Times)> {
    let model = match &o.model {
        Some(m) => m.clone(),
        None => first_model(o.addr)?,
    };
    let kv = match o.kv_tokens {
        Some(kv) => kv,
        None => kv_tokens_of(o.addr)?,
    };
    println!(
        "calibrating {} (model {model}, {kv} KV tokens, batch {})",
        o.addr, o.batch
    );
    let times = real_times(o.addr, &model, o.batch)?;
    let p = profile(&o.name, kv, o.batch, o.step_tokens, &times)?;
    Ok((p, times))
}

/// The first model a server lists at `/v1/models`.
fn first_model(addr: SocketAddr) -> Result<String> {
    let body = balancer_tests::traffic::http_get_path(addr, "/v1/models", Duration::from_secs(10))
        .with_context(|| format!("reading {addr}/v1/models"))?;
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("{addr}/v1/models is not JSON"))?;
    v.pointer("/data/0/id")
        .and_then(|m| m.as_str())
        .filter(|m| !m.is_empty() && m.len() <= 256)
        .map(str::to_string)
        .with_context(|| format!("{addr}/v1/models lists no model: give --model"))
}

/// A server's KV capacity in tokens from its metrics page, read as the balancer reads it
/// (vLLM's `cache_config_info`, TGI's batch budget), validated.
fn kv_tokens_of(addr: SocketAddr) -> Result<u64> {
    let page = balancer_tests::traffic::http_get_path(addr, "/metrics", Duration::from_secs(10))
        .with_context(|| format!("reading {addr}/metrics"))?;
    let samples = balancer::steering::telemetry::page::parse(&page)
        .with_context(|| format!("parsing {addr}/metrics"))?;
    let signals = balancer::steering::telemetry::signals::extract(&samples)
        .validate()
        .map_err(|e| anyhow::anyhow!("{addr}/metrics: {e}"))?;
    signals
        .into_inner()
        .kv_capacity_tokens
        .map(|kv| kv as u64)
        .with_context(|| {
            format!("{addr}/metrics says no KV capacity (vLLM's cache_config_info, TGI's batch budget): give --kv-tokens")
        })
}

/// The simulator, given the same cache and batch as the real server and its times.
fn start_sim(
    ns: &Netns,
    log_dir: &Path,
    sim_port: u16,
    prefill: f64,
    base: f64,
    per_seq: f64,
) -> Result<Process> {
    let sim_bin = binary("sim-llm")?.to_string_lossy().to_string();
    let argv = [
        sim_bin.as_str(),
        "--listen",
        &format!("0.0.0.0:{sim_port}"),
        "--name",
        "sim",
        "--model",
        vllm::MODEL,
        "--kv-blocks",
        "32",
        "--block-tokens",
        "128",
        "--max-num-seqs",
        "4",
        "--max-batched-tokens",
        "2048",
        "--prefill-tps",
        &format!("{prefill:.0}"),
        "--step-base-ms",
        &format!("{:.3}", base * 1e3),
        "--step-per-seq-ms",
        &format!("{:.3}", per_seq * 1e3),
    ];
    let mut sim = Process::spawn(ns, "sim", &argv, log_dir)?;
    sim.wait_for_log("listening", Duration::from_secs(10))?;
    Ok(sim)
}

#[cfg(test)]
mod tests;
