//! `balancer run`: validate the config, learn the interface and next hops, load the XDP program,
//! fill its maps, attach it, then serve until SIGINT/SIGTERM (SIGHUP re-reads the config).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use aya::programs::XdpMode;
use balancer_common::stats::Counter;
use tokio::signal::unix::{SignalKind, signal};

use crate::balancer::Balancer;
use crate::config::{AttachMode, Config, MacAddr};
use crate::dataplane::kernel::KernelDataplane;
use crate::ebpf;
use crate::netinfo::{Interface, resolve_next_hops};
use crate::settings::data_plane_settings;

/// Options of `balancer run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub config_path: PathBuf,
    /// How long to wait for a backend's next hop to resolve.
    pub neighbour_timeout: Duration,
}

/// The XDP attach mode for a config value.
pub fn xdp_mode(mode: AttachMode) -> XdpMode {
    match mode {
        AttachMode::Native => XdpMode::Driver,
        AttachMode::Skb => XdpMode::Skb,
    }
}

/// Next-hop MACs for the backends of `config` that do not name one.
pub fn backend_macs(
    config: &Config,
    iface: &Interface,
    timeout: Duration,
) -> Result<HashMap<IpAddr, MacAddr>> {
    let mut wanted: Vec<IpAddr> = config
        .vips
        .iter()
        .flat_map(|v| v.backends.iter())
        .filter(|b| b.mac.is_none())
        .map(|b| b.address)
        .collect();
    wanted.sort();
    wanted.dedup();
    resolve_next_hops(iface, &wanted, timeout).context("resolving backend MAC addresses")
}

struct Loaded {
    config: Config,
    iface: Interface,
    macs: HashMap<IpAddr, MacAddr>,
}

fn prepare(path: &Path, neighbour_timeout: Duration) -> Result<Loaded> {
    let config = Config::load(path)?;
    let iface = Interface::by_name(&config.interface)
        .with_context(|| format!("interface {:?} from {}", config.interface, path.display()))?;
    let macs = backend_macs(&config, &iface, neighbour_timeout)?;
    Ok(Loaded {
        config,
        iface,
        macs,
    })
}

/// Runs the daemon until SIGINT or SIGTERM, then detaches the program.
pub async fn run(opts: RunOptions) -> Result<()> {
    // Everything that can be checked is checked before the kernel is touched.
    let Loaded {
        config,
        iface,
        macs,
    } = prepare(&opts.config_path, opts.neighbour_timeout)?;
    let settings = data_plane_settings(&config, &iface, crate::dataplane::sys::random_u64())?;

    let mut object =
        ebpf::load_balancer(config.conntrack.max_flows).context("loading the XDP program")?;
    match aya_log::EbpfLogger::init(&mut object) {
        Ok(logger) => spawn_ebpf_logger(logger),
        Err(e) => tracing::debug!("no eBPF log channel: {e}"),
    }
    let dataplane = KernelDataplane::from_ebpf(&mut object)?;
    let mut balancer = Balancer::new(dataplane);
    balancer.set_settings(&settings)?;
    balancer.set_removal_grace(config.conntrack.removal_grace);
    let report = balancer.apply(&config.vips, &macs)?;
    tracing::info!(
        vips = report.vips_added,
        build_ms = report.table_build_time.as_secs_f64() * 1e3,
        publish_ms = report.table_publish_time.as_secs_f64() * 1e3,
        "tables published"
    );

    let program = ebpf::program(&mut object, ebpf::BALANCER_PROGRAM)?;
    program
        .attach(&config.interface, xdp_mode(config.attach_mode))
        .with_context(|| {
            format!(
                "attaching XDP to {} in {} mode",
                config.interface, config.attach_mode
            )
        })?;
    tracing::info!(
        interface = %config.interface,
        mode = %config.attach_mode,
        mtu = settings.mtu,
        "balancer ready: XDP program attached"
    );

    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut current = config;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = balancer.expire_retired(std::time::Instant::now()) {
                    tracing::error!("retiring removed backends: {e}");
                }
            }
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = hangup.recv() => {
                match reload(&opts, &current, &iface, &mut balancer) {
                    Ok(config) => current = config,
                    Err(e) => tracing::error!("reload refused, previous config stays in force: {e:#}"),
                }
            }
        }
    }

    if let Ok(stats) = balancer.global_stats() {
        let summary: Vec<String> = Counter::ALL
            .iter()
            .filter(|c| stats.get(**c) > 0)
            .map(|c| format!("{}={}", c.name(), stats.get(*c)))
            .collect();
        tracing::info!("counters at exit: {}", summary.join(" "));
    }
    // Dropping the object detaches the program and frees its maps.
    drop(balancer);
    drop(object);
    tracing::info!("XDP program detached; exiting");
    Ok(())
}

fn reload(
    opts: &RunOptions,
    current: &Config,
    iface: &Interface,
    balancer: &mut Balancer<KernelDataplane>,
) -> Result<Config> {
    let loaded = prepare(&opts.config_path, opts.neighbour_timeout)?;
    if loaded.config.interface != current.interface
        || loaded.config.attach_mode != current.attach_mode
        || loaded.config.conntrack.max_flows != current.conntrack.max_flows
    {
        anyhow::bail!("interface, attach_mode and conntrack.max_flows only change with a restart");
    }
    // The connection table's seed stays: changing it would orphan every tracked flow.
    let settings = data_plane_settings(&loaded.config, iface, balancer.settings().flow_seed)?;
    balancer.set_settings(&settings)?;
    balancer.set_removal_grace(loaded.config.conntrack.removal_grace);
    let report = balancer.apply(&loaded.config.vips, &loaded.macs)?;
    tracing::info!(
        added = report.vips_added,
        removed = report.vips_removed,
        updated = report.vips_updated,
        slots_changed = report.slots_changed,
        "config reloaded"
    );
    Ok(loaded.config)
}

/// Forwards the XDP program's log records (aya-log) to the daemon's log.
pub fn spawn_ebpf_logger<T: log::Log + Send + 'static>(logger: aya_log::EbpfLogger<T>) {
    // SAFETY: the logger owns its ring buffer's descriptor, which stays open and unchanged
    // until the logger is dropped together with the `AsyncFd`.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    };
    match registered.map_err(|e| e.into_parts().1) {
        Ok(mut fd) => {
            tokio::spawn(async move {
                loop {
                    let Ok(mut guard) = fd.readable_mut().await else {
                        break;
                    };
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            });
        }
        Err(e) => tracing::warn!("cannot poll the eBPF log channel: {e}"),
    }
}
