//! `balancer-bench`: the benchmarks behind `cargo xtask bench`.

use anyhow::Result;
use balancer_tests::bench::{self, client, control, dataplane, e2e, llm};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "balancer benchmarks; each prints a table and writes target/bench/<name>.json")]
struct Args {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// ns/packet of the XDP program per path (BPF_PROG_TEST_RUN), vs a bare XDP_PASS.
    Dataplane {
        /// Interleaved rounds (the median is reported).
        #[arg(long, default_value_t = 9)]
        rounds: usize,
        /// Runs per syscall for the paths timed with the kernel's repeat.
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
        /// Single-run syscalls per round for the encapsulating paths.
        #[arg(long, default_value_t = 20_000)]
        singles: u32,
    },
    /// The balancer against nftables DNAT, HAProxy (TCP mode) and no balancer, in the same
    /// rack: new connections/s, keep-alive requests/s, UDP packets/s, p50/p99 latency, CPU per
    /// packet.
    E2e {
        /// Rounds (peers interleaved, a fresh rack each; median and spread reported).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds per phase.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Concurrent TCP connections (one generator thread each).
        #[arg(long, default_value_t = 8)]
        connections: usize,
        /// UDP sockets of the generator.
        #[arg(long, default_value_t = 4)]
        udp_sockets: usize,
        /// UDP datagrams in flight per socket.
        #[arg(long, default_value_t = 16)]
        udp_window: usize,
        /// Pin the generator to the last CPU and everything else to the others.
        #[arg(long)]
        pin: bool,
        /// Peers measured, in order: baseline, router (a plain forwarding hop), balancer,
        /// balancer_skb, nftables, haproxy.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "baseline,router,balancer,balancer_skb,nftables,haproxy"
        )]
        peers: Vec<String>,
    },
    /// Maglev build time, slots moved, balance, publish latency, daemon memory.
    Control,
    /// Routing quality on LLM traffic: simulated GPUs of two sizes behind the balancer, one
    /// workload replayed under each policy; TTFT/E2E percentiles, throughput, CDF picture.
    Llm {
        /// A TIMESTAMP,ContextTokens,GeneratedTokens trace (e.g.
        /// ../shared/traces/AzureLLMInferenceTrace_conv.csv); synthetic when absent.
        #[arg(long)]
        trace: Option<std::path::PathBuf>,
        /// Requests replayed (the trace's first ones).
        #[arg(long, default_value_t = 300)]
        requests: usize,
        /// Offered load, requests per second (the trace's timing is compressed to it). The
        /// default pool (2 large + 2 small) saturates near 7 req/s with the trace's requests.
        #[arg(long, default_value_t = 5.0)]
        rate: f64,
        /// Policies compared, in order.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "round-robin,least-conn,maglev,composite"
        )]
        policies: Vec<String>,
        /// GPU profiles of the backends.
        #[arg(long, value_delimiter = ',', default_value = "large,large,small,small")]
        gpus: Vec<String>,
        /// Keep-alive client sessions instead of a connection per request (0).
        #[arg(long, default_value_t = 0)]
        sessions: usize,
        /// Seed of the synthetic workload.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Give up on a request after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
    },
    /// A maintained load generator from PyPI (inference-perf) against the simulated GPU rack
    /// through the balancer (installs it into target/pyenv-inference-perf on first use).
    Client {
        /// Requests per second (Poisson).
        #[arg(long, default_value_t = 3.0)]
        rate: f64,
        /// Seconds of load.
        #[arg(long, default_value_t = 30)]
        seconds: u32,
    },
}

fn main() -> Result<()> {
    match Args::parse().bench {
        Bench::Dataplane {
            rounds,
            repeat,
            singles,
        } => {
            let figures = dataplane::run(rounds, repeat, singles)?;
            let path = bench::write_json("dataplane", &figures)?;
            println!("wrote {}", path.display());
        }
        Bench::E2e {
            rounds,
            seconds,
            connections,
            udp_sockets,
            udp_window,
            pin,
            peers,
        } => {
            if !(0.1..=600.0).contains(&seconds) || !(1..=100).contains(&rounds) {
                anyhow::bail!("--seconds must be in [0.1, 600] and --rounds in 1..=100");
            }
            if !(1..=1024).contains(&connections)
                || !(1..=256).contains(&udp_sockets)
                || !(1..=4096).contains(&udp_window)
            {
                anyhow::bail!(
                    "--connections must be in 1..=1024, --udp-sockets in 1..=256, --udp-window in 1..=4096"
                );
            }
            let peers = peers
                .iter()
                .map(|p| {
                    e2e::Peer::by_key(p).ok_or_else(|| {
                        anyhow::anyhow!("--peers: unknown peer {p:?} (baseline, router, balancer, balancer_skb, nftables, haproxy)")
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let opts = e2e::Options {
                rounds,
                seconds,
                connections,
                udp_sockets,
                udp_window,
                pin,
                peers,
            };
            let figures = e2e::run(&opts)?;
            let path = bench::write_json("e2e", &figures)?;
            println!("wrote {}", path.display());
        }
        Bench::Control => {
            let figures = control::run()?;
            let path = bench::write_json("control", &figures)?;
            println!("wrote {}", path.display());
        }
        Bench::Llm {
            trace,
            requests,
            rate,
            policies,
            gpus,
            sessions,
            seed,
            timeout_secs,
        } => {
            if !(rate > 0.0 && rate <= 1000.0) || requests == 0 {
                anyhow::bail!("--rate must be in (0, 1000] and --requests positive");
            }
            if let Some(g) = gpus
                .iter()
                .find(|g| balancer_tests::sim::engine::Profile::by_name(g).is_none())
            {
                anyhow::bail!("--gpus: unknown profile {g:?} (large or small)");
            }
            let opts = llm::Options {
                trace,
                requests,
                rate,
                policies,
                gpus,
                sessions,
                seed,
                timeout: std::time::Duration::from_secs(timeout_secs),
                out_dir: bench::results_dir().join("llm"),
            };
            let figures = llm::run(&opts)?;
            let path = bench::write_json("llm", &figures)?;
            println!("wrote {}", path.display());
        }
        Bench::Client { rate, seconds } => {
            if !(rate > 0.0 && rate <= 100.0 && (1..=3600).contains(&seconds)) {
                anyhow::bail!("--rate must be in (0, 100] and --seconds in 1..=3600");
            }
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or(std::path::Path::new("."));
            client::run(root, rate, seconds)?;
        }
    }
    Ok(())
}
