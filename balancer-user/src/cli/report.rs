use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use balancer::serve::report::gpu::GpuSource;
use balancer::serve::report::passive::PassiveLatency;
use balancer::serve::report::{LocalPage, Reporter};
use balancer::state::wire::ChangeResult;
use clap::ArgGroup;
use tokio::signal::unix::{SignalKind, signal};

use super::client_args::{ClientArgs, print_json};
use super::{EXIT_FAILURE, EXIT_INVALID, runtime};

/// Report this backend's load to the balancer (run it on each backend host): free GPU
/// memory and utilisation from NVML, plus, with --scrape, the local inference server's
/// queue, KV-cache use and token rate, and with --passive-latency the time to first token and
/// inter-token latency measured on this host's interface. Serve it as a page the daemon
/// scrapes, push it to the daemon's API, or print it once.
#[derive(Debug, clap::Args)]
#[command(
    group(ArgGroup::new("mode").required(true).args(["once", "serve", "push"])),
    after_help = "Examples:\n  \
        balancer report --once\n  \
        balancer report --serve 0.0.0.0:9400          # daemon: telemetry.extra = [\"9400/metrics\"]\n  \
        balancer report --push --backend 10.0.0.11 --connect lb1:9100 --token-file /etc/balancer/token \\\n      \
        --scrape http://127.0.0.1:8000/metrics        # daemon: telemetry.source = \"push\"\n  \
        balancer report --once --gpu-stats-file /run/gpu.csv   # file written by nvidia-smi (see --gpu-stats-file)\n  \
        sudo balancer report --serve 0.0.0.0:9400 --passive-latency eth0 --latency-port 8000   # TTFT of any server"
)]
pub struct ReportArgs {
    /// Print one report as JSON and exit.
    #[arg(long)]
    once: bool,
    /// Serve the GPU figures at http://ADDR/metrics, named like the DCGM exporter's (and the
    /// --passive-latency histograms).
    #[arg(long, value_name = "ADDR", conflicts_with = "scrape")]
    serve: Option<SocketAddr>,
    /// Push a report every --interval-ms to the daemon's API (over --connect with
    /// --token-file, or the local --socket). The VIP must have telemetry.source = "push".
    #[arg(long, requires = "backend")]
    push: bool,
    /// This backend's address as the balancer's config lists it (for --push).
    #[arg(long)]
    backend: Option<IpAddr>,
    /// Read the GPUs from a file holding the output of `nvidia-smi
    /// --query-gpu=index,name,memory.used,memory.total,utilization.gpu
    /// --format=csv,noheader,nounits` (re-read every round) instead of NVML.
    #[arg(long, value_name = "FILE", conflicts_with = "no_gpu")]
    gpu_stats_file: Option<PathBuf>,
    /// Report no GPU figures (only the pages given with --scrape, and --passive-latency).
    #[arg(long)]
    no_gpu: bool,
    /// A local metrics page to add to the report, http://IP:PORT/PATH (repeatable), e.g.
    /// vLLM's http://127.0.0.1:8000/metrics.
    #[arg(long = "scrape", value_name = "URL")]
    scrape: Vec<LocalPage>,
    /// Measure each request's time to first token and the spacing of its streamed tokens on
    /// this interface (the one clients' packets arrive on and answers leave by; needs root):
    /// tc programs watch the TCP flows to --latency-port, with no server metrics needed.
    /// Served on the --serve page as balancer_passive_time_to_first_token_seconds and
    /// balancer_passive_inter_token_latency_seconds; the TTFT is the report's when the
    /// --scrape pages have none.
    #[arg(
        long,
        value_name = "INTERFACE",
        requires = "latency_ports",
        conflicts_with = "once"
    )]
    passive_latency: Option<String>,
    /// A server port whose flows --passive-latency watches (repeatable), e.g. 8000.
    #[arg(
        long = "latency-port",
        value_name = "PORT",
        requires = "passive_latency"
    )]
    latency_ports: Vec<u16>,
    /// Push interval, milliseconds (50-60000); keep it under the VIP's policy.stale_after_ms.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
    /// Timeout of each local page read, milliseconds.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
}

pub fn run(args: ReportArgs, opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    if !(50..=60_000).contains(&args.interval_ms) {
        eprintln!(
            "error: --interval-ms {} is out of range (50-60000)",
            args.interval_ms
        );
        return Ok(ExitCode::from(EXIT_INVALID));
    }
    if !(10..=60_000).contains(&args.timeout_ms) {
        eprintln!(
            "error: --timeout-ms {} is out of range (10-60000)",
            args.timeout_ms
        );
        return Ok(ExitCode::from(EXIT_INVALID));
    }
    let gpu = match gpu_source(&args) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(EXIT_FAILURE));
        }
    };
    let mut reporter = Reporter::new(
        gpu,
        args.scrape.clone(),
        Duration::from_millis(args.timeout_ms),
        4 << 20,
    );
    if let Some(interface) = &args.passive_latency {
        let attached = PassiveLatency::load(&args.latency_ports).and_then(|mut p| {
            p.attach(interface)?;
            Ok(p)
        });
        match attached {
            Ok(p) => {
                tracing::info!(%interface, ports = ?args.latency_ports, "measuring request latency passively");
                reporter = reporter.with_passive_latency(p);
            }
            Err(e) => {
                eprintln!("error: --passive-latency {interface}: {e}");
                return Ok(ExitCode::from(EXIT_FAILURE));
            }
        }
    }
    let client = opts.client()?;
    runtime()?.block_on(async move {
        if args.once {
            once(reporter).await
        } else if let Some(addr) = args.serve {
            serve(reporter, addr).await
        } else {
            push(reporter, &args, client).await
        }
    })
}

fn gpu_source(args: &ReportArgs) -> Result<GpuSource, String> {
    if args.no_gpu {
        return Ok(GpuSource::None);
    }
    if let Some(path) = &args.gpu_stats_file {
        return Ok(GpuSource::StatsFile(path.clone()));
    }
    #[cfg(feature = "nvml")]
    {
        balancer::serve::report::nvml::NvmlGpus::open().map(|g| GpuSource::Nvml(Box::new(g)))
    }
    #[cfg(not(feature = "nvml"))]
    {
        Err(format!(
            "this build has no NVML support (cargo feature `nvml`); pass --gpu-stats-file with the output of `{}`, or --no-gpu",
            balancer::serve::report::gpu::NVIDIA_SMI_QUERY
        ))
    }
}

async fn once(mut reporter: Reporter) -> anyhow::Result<ExitCode> {
    match reporter.collect().await {
        Ok(report) => {
            print_json(&report);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(EXIT_FAILURE))
        }
    }
}

async fn serve(reporter: Reporter, addr: SocketAddr) -> anyhow::Result<ExitCode> {
    // The first read checks the source before anything binds.
    let first = tokio::task::block_in_place(|| reporter.gpus());
    if let Err(e) = first {
        eprintln!("error: {e}");
        return Ok(ExitCode::from(EXIT_FAILURE));
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let reporter = Arc::new(reporter);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    tracing::info!(%addr, "serving GPU figures at /metrics");
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let reporter = reporter.clone();
            let hostname = hostname.clone();
            async move {
                match tokio::task::spawn_blocking(move || reporter.page(&hostname)).await {
                    Ok(Ok(page)) => (
                        axum::http::StatusCode::OK,
                        [("content-type", "text/plain; version=0.0.4")],
                        page,
                    ),
                    Ok(Err(e)) => {
                        tracing::warn!("building the page: {e}");
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            [("content-type", "text/plain")],
                            format!("building the page: {e}\n"),
                        )
                    }
                    Err(e) => (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        [("content-type", "text/plain")],
                        format!("{e}\n"),
                    ),
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await
        .context("serving /metrics")?;
    Ok(ExitCode::SUCCESS)
}

async fn push(
    mut reporter: Reporter,
    args: &ReportArgs,
    client: balancer::serve::api::client::Client,
) -> anyhow::Result<ExitCode> {
    let client = Arc::new(client);
    let backend = args.backend.context("--push needs --backend")?;
    let path = format!("/v1/backends/{backend}/report");
    let mut tick = tokio::time::interval(Duration::from_millis(args.interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = shutdown();
    tokio::pin!(stop);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(ExitCode::SUCCESS),
            _ = tick.tick() => {}
        }
        let result = match reporter.collect().await {
            Ok(report) => {
                let (client, path) = (client.clone(), path.clone());
                tokio::task::spawn_blocking(move || {
                    client
                        .call::<_, ChangeResult>("POST", &path, Some(&report.signals))
                        .map_err(|e| e.to_string())
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
                .map(|_| ())
            }
            Err(e) => Err(e),
        };
        // Keep going through failures (the daemon may be restarting); log each change of state.
        match result {
            Ok(()) if failing => {
                tracing::info!("reports accepted again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::error!("report not delivered: {e}");
                failing = true;
            }
            Err(e) => tracing::debug!("report not delivered: {e}"),
        }
    }
}

async fn shutdown() {
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}
