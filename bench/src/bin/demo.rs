//! `cargo xtask demo`: builds the test rack in network namespaces, starts the balancer on it,
//! sends real traffic through the VIPs and prints which backend served what; then changes the
//! weights live (SIGHUP reload) and shows the new spread; then tears everything down (also on
//! failure and Ctrl-C).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use balancer::base::config::AttachMode;
use balancer_tests::configs::to_toml;
use balancer_tests::netns::{PREFIX, is_root, sweep};
use balancer_tests::topology::*;
use balancer_tests::traffic::{echo_stream, http_get, udp_request};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

const REQUESTS: usize = 300;
const TIMEOUT: Duration = Duration::from_secs(5);

fn main() {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_interrupt as *const () as libc::sighandler_t,
        );
    }
    let real_vllm = std::env::args().skip(1).any(|a| a == "--real-vllm");
    let result = demo(real_vllm);
    sweep(&format!("{PREFIX}-demo"));
    match result {
        Ok(()) => println!("\ndemo finished; namespaces removed."),
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            std::process::exit(1);
        }
    }
}

fn config(topo: &Topology, weights: &[u32]) -> String {
    let weights: Vec<Option<u32>> = weights.iter().map(|w| Some(*w)).collect();
    to_toml(&rack_config_weighted(
        topo,
        "l2-dsr",
        AttachMode::Native,
        &weights,
    ))
}

fn spread(topo: &Topology, vip: IpAddr) -> Result<BTreeMap<String, usize>> {
    let addr = SocketAddr::new(vip, HTTP_PORT);
    topo.client
        .run_in(move || -> Result<BTreeMap<String, usize>> {
            let mut served = BTreeMap::new();
            for _ in 0..REQUESTS {
                check_interrupt()?;
                *served.entry(http_get(addr, TIMEOUT)?).or_insert(0) += 1;
            }
            Ok(served)
        })?
        .with_context(|| format!("requests to {addr}"))
}

fn show(title: &str, served: &BTreeMap<String, usize>) {
    println!("  {title}:");
    for (name, n) in served {
        let pct = 100.0 * *n as f64 / REQUESTS as f64;
        println!(
            "    {name:<4} {n:>4} requests {pct:>5.1}%  {}",
            "#".repeat((pct / 2.0) as usize)
        );
    }
}

fn demo(real_vllm: bool) -> Result<()> {
    if !is_root() {
        bail!("the demo creates network namespaces and loads XDP programs: run it as root");
    }
    println!(
        "Building the rack: client, balancer and 3 backends in network namespaces on one bridge"
    );
    let mut topo = Topology::build(TopologyOptions::new("demo"))?;
    topo.attach_peer_pass(AttachMode::Native)?;
    println!("Starting `balancer run` in the balancer namespace (native XDP on its eth0, L2 DSR)");
    topo.start_balancer(&config(&topo, &[1, 1, 1]))?;
    check_interrupt()?;

    println!("\n{REQUESTS} HTTP requests, one fresh TCP connection each, equal weights:");
    show(
        &format!("client -> {VIP4}:{HTTP_PORT}"),
        &spread(&topo, VIP4.into())?,
    );
    show(
        &format!("client -> [{VIP6}]:{HTTP_PORT}"),
        &spread(&topo, VIP6.into())?,
    );

    let udp = topo
        .client
        .run_in(|| udp_request(SocketAddr::new(VIP4.into(), UDP_PORT), "hello", TIMEOUT))??;
    println!("\nUDP {VIP4}:{UDP_PORT} answered: {udp:?}");
    topo.client.run_in(|| {
        echo_stream(
            SocketAddr::new(VIP4.into(), ECHO_PORT),
            4 << 20,
            Duration::from_secs(20),
        )
    })??;
    println!("TCP stream to {VIP4}:{ECHO_PORT}: 4 MiB each way, every byte verified");
    check_interrupt()?;

    println!("\nChanging weights to 1:1:2 live (config rewritten, SIGHUP to the daemon):");
    std::fs::write(
        topo.rack.log_dir.join("balancer.toml"),
        config(&topo, &[1, 1, 2]),
    )?;
    let balancer = topo.process("balancer").context("balancer process")?;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(balancer.pid() as i32, libc::SIGHUP) };
    balancer.wait_for_log("config reloaded", Duration::from_secs(10))?;
    show(
        &format!("client -> {VIP4}:{HTTP_PORT}"),
        &spread(&topo, VIP4.into())?,
    );

    let (code, out, err) = topo.cli(&["status"])?;
    println!("\n`balancer status` (exit {code}):\n{out}{err}");
    let (code, out, err) = topo.cli(&["stop", "--detach"])?;
    println!(
        "`balancer stop --detach` (exit {code}): {}{}",
        out.trim(),
        err.trim()
    );
    let balancer = topo.process("balancer").context("balancer process")?;
    balancer.signal_and_wait(0, Duration::from_secs(10)).ok();
    println!("\nBalancer log:");
    for line in balancer.log_text().lines() {
        println!("  {line}");
    }
    drop(topo);
    check_interrupt()?;
    if real_vllm {
        real_llm_demo()
    } else {
        llm_demo()
    }
}

/// `balancer weights llm`, indented, with the time since `started`.
fn print_weights(topo: &Topology, started: std::time::Instant) -> Result<()> {
    let (_, out, _) = topo.cli(&["weights", "llm"])?;
    println!("--- t = {:>3.0} s", started.elapsed().as_secs_f64());
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        println!("  {line}");
    }
    Ok(())
}

/// Part two on real servers: two vLLM servers (CPU build, the tiny model) of two KV-cache
/// sizes behind the balancer, weights from their real metrics.
fn real_llm_demo() -> Result<()> {
    use balancer::serve::api::client::{Client, Endpoint};
    use balancer::state::wire::Status;
    use balancer_bench::load::stats::percentile;
    use balancer_tests::vllm::{self, VllmEnv, VllmRack};

    let env = VllmEnv::find()?;
    println!(
        "\n== LLM serving on real vLLM {} (CPU build, a tiny model): a small server (4,096 KV tokens, 4 at once) and a large one (16,384, 16), composite policy from their /metrics ==",
        env.version()?
    );
    println!("Starting both servers (1.5-3 minutes on 2 cores)...");
    let t0 = std::time::Instant::now();
    let mut rack = VllmRack::start(&env, "demovllm", vllm::small_and_large())?;
    println!("ready in {:.0} s", t0.elapsed().as_secs_f64());
    check_interrupt()?;
    let config = vllm::balancer_config(&rack.topo);
    rack.topo.start_balancer(&config)?;
    let topo = &rack.topo;
    let handles = play_trace(topo)?;
    let (ttft, failed) = tally(handles)?;
    let mut ttft = ttft;
    let status: Status = Client::new(Endpoint::Unix(topo.api_socket())).get("/v1/status")?;
    let shares: Vec<String> = status
        .vips
        .iter()
        .filter(|v| v.name == "llm")
        .flat_map(|v| &v.backends)
        .map(|b| format!("{} {} new flows", b.address, b.new_flows))
        .collect();
    println!(
        "\nDone: {} streams intact, {failed} failed; TTFT p50 {:.0} ms, p99 {:.0} ms; {}",
        ttft.len(),
        percentile(&mut ttft, 50.0) * 1e3,
        percentile(&mut ttft, 99.0) * 1e3,
        shares.join(", ")
    );
    drop(rack);
    if failed > 0 {
        bail!("{failed} requests failed");
    }
    Ok(())
}

/// Streams 60 requests of the shipped conversation trace through the VIP at 3 per second, one
/// connection each (sized down for the tiny model's 2,048-token context), printing the
/// weights every 3 s until they are done.
fn play_trace(topo: &Topology) -> Result<Vec<StreamHandle>> {
    use balancer_bench::load::workload::shipped_trace;
    use balancer_tests::openai::stream_completion;
    use balancer_tests::vllm::{PORT, completion_body, prompt};
    let workload: Vec<(f64, String, u64)> = shipped_trace()?
        .iter()
        .take(60)
        .enumerate()
        .map(|(i, r)| {
            (
                i as f64 / 3.0,
                prompt((r.prompt_tokens / 8).clamp(10, 300) as usize, i as u64),
                u64::from(r.output_tokens.clamp(16, 600)),
            )
        })
        .collect();
    println!(
        "Streaming {} completions through the VIP at 3 per second, one connection each; `balancer weights llm` every 3 s:",
        workload.len()
    );
    let vip = SocketAddr::new(VIP4.into(), PORT);
    let started = std::time::Instant::now();
    let handles = workload
        .into_iter()
        .map(|(at, text, max_tokens)| {
            topo.client.spawn_in(move || {
                std::thread::sleep(Duration::from_secs_f64(at));
                let body = completion_body(&text, max_tokens);
                stream_completion(
                    vip,
                    "/v1/completions",
                    &body,
                    Duration::from_secs(300),
                    |_| {},
                )
                .and_then(|c| {
                    c.check_intact(max_tokens).map_err(anyhow::Error::msg)?;
                    Ok(c)
                })
            })
        })
        .collect::<Result<Vec<_>>>()?;
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_secs(3));
        check_interrupt()?;
        print_weights(topo, started)?;
    }
    Ok(handles)
}

/// A streamed completion's thread.
type StreamHandle = std::thread::JoinHandle<Result<Result<balancer_tests::openai::Completion>>>;

/// The TTFTs of the intact streams, and how many failed (each failure printed).
fn tally(handles: Vec<StreamHandle>) -> Result<(Vec<f64>, usize)> {
    let mut ttft = Vec::new();
    let mut failed = 0;
    for h in handles {
        match h
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))?
        {
            Ok(Ok(c)) => ttft.extend(c.ttft),
            Ok(Err(e)) | Err(e) => {
                failed += 1;
                eprintln!("  a request failed: {e:#}");
            }
        }
    }
    Ok((ttft, failed))
}

/// Part two: simulated GPUs of two sizes behind the balancer, weights from their metrics.
fn llm_demo() -> Result<()> {
    use balancer_bench::llm::{LLM_PORT, MODEL, composite_rack};
    use balancer_bench::load::client::{self, ClientOptions, Target};
    use balancer_bench::load::stats::percentile;
    use balancer_bench::load::workload::{self, Shape, WorkloadOptions, shipped_trace};

    println!(
        "\n== LLM serving: 2 large + 2 small simulated GPUs (sim-llm), composite policy from their vLLM metrics =="
    );
    let topo = composite_rack("demollm")?;
    // Outputs capped at 300 tokens so the demo's tail stays short.
    let mut work = workload::build(
        &WorkloadOptions {
            shape: Shape::Conversation,
            requests: 120,
            rate: 6.0,
            seed: 7,
            trace_clients: workload::TraceClients::PerRequest,
            trace_time: workload::TraceTime::Rate,
            seconds: 0.0,
        },
        &shipped_trace()?,
    )?;
    for t in work.iter_mut().flat_map(|c| &mut c.turns) {
        t.output_tokens = t.output_tokens.min(300);
    }
    println!(
        "Replaying {} requests of the Azure conversation trace at 6 req/s, streamed, one connection each;\n\
         `balancer weights llm` every 3 s:",
        work.len()
    );
    let target = Target {
        addr: SocketAddr::new(VIP4.into(), LLM_PORT),
        model: MODEL.into(),
    };
    let run = topo.client.spawn_in(move || {
        client::run(
            &target,
            &work,
            ClientOptions {
                timeout: Duration::from_secs(120),
                keep_alive: false,
                bind_sources: true,
                give_up: None,
            },
        )
    })?;
    let started = std::time::Instant::now();
    while !run.is_finished() {
        std::thread::sleep(Duration::from_secs(3));
        check_interrupt()?;
        print_weights(&topo, started)?;
    }
    let outcomes = run
        .join()
        .map_err(|_| anyhow::anyhow!("replay thread panicked"))??;
    let mut ttft: Vec<f64> = outcomes.iter().filter_map(|o| o.ttft).collect();
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    for o in &outcomes {
        *served
            .entry(o.backend.clone().unwrap_or_else(|| "failed".into()))
            .or_insert(0) += 1;
    }
    println!(
        "\nDone: TTFT p50 {:.0} ms, p99 {:.0} ms; requests per backend: {served:?}",
        percentile(&mut ttft, 50.0) * 1e3,
        percentile(&mut ttft, 99.0) * 1e3
    );
    println!(
        "(`cargo xtask bench llm` compares the balancer's policies with two L7 routers over load sweeps of several workload shapes.)"
    );
    Ok(())
}
