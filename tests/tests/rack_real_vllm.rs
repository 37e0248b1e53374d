//! Real inference servers behind the balancer (needs root and the real-vLLM environment that
//! `cargo xtask setup` installs): two vLLM servers (CPU build, the project's tiny model) in the
//! rack behind one VIP with the composite policy, one with a KV cache of 4,096 tokens and at most
//! 4 requests running, one with 16,384 tokens and 16. Streamed completions go through the VIP
//! and must arrive intact; the daemon must read each server's real running, waiting, KV use, KV
//! capacity and prefix-cache hits; when the small server's KV cache or queue saturates its weight
//! falls to 0 and new flows go to the other, while streams already on it finish; it comes back
//! once it drains.
//!
//! The servers start once (in parallel: about two minutes here) and every check runs on them in
//! one test, in order.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use balancer::serve::api::client::{Client, Endpoint};
use balancer::state::wire::{Status, VipWeights, WeightRow};
use balancer_tests::netns::Netns;
use balancer_tests::openai::{Completion, stream_completion};
use balancer_tests::topology::*;
use balancer_tests::vllm::{self, MODEL, PORT, VllmEnv, VllmRack, completion_body, prompt};

const VIP: &str = "llm";
const STREAM_TIMEOUT: Duration = Duration::from_secs(240);

fn api(topo: &Topology) -> Client {
    Client::new(Endpoint::Unix(topo.api_socket()))
}

fn weights(topo: &Topology) -> VipWeights {
    let all: Vec<VipWeights> = api(topo).get("/v1/weights").expect("GET /v1/weights");
    all.into_iter()
        .find(|v| v.vip == VIP)
        .expect("the llm VIP in /v1/weights")
}

fn row(w: &VipWeights, backend: IpAddr) -> &WeightRow {
    w.backends
        .iter()
        .find(|b| b.address == backend)
        .unwrap_or_else(|| panic!("{backend} not in the weights: {w:#?}"))
}

/// New flows the VIP has sent each backend.
fn new_flows(topo: &Topology) -> BTreeMap<IpAddr, u64> {
    let s: Status = api(topo).get("/v1/status").expect("GET /v1/status");
    s.vips
        .iter()
        .find(|v| v.name == VIP)
        .expect("the llm VIP in the status")
        .backends
        .iter()
        .map(|b| (b.address, b.new_flows))
        .collect()
}

/// Polls the weights until `ok` holds for them, or fails after `limit` saying `what`.
fn wait_weights(
    topo: &Topology,
    what: &str,
    limit: Duration,
    ok: impl Fn(&VipWeights) -> bool,
) -> VipWeights {
    let started = Instant::now();
    loop {
        let w = weights(topo);
        if ok(&w) {
            return w;
        }
        if started.elapsed() > limit {
            panic!(
                "{what}: not within {limit:?}; weights now {w:#?}\n{}",
                vllm::tail(&topo.logs(), 80)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The peers of the server's sockets on `port` in any state (a short stream may already be
/// closing when it is looked for).
fn peers_in_any_state(ns: &Netns, port: u16) -> BTreeSet<SocketAddr> {
    let out = ns
        .exec(&["ss", "-Htan", &format!("( sport = :{port} )")])
        .expect("ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

/// A streamed completion of `max_tokens` tokens to `addr`, from the client, on its own thread;
/// the thread also sends back the connection's local address once it is up.
fn spawn_stream(
    topo: &Topology,
    addr: SocketAddr,
    words: usize,
    seed: u64,
    max_tokens: u64,
) -> (
    JoinHandle<Result<Result<Completion>>>,
    std::sync::mpsc::Receiver<SocketAddr>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let body = completion_body(&prompt(words, seed), max_tokens);
    let handle = topo
        .client
        .spawn_in(move || {
            stream_completion(addr, "/v1/completions", &body, STREAM_TIMEOUT, |local| {
                let _ = tx.send(local);
            })
        })
        .expect("client thread");
    (handle, rx)
}

/// Joins a stream's thread; panics unless it is intact with `max_tokens` tokens.
fn finish(
    handle: JoinHandle<Result<Result<Completion>>>,
    max_tokens: u64,
    what: &str,
) -> Completion {
    let c = handle
        .join()
        .expect("stream thread")
        .expect("namespace")
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    if let Err(e) = c.check_intact(max_tokens) {
        panic!("{what}: the stream through the balancer is not intact: {e}\n{c:#?}");
    }
    c
}

#[test]
#[ignore = "needs root, network namespaces and the real-vLLM environment; run by cargo xtask test"]
fn real_vllm_servers_behind_the_vip_get_weights_from_their_real_metrics() {
    let env = VllmEnv::find().unwrap_or_else(|e| panic!("{e:#}"));
    let version = env.version().expect("vLLM version");
    let started = Instant::now();
    let mut rack = VllmRack::start(&env, "rv", vllm::small_and_large())
        .unwrap_or_else(|e| panic!("starting the rack with two vLLM servers: {e:#}"));
    println!(
        "two vLLM {version} servers ready in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let (small, large) = (rack.options[0].clone(), rack.options[1].clone());
    let (b_small, b_large): (IpAddr, IpAddr) = (backend4(0).into(), backend4(1).into());
    let config = vllm::balancer_config(&rack.topo);
    rack.topo
        .start_balancer(&config)
        .expect("starting the balancer");
    let topo = &rack.topo;
    let vip = SocketAddr::new(VIP4.into(), PORT);

    // 1. The daemon reads what each server really reports.
    let w = wait_weights(
        topo,
        "reports from both servers",
        Duration::from_secs(30),
        |w| {
            w.backends.iter().all(|b| {
                b.signals
                    .as_ref()
                    .is_some_and(|s| s.kv_capacity_tokens.is_some())
            })
        },
    );
    for (addr, o) in [(b_small, &small), (b_large, &large)] {
        let s = row(&w, addr).signals.clone().expect("signals");
        assert_eq!(
            s.kv_capacity_tokens,
            Some(o.kv_tokens() as f64),
            "{addr}: KV capacity from vllm:cache_config_info ({} blocks of 128)",
            o.kv_blocks
        );
        assert_eq!(s.models, vec![MODEL.to_string()], "{addr}: model_name");
        assert_eq!(
            (s.running, s.waiting, s.kv_usage),
            (Some(0.0), Some(0.0), Some(0.0)),
            "{addr}: an idle server"
        );
    }
    // A 4x larger KV cache takes 4x the weight on an idle pool.
    let (ws, wl) = (row(&w, b_small).weight, row(&w, b_large).weight);
    assert!(
        ws > 0 && wl >= 3 * ws,
        "idle weights small {ws}, large {wl}: {w:#?}"
    );

    // 2. Streams through the VIP arrive intact.
    let warm: Vec<_> = (0..4)
        .map(|i| spawn_stream(topo, vip, 40, 100 + i, 64).0)
        .collect();
    for (i, h) in warm.into_iter().enumerate() {
        finish(h, 64, &format!("warm-up stream {i}"));
    }

    // 3. Streams established on the small server before it saturates: open long ones through
    //    the VIP until two of them landed there (the large one takes about 4 of 5).
    let mut on_small = Vec::new();
    let mut elsewhere = Vec::new();
    for i in 0..40 {
        let (h, rx) = spawn_stream(topo, vip, 40, 200 + i, 400);
        let local = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the stream connected");
        let placed = Instant::now();
        let landed_small = loop {
            if peers_in_any_state(&topo.backends[0], PORT).contains(&local) {
                break Some(true);
            }
            if peers_in_any_state(&topo.backends[1], PORT).contains(&local) {
                break Some(false);
            }
            // A stream the tiny model finished (and the client closed, leaving no trace on
            // the server) before `ss` saw it cannot be placed: it is no use here, not a fault.
            if h.is_finished() {
                break None;
            }
            if placed.elapsed() > Duration::from_secs(5) {
                let outcome = if h.is_finished() {
                    format!(
                        "{:?}",
                        h.join()
                            .map(|r| r.map(|c| c.map(|c| (c.status, c.text_chunks, c.done))))
                    )
                } else {
                    "still running".into()
                };
                let seen: Vec<_> = topo.backends[..2]
                    .iter()
                    .map(|b| peers_in_any_state(b, PORT))
                    .collect();
                panic!(
                    "connection {local} is on neither server (their peers: {seen:?}); its stream: {outcome}"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        match landed_small {
            Some(true) => on_small.push(h),
            Some(false) => elsewhere.push(h),
            None => {
                finish(h, 400, &format!("stream {i}, done before it was placed"));
            }
        }
        if on_small.len() == 2 {
            break;
        }
    }
    assert_eq!(
        on_small.len(),
        2,
        "40 connections, fewer than 2 on the small server"
    );

    // 4. Saturate the small server directly (not through the VIP): 16 long requests on a
    //    4-request, 4,096-token server fill its KV cache and queue the rest. Step 5 tops the
    //    queue up, so the server stays saturated however fast the machine runs.
    let direct_to_small =
        |seed: u64| spawn_stream(topo, SocketAddr::new(b_small, PORT), 40, seed, 900).0;
    let mut direct: Vec<_> = (0..16).map(|i| direct_to_small(300 + i)).collect();
    let w = wait_weights(
        topo,
        "the small server's weight at 0 once saturated",
        Duration::from_secs(60),
        |w| {
            let r = row(w, b_small);
            r.weight == 0 && r.reason.starts_with("saturated")
        },
    );
    let s = row(&w, b_small).signals.clone().expect("signals");
    println!(
        "small server saturated: {} (running {:?}, waiting {:?}, KV {:?})",
        row(&w, b_small).reason,
        s.running,
        s.waiting,
        s.kv_usage
    );
    assert!(
        s.running.is_some_and(|r| r <= 4.0) && s.waiting.is_some_and(|q| q >= 1.0),
        "a saturated 4-request server: {s:?}"
    );
    // Its requests without a first token, from its counters: some of the 16 have not started
    // (a request preempted after its first token waits too, so not every waiting one), and
    // never more than those in flight.
    let in_flight = s.running.unwrap_or(0.0) + s.waiting.unwrap_or(0.0);
    assert!(
        s.prefilling.is_some_and(|p| p >= 1.0 && p <= in_flight),
        "requests without a first token on a saturated server: {s:?}"
    );
    assert!(row(&w, b_large).weight > 0, "{w:#?}");
    let (code, table, _) = topo.cli(&["weights", VIP]).expect("balancer weights");
    assert_eq!(code, 0);
    assert!(
        table.contains("saturated") && table.contains(&b_small.to_string()),
        "`balancer weights` shows the saturated server:\n{table}"
    );
    println!("{table}");

    // 5. New flows go to the large server while the small one is saturated.
    for i in 0..6 {
        // Fewer than 8 waiting: 8 more, before the queue can run dry.
        let waiting = row(&weights(topo), b_small)
            .signals
            .as_ref()
            .and_then(|s| s.waiting)
            .unwrap_or(0.0);
        if waiting < 8.0 {
            let next = 316 + 8 * i;
            direct.extend((next..next + 8).map(direct_to_small));
        }
        wait_weights(
            topo,
            "the small server still saturated",
            Duration::from_secs(30),
            |w| row(w, b_small).weight == 0,
        );
        let before = new_flows(topo);
        let (h, _) = spawn_stream(topo, vip, 20, 400 + i, 16);
        finish(
            h,
            16,
            &format!("new stream {i} while the small server is saturated"),
        );
        let after = new_flows(topo);
        assert_eq!(
            after.get(&b_small),
            before.get(&b_small),
            "a new flow went to the saturated server (before {before:?}, after {after:?})"
        );
        assert!(after.get(&b_large) > before.get(&b_large), "{after:?}");
    }

    // 6. The streams established on it finish intact, and so does the direct load.
    for (i, h) in on_small.into_iter().enumerate() {
        finish(
            h,
            400,
            &format!("stream {i} established on the small server"),
        );
    }
    for (i, h) in elsewhere.into_iter().enumerate() {
        finish(h, 400, &format!("stream {i} on the large server"));
    }
    for (i, h) in direct.into_iter().enumerate() {
        finish(h, 900, &format!("direct request {i} to the small server"));
    }

    // 7. Drained, it takes new flows again.
    let w = wait_weights(
        topo,
        "the small server back in rotation once drained",
        Duration::from_secs(60),
        |w| row(w, b_small).weight > 0,
    );
    println!(
        "small server back: weight {} ({})",
        row(&w, b_small).weight,
        row(&w, b_small).reason
    );

    // 8. Prefix caching: the same 300-word prompt twice on the large server; the second finds
    //    its leading blocks cached, and the daemon shows the hit rate.
    let shared = prompt(300, 7);
    for round in 0..2 {
        let body = completion_body(&shared, 8);
        let addr = SocketAddr::new(b_large, PORT);
        let c = topo
            .client
            .run_in(move || {
                stream_completion(addr, "/v1/completions", &body, STREAM_TIMEOUT, |_| {})
            })
            .expect("namespace")
            .expect("prefix request");
        c.check_intact(8)
            .unwrap_or_else(|e| panic!("prefix request {round}: {e}"));
    }
    let w = wait_weights(
        topo,
        "a prefix-cache hit rate for the large server",
        Duration::from_secs(30),
        |w| {
            row(w, b_large)
                .signals
                .as_ref()
                .and_then(|s| s.prefix_cache_hit_rate)
                .is_some_and(|r| r > 0.0)
        },
    );
    let rate = row(&w, b_large)
        .signals
        .as_ref()
        .and_then(|s| s.prefix_cache_hit_rate)
        .unwrap_or_default();
    println!("large server prefix-cache hit rate {:.0}%", rate * 100.0);
    let metrics = topo
        .lb
        .run_in(|| {
            balancer_tests::traffic::http_get_status(
                vllm::METRICS.parse().expect("address"),
                "/metrics",
                Duration::from_secs(5),
            )
        })
        .expect("namespace")
        .expect("the daemon's /metrics");
    let line = metrics
        .1
        .lines()
        .find(|l| {
            l.starts_with("balancer_backend_prefix_cache_hit_rate{")
                && l.contains(&format!("backend=\"{b_large}\""))
        })
        .unwrap_or_else(|| panic!("no prefix-cache hit rate on /metrics:\n{}", metrics.1));
    println!("{line}");
}
