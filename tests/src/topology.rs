//! The test rack: a client, a balancer and N backends, each in its own network namespace, on
//! one bridge in a "rack" namespace.
//!
//! ```text
//!   client 10.111.0.10 ─┐
//!   lb     10.111.0.2  ─┼─ br0 (rack) ─┬─ b1 10.111.0.11   VIPs on lo, arp_ignore/announce
//!                       │              ├─ b2 10.111.0.12
//!                       │              └─ b3 10.111.0.13
//! ```
//!
//! The client routes the VIP prefixes (10.111.1.0/24, fd00:111:1::/64) through the balancer;
//! backends hold the VIPs on `lo` (LVS-DR style) and answer the client directly. Everything is
//! torn down on drop: processes killed, namespaces deleted.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::config::AttachMode;
use balancer::ebpf::xdp_mode;

use crate::netns::{Netns, PREFIX, run};

pub const VIP4: Ipv4Addr = Ipv4Addr::new(10, 111, 1, 1);
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x111, 1, 0, 0, 0, 0, 1);
pub const LB4: Ipv4Addr = Ipv4Addr::new(10, 111, 0, 2);
pub const LB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x111, 0, 0, 0, 0, 0, 2);
pub const CLIENT4: Ipv4Addr = Ipv4Addr::new(10, 111, 0, 10);
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x111, 0, 0, 0, 0, 0, 0x10);
pub const HTTP_PORT: u16 = 80;
pub const ECHO_PORT: u16 = 9000;
pub const UDP_PORT: u16 = 5353;
pub const GUE_PORT: u16 = 6080;

/// Backend `i` (0-based) addresses.
pub fn backend4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 111, 0, 11 + i as u8)
}
pub fn backend6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x111, 0, 0, 0, 0, 0, 0x11 + i as u16)
}

/// The BPF filesystem the tests pin on.
pub fn pin_root() -> PathBuf {
    PathBuf::from("/run/blt-bpf")
}

/// Mounts the tests' BPF filesystem at [`pin_root`] unless it is there (once: two tests of
/// one binary starting together must not stack two mounts, the second hiding the first's pins).
pub fn mount_pin_root() -> Result<()> {
    static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MOUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let root = pin_root();
    fs::create_dir_all(&root)?;
    if !balancer::pinning::is_bpffs(&root)? {
        run(
            "mount",
            &["-t", "bpf", "bpf", root.to_str().unwrap_or_default()],
        )?;
    }
    Ok(())
}

/// Where the workspace's binaries are (next to this test's own binaries).
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("BALANCER_BIN_DIR") {
        return dir.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    // Integration tests live in target/<profile>/deps; binaries in target/<profile>.
    if dir.ends_with("deps") {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The path of a workspace binary, with a hint if it was not built.
pub fn binary(name: &str) -> Result<PathBuf> {
    let path = bin_dir().join(name);
    if !path.exists() {
        bail!(
            "{} not found: build the workspace binaries first (cargo build --bins, or cargo xtask test)",
            path.display()
        );
    }
    Ok(path)
}

/// A background process, killed on drop, whose stderr goes to a log file.
pub struct Process {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `argv` in `ns` with stdout and stderr logged to `log_dir/<name>.log`.
    pub fn spawn(ns: &Netns, name: &str, argv: &[&str], log_dir: &Path) -> Result<Process> {
        let log = log_dir.join(format!("{name}.log"));
        let file = fs::File::create(&log)?;
        let mut cmd = ns.command(argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {}", argv.join(" ")))?;
        Ok(Process {
            name: name.to_string(),
            child,
            log,
        })
    }

    /// Waits until the log contains `needle`; fails if the process exits or `timeout` passes.
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            if self.log_text().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before {needle:?}:\n{}",
                    self.name,
                    self.log_text()
                );
            }
            if started.elapsed() > timeout {
                bail!(
                    "{} did not log {needle:?} within {timeout:?}:\n{}",
                    self.name,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal; returns the exit status if it exits within `timeout`.
    pub fn signal_and_wait(
        &mut self,
        signal: i32,
        timeout: Duration,
    ) -> Result<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if started.elapsed() > timeout {
                bail!(
                    "{} did not exit within {timeout:?} after signal {signal}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.is_running() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let started = Instant::now();
            while self.is_running() && started.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A client thread of [`Topology::echo_streams`].
pub type EchoStream = std::thread::JoinHandle<Result<Result<(String, usize), String>>>;

/// Starts `balancer run --config <config>` in `ns` as the process `name`; waits until it is
/// ready.
pub fn start_daemon(ns: &Netns, name: &str, config: &Path, log_dir: &Path) -> Result<Process> {
    let bin = binary("balancer")?;
    let argv = [
        bin.to_str().unwrap_or_default(),
        "run",
        "--config",
        config.to_str().unwrap_or_default(),
    ];
    let mut p = Process::spawn(ns, name, &argv, log_dir)?;
    p.wait_for_log("balancer ready", Duration::from_secs(30))?;
    Ok(p)
}

/// Connects `host` to the bridge `br0` of `rack` by a veth pair: `port` on the bridge, `eth0`
/// in `host` with `addresses` (CIDR), up.
pub fn plug(rack: &Netns, port: &str, host: &Netns, addresses: &[String]) -> Result<()> {
    let r = rack.name();
    run(
        "ip",
        &[
            "-n",
            r,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            host.name(),
        ],
    )?;
    run("ip", &["-n", r, "link", "set", port, "master", "br0", "up"])?;
    let mut script = String::from(
        "sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.eth0.accept_dad=0 2>/dev/null || true",
    );
    for a in addresses {
        let nodad = if a.contains(':') { " nodad" } else { "" };
        script.push_str(&format!("; ip addr add {a} dev eth0{nodad}"));
    }
    script.push_str("; ip link set eth0 up");
    host.sh(&script)?;
    Ok(())
}

/// Attaches the XDP pass-through program to `port` in `rack` (in native mode a veth only
/// receives `XDP_TX` frames when its peer has an XDP program); the object must stay loaded.
pub fn attach_pass(rack: &Netns, port: &str, mode: AttachMode) -> Result<aya::Ebpf> {
    let port = port.to_string();
    rack.run_in(move || -> Result<aya::Ebpf> {
        let mut object = balancer::ebpf::load_decap()?;
        balancer::ebpf::program(&mut object, balancer::ebpf::PASS_PROGRAM)?
            .attach(&port, xdp_mode(mode))
            .with_context(|| format!("attaching the pass program to {port}"))?;
        Ok(object)
    })?
}

/// How to build a rack.
#[derive(Clone, Debug)]
pub struct TopologyOptions {
    /// Distinguishes this rack's namespaces from concurrently running ones.
    pub tag: String,
    pub backends: usize,
    /// MTU of the client's link (lower it for encapsulating modes).
    pub client_mtu: u32,
}

impl TopologyOptions {
    pub fn new(tag: &str) -> Self {
        TopologyOptions {
            tag: tag.to_string(),
            backends: 3,
            client_mtu: 1500,
        }
    }
}

/// The namespaces, links and processes of one rack.
pub struct Topology {
    pub opts: TopologyOptions,
    pub log_dir: PathBuf,
    /// Processes first: they must die before their namespaces go.
    pub processes: Vec<Process>,
    /// XDP pass-through programs on rack-side veth peers (kept loaded while the rack lives).
    pass_programs: Vec<aya::Ebpf>,
    pub client: Netns,
    pub lb: Netns,
    pub backends: Vec<Netns>,
    /// A second balancer's namespace, when a test adds one.
    pub lb2: Option<Netns>,
    pub rack: Netns,
}

impl Topology {
    /// Builds the rack and starts a test backend server in each backend namespace.
    pub fn build(opts: TopologyOptions) -> Result<Topology> {
        let ns = |role: &str| Netns::create(&format!("{PREFIX}-{}-{role}", opts.tag));
        let rack = ns("rack")?;
        let client = ns("client")?;
        let lb = ns("lb")?;
        let backends = (0..opts.backends)
            .map(|i| ns(&format!("b{}", i + 1)))
            .collect::<Result<Vec<_>>>()?;
        let log_dir = std::env::temp_dir().join(format!("{PREFIX}-{}-logs", opts.tag));
        let _ = fs::remove_dir_all(&log_dir);
        // Pinned state of an earlier run of this rack (bpffs outlives namespaces).
        mount_pin_root()?;
        let _ = balancer::pinning::Pins::new(pin_root().join(format!("{PREFIX}-{}", opts.tag)))
            .remove();
        fs::create_dir_all(&log_dir)?;
        let mut topo = Topology {
            opts,
            log_dir,
            processes: Vec::new(),
            pass_programs: Vec::new(),
            client,
            lb,
            backends,
            lb2: None,
            rack,
        };
        topo.wire()?;
        topo.start_backends()?;
        Ok(topo)
    }

    fn wire(&mut self) -> Result<()> {
        self.rack
            .sh("ip link add br0 type bridge && ip link set br0 up; \
             sysctl -qw net.bridge.bridge-nf-call-iptables=0 2>/dev/null || true; \
             sysctl -qw net.bridge.bridge-nf-call-ip6tables=0 2>/dev/null || true")?;
        let mut hosts: Vec<(&Netns, String, String, String)> = vec![
            (
                &self.client,
                "client".into(),
                format!("{CLIENT4}/24"),
                format!("{CLIENT6}/64"),
            ),
            (
                &self.lb,
                "lb".into(),
                format!("{LB4}/24"),
                format!("{LB6}/64"),
            ),
        ];
        for (i, b) in self.backends.iter().enumerate() {
            hosts.push((
                b,
                format!("b{}", i + 1),
                format!("{}/24", backend4(i)),
                format!("{}/64", backend6(i)),
            ));
        }
        for (host, port, v4, v6) in &hosts {
            plug(&self.rack, port, host, &[v4.clone(), v6.clone()])?;
        }
        self.client.sh(&format!(
            "ip link set eth0 mtu {mtu}; \
             ip route add 10.111.1.0/24 via {LB4}; ip -6 route add fd00:111:1::/64 via {LB6}; \
             ethtool -K eth0 tx off tso off gso off >/dev/null 2>&1 || \
               {{ echo 'ethtool is missing: run cargo xtask setup' >&2; exit 1; }}",
            mtu = self.opts.client_mtu,
        ))?;
        for b in &self.backends {
            b.sh(&format!(
                "ip addr add {VIP4}/32 dev lo; ip -6 addr add {VIP6}/128 dev lo nodad; \
                 sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
                   net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2 \
                   net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0"
            ))?;
        }
        Ok(())
    }

    fn start_backends(&mut self) -> Result<()> {
        for i in 0..self.backends.len() {
            self.start_backend_server(i)?;
        }
        Ok(())
    }

    /// Starts the test server of backend `i` (0-based), named `server-b<i+1>`.
    pub fn start_backend_server(&mut self, i: usize) -> Result<()> {
        let server = binary("test-backend")?;
        let server = server.to_string_lossy().to_string();
        let name = format!("b{}", i + 1);
        let (own4, own6) = (backend4(i).to_string(), backend6(i).to_string());
        let (v4, v6) = (VIP4.to_string(), VIP6.to_string());
        let metrics = self.metrics_file(i).to_string_lossy().to_string();
        let models = self.models_file(i).to_string_lossy().to_string();
        let argv = [
            server.as_str(),
            "--name",
            &name,
            "--http-port",
            "80",
            "--echo-port",
            "9000",
            "--udp-port",
            "5353",
            "--udp-addr",
            &v4,
            "--udp-addr",
            &v6,
            "--udp-addr",
            &own4,
            "--udp-addr",
            &own6,
            "--metrics-file",
            &metrics,
            "--models-file",
            &models,
        ];
        let process_name = format!("server-{name}");
        self.processes.retain(|p| p.name != process_name);
        let mut p = Process::spawn(&self.backends[i], &process_name, &argv, &self.log_dir)?;
        p.wait_for_log("listening", Duration::from_secs(10))?;
        self.processes.push(p);
        Ok(())
    }

    /// The file backend `i`'s server serves at `/metrics` (absent until a test writes it).
    pub fn metrics_file(&self, i: usize) -> PathBuf {
        self.log_dir.join(format!("metrics-b{}.prom", i + 1))
    }

    /// The file listing (comma-separated) the models backend `i`'s server answers at
    /// `/v1/models` (none until a test writes it).
    pub fn models_file(&self, i: usize) -> PathBuf {
        self.log_dir.join(format!("models-b{}.txt", i + 1))
    }

    /// Kills the test server of backend `i` (0-based).
    pub fn kill_backend_server(&mut self, i: usize) -> Result<()> {
        let name = format!("server-b{}", i + 1);
        let p = self.process(&name).with_context(|| format!("no {name}"))?;
        p.signal_and_wait(libc::SIGKILL, Duration::from_secs(5))?;
        self.processes.retain(|p| p.name != name);
        Ok(())
    }

    /// Starts `balancer run` again with the config `start_balancer` wrote, plus `args`.
    pub fn restart_balancer(&mut self, args: &[&str]) -> Result<()> {
        let path = self.log_dir.join("balancer.toml");
        let bin = binary("balancer")?;
        let mut argv = vec![
            bin.to_string_lossy().to_string(),
            "run".to_string(),
            "--config".to_string(),
            path.to_string_lossy().to_string(),
        ];
        argv.extend(args.iter().map(|a| (*a).to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.processes.retain(|p| p.name != "balancer");
        let mut p = Process::spawn(&self.lb, "balancer", &argv, &self.log_dir)?;
        p.wait_for_log("balancer ready", Duration::from_secs(30))?;
        self.processes.push(p);
        Ok(())
    }

    /// Attaches an XDP pass-through program to the rack side of the balancer's link: in native
    /// mode a veth only receives `XDP_TX` frames when its peer has an XDP program.
    pub fn attach_peer_pass(&mut self, mode: AttachMode) -> Result<()> {
        let object = attach_pass(&self.rack, "lb", mode)?;
        self.pass_programs.push(object);
        Ok(())
    }

    /// A second balancer on the rack (namespace `lb2`, 10.111.0.3 / fd00:111::3), running the
    /// first one's config with its own pins, state file and socket: what an ECMP peer of the
    /// first balancer is. Its process is `balancer2`.
    pub fn start_second_balancer(&mut self) -> Result<()> {
        let ns = Netns::create(&format!("{PREFIX}-{}-lb2", self.opts.tag))?;
        plug(
            &self.rack,
            "lb2",
            &ns,
            &["10.111.0.3/24".into(), "fd00:111::3/64".into()],
        )?;
        let object = attach_pass(&self.rack, "lb2", AttachMode::Native)?;
        self.pass_programs.push(object);
        let first = fs::read_to_string(self.log_dir.join("balancer.toml"))?;
        let pins = self.second_pin_dir();
        let _ = balancer::pinning::Pins::new(pins.clone()).remove();
        let config = first
            .replace(
                &self.pin_dir().display().to_string(),
                &pins.display().to_string(),
            )
            .replace("state.json", "state2.json")
            .replace("api.sock", "api2.sock");
        let path = self.log_dir.join("balancer2.toml");
        fs::write(&path, config)?;
        let p = start_daemon(&ns, "balancer2", &path, &self.log_dir)?;
        self.processes.push(p);
        self.lb2 = Some(ns);
        Ok(())
    }

    /// `n` long-lived echo streams from the client, alternating the IPv4 and IPv6 echo VIPs,
    /// each exchanging verified data until `until`: each thread's result is its backend and
    /// the bytes echoed, or what broke.
    pub fn echo_streams(
        &self,
        n: usize,
        until: Instant,
        timeout: Duration,
    ) -> Result<Vec<EchoStream>> {
        (0..n)
            .map(|i| {
                let vip = if i % 2 == 0 {
                    IpAddr::from(VIP4)
                } else {
                    IpAddr::from(VIP6)
                };
                let addr = std::net::SocketAddr::new(vip, ECHO_PORT);
                self.client.spawn_in(move || {
                    crate::traffic::echo_until(addr, until, timeout).map_err(|e| format!("{e:#}"))
                })
            })
            .collect()
    }

    /// Writes `config` and starts `balancer run` in the balancer namespace; waits until ready.
    pub fn start_balancer(&mut self, config: &str) -> Result<()> {
        let path = self.log_dir.join("balancer.toml");
        fs::write(&path, config)?;
        let p = start_daemon(&self.lb, "balancer", &path, &self.log_dir)?;
        self.processes.push(p);
        Ok(())
    }

    /// Starts `balancer decap` on every backend; waits until ready.
    pub fn start_decap(&mut self, mode: AttachMode) -> Result<()> {
        let bin = binary("balancer")?;
        let bin = bin.to_string_lossy().to_string();
        let mode = mode.to_string();
        let gue = GUE_PORT.to_string();
        for i in 0..self.backends.len() {
            let argv = [
                bin.as_str(),
                "decap",
                "--interface",
                "eth0",
                "--mode",
                &mode,
                "--gue-port",
                &gue,
            ];
            let mut p = Process::spawn(
                &self.backends[i],
                &format!("decap-b{}", i + 1),
                &argv,
                &self.log_dir,
            )?;
            p.wait_for_log("decap ready", Duration::from_secs(30))?;
            self.processes.push(p);
        }
        Ok(())
    }

    /// Where this rack's balancer pins its program and maps: on the tests' own bpffs (bpffs is
    /// not per network namespace, and `ip netns exec` hides /sys/fs/bpf).
    pub fn pin_dir(&self) -> PathBuf {
        pin_root().join(format!("{PREFIX}-{}", self.opts.tag))
    }

    /// The second balancer's pin directory (bpffs refuses names with a dot).
    pub fn second_pin_dir(&self) -> PathBuf {
        pin_root().join(format!("{PREFIX}-{}-lb2", self.opts.tag))
    }

    /// The balancer's control socket.
    pub fn api_socket(&self) -> PathBuf {
        self.log_dir.join("api.sock")
    }

    /// Runs the `balancer` CLI against this rack's daemon; returns (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> Result<(i32, String, String)> {
        let bin = binary("balancer")?;
        let out = std::process::Command::new(bin)
            .args(args)
            .arg("--socket")
            .arg(self.api_socket())
            .stdin(Stdio::null())
            .output()?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// The running process called `name`.
    pub fn process(&mut self, name: &str) -> Option<&mut Process> {
        self.processes.iter_mut().find(|p| p.name == name)
    }

    /// All process logs, for failure messages.
    pub fn logs(&self) -> String {
        self.processes
            .iter()
            .map(|p| format!("--- {} ---\n{}", p.name, p.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Processes, then programs and pinned state, then namespaces (field drop order).
        self.processes.clear();
        self.pass_programs.clear();
        let _ = balancer::pinning::Pins::new(self.pin_dir()).remove();
        let _ = balancer::pinning::Pins::new(self.second_pin_dir()).remove();
    }
}

/// A balancer config for the rack: HTTP, echo (TCP) and UDP VIPs on both families, each with
/// every backend, forwarded by `forwarding` and attached in `mode`. `extra` is appended to the
/// global part (e.g. an `[encap]` table).
pub fn rack_config(topo: &Topology, forwarding: &str, mode: AttachMode, extra: &str) -> String {
    let weights = vec![Some(1); topo.backends.len()];
    rack_config_weighted(topo, forwarding, mode, extra, &weights)
}

/// Like [`rack_config`] with backend `i` given weight `weights[i]`, or left out when `None`.
pub fn rack_config_weighted(
    topo: &Topology,
    forwarding: &str,
    mode: AttachMode,
    extra: &str,
    weights: &[Option<u32>],
) -> String {
    let mut text = format!(
        "interface = \"eth0\"\nattach_mode = \"{mode}\"\npin_dir = \"{pins}\"\nstate_file = \"{state}\"\n\n\
         [conntrack]\nmax_flows = 65536\n\n[api]\nsocket = \"{socket}\"\n\n{extra}\n",
        pins = topo.pin_dir().display(),
        state = topo.log_dir.join("state.json").display(),
        socket = topo.api_socket().display(),
    );
    for (vip, family) in [(IpAddr::from(VIP4), 4), (IpAddr::from(VIP6), 6)] {
        for (port, proto, service) in [
            (HTTP_PORT, "tcp", "http"),
            (ECHO_PORT, "tcp", "echo"),
            (UDP_PORT, "udp", "udp"),
        ] {
            text.push_str(&format!(
                "[[vip]]\nname = \"{service}{family}\"\naddress = \"{vip}\"\nport = {port}\nprotocol = \"{proto}\"\nforwarding = \"{forwarding}\"\ngue_port = {GUE_PORT}\n"
            ));
            for (i, weight) in weights.iter().enumerate().take(topo.backends.len()) {
                let Some(weight) = weight else { continue };
                let b: IpAddr = if family == 4 {
                    backend4(i).into()
                } else {
                    backend6(i).into()
                };
                text.push_str(&format!(
                    "  [[vip.backend]]\n  address = \"{b}\"\n  weight = {weight}\n"
                ));
            }
            text.push('\n');
        }
    }
    text
}

impl Topology {
    /// Rewrites the balancer's config and has it reload (SIGHUP); waits until it has.
    pub fn reload_balancer(&mut self, config: &str) -> Result<()> {
        fs::write(self.log_dir.join("balancer.toml"), config)?;
        let p = self.process("balancer").context("no balancer running")?;
        let reloads = p.log_text().matches("config reloaded").count();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(p.pid() as i32, libc::SIGHUP) };
        let started = Instant::now();
        while p.log_text().matches("config reloaded").count() == reloads {
            if started.elapsed() > Duration::from_secs(10)
                || p.log_text().contains("reload refused")
            {
                bail!("the balancer did not reload:\n{}", p.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}
