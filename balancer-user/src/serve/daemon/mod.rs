//! `balancer run`: validate the config, learn the interface and next hops, load (or adopt) the
//! pinned XDP program and maps, publish the VIPs, then serve the control API, metrics and
//! health checks until told to stop.
//!
//! Restarts lose nothing: the program, its XDP link and its maps are pinned (see
//! [`crate::dataplane::pinning`]). A daemon that finds them adopts them with the saved bookkeeping instead
//! of loading afresh, so forwarding never pauses and the connection table survives, also after
//! SIGKILL. SIGTERM and SIGINT stop the daemon and leave the program forwarding; `balancer stop
//! --detach` (or `POST /v1/stop {"detach": true}`) detaches it and removes the pinned state.
//! SIGHUP re-reads the config file.

mod attach;

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use balancer_common::stats::Counter;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::base::config::Config;
use crate::base::net::MacAddr;
use crate::dataplane::DynDataplane;
use crate::dataplane::ebpf;
use crate::dataplane::kernel::KernelDataplane;
use crate::dataplane::netinfo::{Interface, KernelNextHops, Links};
use crate::dataplane::pinning::Pins;
use crate::serve::api::listener;
use crate::serve::api::server::{ApiState, Tokens, router, router_with_tokens};
use crate::state::metrics::Metrics;
use crate::state::{Daemon, Host};
use crate::steering::ticker::{Loops, Ticker};
use crate::vips::{Balancer, Snapshot};

/// Options of `balancer run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub config_path: PathBuf,
    /// How long to wait for a backend's next hop to resolve.
    pub neighbour_timeout: Duration,
    /// Replace a pinned program by this binary's, atomically, keeping the maps.
    pub replace: bool,
}

/// Next-hop MACs for the backends of `config` that do not name one, each on its link.
pub fn backend_macs(
    config: &Config,
    links: &Links,
    timeout: Duration,
) -> Result<HashMap<IpAddr, MacAddr>> {
    let wanted = config.backends_without_mac();
    links
        .resolve(&KernelNextHops, &wanted, timeout)
        .context("resolving backend MAC addresses")
}

fn read_snapshot(path: &Path) -> Result<Snapshot> {
    let text = std::fs::read(path)
        .with_context(|| format!("reading the state file {}", path.display()))?;
    serde_json::from_slice(&text)
        .with_context(|| format!("parsing the state file {}", path.display()))
}

/// Loads or adopts the data plane and publishes the config. Blocking.
fn start(opts: &RunOptions) -> Result<Daemon> {
    // Everything that can be checked is checked before the kernel is touched.
    let config = Config::load(&opts.config_path)?;
    let links = links_of(&config, &opts.config_path)?;
    let macs = backend_macs(&config, &links, opts.neighbour_timeout)?;
    Tokens::read(&config.api)?;
    // Checked before the program is attached (the listener reads the files again later).
    if let Some(tls) = &config.api.tls {
        crate::serve::api::listener::server_config(tls).map_err(anyhow::Error::msg)?;
    }
    let pins = Pins::new(&config.pin_dir);
    pins.prepare()
        .with_context(|| format!("preparing the pin directory {}", config.pin_dir.display()))?;
    let adopting = pins.has_link();
    let snapshot = if adopting {
        Some(read_snapshot(&config.state_file).with_context(|| {
            format!(
                "a pinned program is attached ({}) but its state cannot be read; `balancer stop --detach --config {}` starts afresh",
                pins.link().display(),
                opts.config_path.display()
            )
        })?)
    } else {
        None
    };
    if opts.replace && !adopting {
        bail!(
            "--replace needs a running (pinned) program at {}; start without --replace",
            pins.link().display()
        );
    }

    let mut object = ebpf::load_balancer_pinned(config.conntrack.max_flows, &pins)
        .context("loading the XDP program")?;
    let (mut balancer, buckets, seed) = open_dataplane(&mut object, snapshot.as_ref())?;
    if buckets != ebpf::flow_buckets(config.conntrack.max_flows) {
        tracing::warn!(
            pinned_buckets = buckets,
            "the pinned connection table keeps its size; a new conntrack.max_flows takes effect after `balancer stop --detach`"
        );
    }
    let report = crate::state::configure(&mut balancer, &config, &links, seed, buckets, &macs)?;
    tracing::info!(
        vips = balancer.vips().count(),
        published = report.tables_published,
        build_ms = report.table_build_time.as_secs_f64() * 1e3,
        publish_ms = report.table_publish_time.as_secs_f64() * 1e3,
        "tables published"
    );

    attach(&mut object, &pins, &config, adopting, opts.replace)?;
    let host = Host {
        links,
        pins,
        next_hops: Box::new(KernelNextHops),
        neighbour_timeout: opts.neighbour_timeout,
        routes: Box::new(crate::steering::fleet::bgp::Bird),
    };
    let daemon = Daemon::new(
        config,
        opts.config_path.clone(),
        host,
        balancer,
        Metrics::new()?,
    );
    daemon.record(&report);
    daemon.persist_state();
    Ok(daemon)
}

/// The links the daemon runs on: the clients' interface, and NAT's backends' one when set.
fn links_of(config: &Config, config_path: &Path) -> Result<Links> {
    let iface = Interface::by_name(&config.interface).with_context(|| {
        format!(
            "interface {:?} from {}",
            config.interface,
            config_path.display()
        )
    })?;
    let nat_backends =
        match &config.nat.interface {
            Some(name) => Some(Interface::by_name(name).with_context(|| {
                format!("nat.interface {name:?} from {}", config_path.display())
            })?),
            None => None,
        };
    let links = Links {
        clients: iface,
        nat_backends,
    };
    Ok(links)
}

/// The data plane over the loaded program's maps: adopted with the saved bookkeeping when a
/// snapshot is given, else fresh (a new flow-hash seed). Also the connection table's buckets
/// and the seed.
fn open_dataplane(
    object: &mut aya::Ebpf,
    snapshot: Option<&Snapshot>,
) -> Result<(Balancer<DynDataplane>, u32, u64)> {
    Ok(match snapshot {
        Some(snap) => {
            let dataplane = KernelDataplane::adopt(object)?;
            let buckets = dataplane.flow_buckets();
            let dataplane: DynDataplane = Box::new(dataplane);
            (Balancer::restore(dataplane, snap)?, buckets, snap.flow_seed)
        }
        None => {
            let dataplane = KernelDataplane::from_ebpf(object)?;
            let buckets = dataplane.flow_buckets();
            let dataplane: DynDataplane = Box::new(dataplane);
            (
                Balancer::new(dataplane),
                buckets,
                crate::dataplane::sys::random_u64(),
            )
        }
    })
}

/// Attaches the program (fresh, adopting the pinned links, or replacing the pinned program),
/// and starts reading its log.
fn attach(
    object: &mut aya::Ebpf,
    pins: &Pins,
    config: &Config,
    adopting: bool,
    replace: bool,
) -> Result<()> {
    let how = match (adopting, replace) {
        (false, _) => attach::Start::Fresh,
        (true, false) => attach::Start::Adopt,
        (true, true) => attach::Start::Replace,
    };
    attach::attach_links(object, pins, config, how)?;
    match how {
        attach::Start::Replace => {
            tracing::info!("program replaced atomically; maps and connection table kept")
        }
        attach::Start::Adopt => tracing::info!(
            pin_dir = %pins.dir().display(),
            "adopted the pinned program and maps: forwarding never stopped"
        ),
        attach::Start::Fresh => {}
    }
    if how == attach::Start::Adopt || how == attach::Start::Replace {
        match aya::programs::ProgramInfo::from_pin(pins.program())
            .ok()
            .map(|info| aya_log::EbpfLogger::init_from_id(info.id()))
        {
            Some(Ok(logger)) => spawn_ebpf_logger(logger),
            _ => tracing::debug!("no eBPF log channel for the adopted program"),
        }
    } else {
        match aya_log::EbpfLogger::init(object) {
            Ok(logger) => spawn_ebpf_logger(logger),
            Err(e) => tracing::debug!("no eBPF log channel: {e}"),
        }
    }
    Ok(())
}

/// Binds the API's Unix socket: a fresh socket file, mode 0600. A missing directory is created
/// with mode 0700; an existing one is left as it is (the socket may live in /run or /tmp, whose
/// modes are not the daemon's to change).
fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing a stale {}", path.display()));
        }
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding the API socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Runs the daemon until SIGINT or SIGTERM (the program keeps forwarding) or an API stop.
/// For `block_on` (it waits for threads and locks at its end), not for `tokio::spawn`.
pub async fn run(opts: RunOptions) -> Result<()> {
    // Handlers first: a signal that arrives while the daemon starts waits for the main loop
    // (SIGHUP's default action would end the process; SIGTERM's would skip the shutdown).
    let mut signals = Signals {
        interrupt: signal(SignalKind::interrupt())?,
        terminate: signal(SignalKind::terminate())?,
        hangup: signal(SignalKind::hangup())?,
    };
    let daemon = {
        let opts = opts.clone();
        tokio::task::spawn_blocking(move || start(&opts)).await??
    };
    let config = daemon.config.clone();
    let daemon = Arc::new(Mutex::new(daemon));
    let (stop_tx, mut stop_rx) = watch::channel(None::<bool>);
    let api_state = ApiState {
        daemon: daemon.clone(),
        stop: stop_tx.clone(),
    };
    serve_api(&config, api_state).await?;
    if let Some(addr) = config.metrics.listen {
        serve_metrics(addr, &daemon).await?;
    }

    let loops = Loops::start(&daemon);
    let fleet = crate::steering::fleet::agent::FleetAgent::start(&daemon, |config| {
        crate::steering::fleet::etcd::EtcdStore::new(
            config,
            crate::steering::fleet::agent::CALL_TIMEOUT,
        )
    });
    {
        let d = daemon.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Ok(mut d) = d.lock() {
                d.announce();
            }
        })
        .await;
    }
    tracing::info!(
        interface = %config.interface,
        mode = %config.attach_mode,
        socket = %config.api.socket.display(),
        "balancer ready: XDP program attached"
    );

    // The once-a-second work and the loops' upkeep run on a thread of their own.
    let mut ticker = Ticker::start(daemon.clone(), loops, tokio::runtime::Handle::current())?;
    let detach = loop {
        tokio::select! {
            _ = signals.interrupt.recv() => break false,
            _ = signals.terminate.recv() => break false,
            changed = stop_rx.changed() => {
                break changed.is_ok() && stop_rx.borrow().unwrap_or(false);
            }
            _ = signals.hangup.recv() => {
                reload(&daemon).await;
                ticker.reconcile();
            }
            _ = ticker.ended() => {
                tracing::error!("the once-a-second thread ended; stopping");
                break false;
            }
        }
    };
    // A panic of the thread is the daemon's exit status once the shutdown below is done.
    let ticker_ended = ticker.stop();
    if let Some(fleet) = fleet {
        fleet.stop().await;
    }
    shut_down(&daemon, &config.api.socket, detach)?;
    ticker_ended
}

/// The signals the daemon answers.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

/// Serves the API on its Unix socket, and on TCP (with tokens, TLS where configured) when
/// `[api] listen` is set.
async fn serve_api(config: &Config, api_state: ApiState) -> Result<()> {
    let tokens = Tokens::read(&config.api)?;
    let unix = bind_socket(&config.api.socket)?;
    let app = router(api_state.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(unix, app).await {
            tracing::error!("API socket server: {e}");
        }
    });
    let (Some(addr), Some(tokens)) = (config.api.listen, tokens) else {
        return Ok(());
    };
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the API listener {addr}"))?;
    let app = router_with_tokens(api_state, tokens);
    let tls = match &config.api.tls {
        Some(files) => Some(listener::server_config(files).map_err(anyhow::Error::msg)?),
        None => None,
    };
    tokio::spawn(listener::serve(tcp, tls, app, listener::API_LIMITS, "API"));
    Ok(())
}

/// Serves `/metrics` on `addr`.
async fn serve_metrics(addr: std::net::SocketAddr, daemon: &Arc<Mutex<Daemon>>) -> Result<()> {
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics listener {addr}"))?;
    let page = Arc::new(MetricsPage::default());
    let d = daemon.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (d, page) = (d.clone(), page.clone());
            async move {
                let text = page.get(&d).await;
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    text.to_string(),
                )
            }
        }),
    );
    tokio::spawn(listener::serve(
        tcp,
        None,
        app,
        listener::METRICS_LIMITS,
        "metrics",
    ));
    Ok(())
}

/// Re-reads the config file (SIGHUP); a refused one leaves the one in force.
async fn reload(daemon: &Arc<Mutex<Daemon>>) {
    let d = daemon.clone();
    let result = tokio::task::spawn_blocking(move || match d.lock() {
        Ok(mut d) => d
            .reload("sighup")
            .map(|r| r.message)
            .map_err(|e| e.to_string()),
        Err(_) => Err("daemon state poisoned".to_string()),
    })
    .await;
    match result {
        Ok(Ok(_)) => tracing::info!("config reloaded"),
        Ok(Err(e)) => tracing::error!("reload refused, previous config stays in force: {e}"),
        Err(e) => tracing::error!("reload failed: {e}"),
    }
}

/// Leaves the routers' ECMP set, logs the counters, saves the state and removes the API
/// socket (the one bound at start); with `detach`, also detaches the program and removes the pinned state (else the
/// pinned program keeps forwarding).
fn shut_down(daemon: &Arc<Mutex<Daemon>>, api_socket: &Path, detach: bool) -> Result<()> {
    let mut d = daemon
        .lock()
        .map_err(|_| anyhow::anyhow!("daemon state poisoned"))?;
    // This balancer leaves the routers' ECMP set (the program keeps forwarding what still
    // arrives).
    d.withdraw_all();
    if let Ok(stats) = d.balancer.global_stats() {
        let summary: Vec<String> = Counter::ALL
            .iter()
            .filter(|c| stats.get(**c) > 0)
            .map(|c| format!("{}={}", c.name(), stats.get(*c)))
            .collect();
        tracing::info!("counters at exit: {}", summary.join(" "));
    }
    d.persist_state();
    let _ = std::fs::remove_file(api_socket);
    if detach {
        detach_pinned(&d.pins, &d.config.state_file)?;
        tracing::info!("program detached and pinned state removed; exiting");
    } else {
        tracing::info!(pin_dir = %d.pins.dir().display(), "exiting; the pinned program keeps forwarding");
    }
    Ok(())
}

/// Raises the soft limit of open descriptors to the hard one (the unit's `LimitNOFILE`): the
/// listeners cap their connections, and the rest is for scrapes, health checks and the
/// pinned maps.
pub fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return;
        }
        let before = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
            tracing::debug!(
                from = before,
                to = limit.rlim_cur,
                "raised the open-descriptor limit"
            );
        }
    }
}

/// Makes any panic, on any thread, end the process with SIGABRT once it is logged. A daemon
/// whose thread panicked while holding the state's lock would otherwise stay up half-alive (its
/// API, scrapes, health checks and sweeps failing on the poisoned lock for good) where the
/// service manager cannot see it; ended, it is restarted (`Restart=on-failure`) and the new
/// daemon adopts the pinned program, which forwards all the while.
pub fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!(
            "{info}; aborting (the pinned program keeps forwarding; a restarted daemon adopts it)"
        );
        report(info);
        std::process::abort();
    }));
}

/// The metrics listener's page: rendered at most once a second whoever asks, by one request
/// at a time (the others wait for it and share it), so a flood of scrapes costs the daemon's
/// lock one render a second.
#[derive(Default)]
struct MetricsPage(tokio::sync::Mutex<Option<(std::time::Instant, Arc<String>)>>);

impl MetricsPage {
    const FRESH: Duration = Duration::from_secs(1);

    async fn get(&self, daemon: &Arc<Mutex<Daemon>>) -> Arc<String> {
        let mut cached = self.0.lock().await;
        if let Some((at, text)) = cached.as_ref()
            && at.elapsed() < Self::FRESH
        {
            return text.clone();
        }
        let d = daemon.clone();
        let text = tokio::task::spawn_blocking(move || {
            // The flow counts are refreshed when older than the page; the traffic counters
            // are read afresh (two system calls).
            Daemon::refresh_flow_counts_older_than(&d, Self::FRESH);
            d.lock()
                .map(|mut d| {
                    d.sample();
                    d.render_metrics()
                })
                .unwrap_or_default()
        })
        .await
        .unwrap_or_default();
        let text = Arc::new(text);
        *cached = Some((std::time::Instant::now(), text.clone()));
        text
    }
}

/// Detaches the pinned program and removes the pinned maps and the state file.
pub fn detach_pinned(pins: &Pins, state_file: &Path) -> Result<()> {
    pins.remove()
        .with_context(|| format!("removing the pinned state in {}", pins.dir().display()))?;
    match std::fs::remove_file(state_file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", state_file.display()))
        }
        _ => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn the_socket_never_changes_the_mode_of_a_directory_it_did_not_make() {
        let base =
            std::env::temp_dir().join(format!("balancer-socket-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o1777)).unwrap();
        // An existing, shared directory (as /tmp): its mode stays, the socket is 0600.
        let socket = base.join("b.sock");
        let listener = bind_socket(&socket).unwrap();
        assert_eq!(mode(&base), 0o1777);
        assert_eq!(mode(&socket), 0o600);
        drop(listener);
        // A missing directory is the daemon's own: made 0700.
        let own = base.join("run/balancer");
        let socket = own.join("balancer.sock");
        let _listener = bind_socket(&socket).unwrap();
        assert_eq!(mode(&own), 0o700);
        assert_eq!(mode(&socket), 0o600);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
