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
//! With [`TopologyOptions::client_link`] the client sits on a second bridge (`br1`,
//! 10.110.0.0/24), reaching the balancer's `eth1`.
//!
//! The client routes the VIP prefixes (10.111.1.0/24, fd00:111:1::/64) through the balancer;
//! backends hold the VIPs on `lo` (LVS-DR style) and answer the client directly. Everything is
//! torn down on drop: processes killed, namespaces deleted.

use std::collections::BTreeMap;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

mod config;

pub use config::{rack_config, rack_config_weighted, rack_encap};

use anyhow::{Context as _, Result, anyhow, bail};
use balancer::base::config::{AttachMode, RawApi, RawConfig, RawConntrack, RawEncap, RawNat};

use crate::configs::{backend, vip};
use crate::netns::Netns;
use crate::rack::{Process, Rack, binary};

pub const VIP4: Ipv4Addr = Ipv4Addr::new(10, 111, 1, 1);
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x111, 1, 0, 0, 0, 0, 1);
pub const LB4: Ipv4Addr = Ipv4Addr::new(10, 111, 0, 2);
pub const LB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x111, 0, 0, 0, 0, 0, 2);
pub const CLIENT4: Ipv4Addr = Ipv4Addr::new(10, 111, 0, 10);
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x111, 0, 0, 0, 0, 0, 0x10);
/// With [`TopologyOptions::client_link`]: the client and the balancer's `eth1` on their own
/// link (`br1`, 10.110.0.0/24, fd00:110::/64).
pub const CLIENT_LINK_CLIENT4: Ipv4Addr = Ipv4Addr::new(10, 110, 0, 10);
pub const CLIENT_LINK_CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x110, 0, 0, 0, 0, 0, 0x10);
pub const CLIENT_LINK_LB4: Ipv4Addr = Ipv4Addr::new(10, 110, 0, 2);
pub const CLIENT_LINK_LB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x110, 0, 0, 0, 0, 0, 2);
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

/// A client thread of [`Topology::echo_streams`].
pub type EchoStream = std::thread::JoinHandle<Result<Result<(String, usize), String>>>;

/// What a set of echo streams did, all of them unbroken.
#[derive(Debug)]
pub struct StreamsJoined {
    /// Streams per backend name.
    pub per_backend: BTreeMap<String, usize>,
    /// Bytes echoed and checked, all streams together.
    pub bytes: usize,
    /// The fewest bytes one stream echoed.
    pub fewest_bytes: usize,
}

/// Waits for the streams of [`Topology::echo_streams`]; an error names the first one that
/// broke (`during` says while what) or moved no data.
pub fn join_streams(streams: Vec<EchoStream>, during: &str) -> Result<StreamsJoined> {
    let mut joined = StreamsJoined {
        per_backend: BTreeMap::new(),
        bytes: 0,
        fewest_bytes: usize::MAX,
    };
    for (i, s) in streams.into_iter().enumerate() {
        let (backend, bytes) = s
            .join()
            .map_err(|_| anyhow!("stream {i}'s thread panicked"))??
            .map_err(|e| anyhow!("stream {i} broke {during}: {e}"))?;
        if bytes == 0 {
            bail!("stream {i} moved no data");
        }
        joined.bytes += bytes;
        joined.fewest_bytes = joined.fewest_bytes.min(bytes);
        *joined.per_backend.entry(backend).or_insert(0) += 1;
    }
    Ok(joined)
}

/// How to build a rack.
#[derive(Clone, Debug)]
pub struct TopologyOptions {
    /// Distinguishes this rack's namespaces from concurrently running ones.
    pub tag: String,
    pub backends: usize,
    /// MTU of the client's link (lower it for encapsulating modes).
    pub client_mtu: u32,
    /// The client on a link of its own (bridge `br1`), which the balancer reaches on a
    /// second interface `eth1`; the backends stay on `br0` and the balancer's `eth0`. What
    /// NAT's `[nat] interface` is for: the rack config then names `eth1` as the interface
    /// and `eth0` as the NAT backends' link.
    pub client_link: bool,
}

impl TopologyOptions {
    pub fn new(tag: &str) -> Self {
        TopologyOptions {
            tag: tag.to_string(),
            backends: 3,
            client_mtu: 1500,
            client_link: false,
        }
    }
}

/// The namespaces, links and processes of one rack.
pub struct Topology {
    pub opts: TopologyOptions,
    /// The core: processes, logs, pins, the bridge (dropped first: processes die before
    /// their namespaces go).
    pub rack: Rack,
    pub client: Netns,
    pub lb: Netns,
    pub backends: Vec<Netns>,
    /// A second balancer's namespace, when a test adds one.
    pub lb2: Option<Netns>,
}

impl Topology {
    /// Builds the rack and starts a test backend server in each backend namespace.
    pub fn build(opts: TopologyOptions) -> Result<Topology> {
        let rack = Rack::new(&opts.tag)?;
        let client = rack.host("client")?;
        let lb = rack.host("lb")?;
        let backends = (0..opts.backends)
            .map(|i| rack.host(&format!("b{}", i + 1)))
            .collect::<Result<Vec<_>>>()?;
        let mut topo = Topology {
            opts,
            rack,
            client,
            lb,
            backends,
            lb2: None,
        };
        topo.wire()?;
        topo.start_backends()?;
        Ok(topo)
    }

    fn wire(&mut self) -> Result<()> {
        let mut hosts: Vec<(&Netns, String, String, String)> = vec![(
            &self.lb,
            "lb".into(),
            format!("{LB4}/24"),
            format!("{LB6}/64"),
        )];
        let client_addresses = [
            format!("{}/24", self.client4()),
            format!("{}/64", self.client6()),
        ];
        if self.opts.client_link {
            self.rack.add_second_bridge()?;
            self.rack
                .plug_second("client", &self.client, "eth0", &client_addresses)?;
            self.rack.plug_second(
                "lbc",
                &self.lb,
                "eth1",
                &[
                    format!("{CLIENT_LINK_LB4}/24"),
                    format!("{CLIENT_LINK_LB6}/64"),
                ],
            )?;
            // The balancer routes between its links (the backends' own traffic to clients,
            // and the client's to the balancer's other address).
            self.lb
                .sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1")?;
        } else {
            self.rack.plug("client", &self.client, &client_addresses)?;
        }
        for (i, b) in self.backends.iter().enumerate() {
            hosts.push((
                b,
                format!("b{}", i + 1),
                format!("{}/24", backend4(i)),
                format!("{}/64", backend6(i)),
            ));
        }
        for (host, port, v4, v6) in &hosts {
            self.rack.plug(port, host, &[v4.clone(), v6.clone()])?;
        }
        self.client.sh(&format!(
            "ip link set eth0 mtu {mtu}; \
             ip route add 10.111.1.0/24 via {lb4}; ip -6 route add fd00:111:1::/64 via {lb6}; \
             ethtool -K eth0 tx off tso off gso off >/dev/null 2>&1 || \
               {{ echo 'ethtool is missing: run cargo xtask setup' >&2; exit 1; }}",
            mtu = self.opts.client_mtu,
            lb4 = self.lb4(),
            lb6 = self.lb6(),
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

    /// Makes the backends unmodified servers, as NAT forwarding serves them: no VIP on their
    /// loopback, and their replies to the client routed through the balancer (its addresses as
    /// their gateway to the client). Their link sends whole checksums and segments, as the
    /// client's does: a veth hands native XDP a checksum offload left unfinished (and large
    /// segments), which a frame sent back out with `XDP_TX` no longer carries; on a real NIC
    /// what arrives is always whole.
    pub fn unmodified_backends(&self) -> Result<()> {
        for b in &self.backends {
            b.sh(&format!(
                "ip addr del {VIP4}/32 dev lo && ip -6 addr del {VIP6}/128 dev lo && \
                 ip route add {client4}/32 via {LB4} && ip -6 route add {client6}/128 via {LB6} && \
                 ethtool -K eth0 tx off tso off gso off >/dev/null",
                client4 = self.client4(),
                client6 = self.client6(),
            ))?;
        }
        Ok(())
    }

    /// Makes the backends unmodified servers with no way to the client at all (its address
    /// unreachable from them), as source NAT serves them: no VIP, no route back through the
    /// balancer; they only ever answer the balancer's address. Whole checksums and segments
    /// as in [`Topology::unmodified_backends`].
    pub fn source_nat_backends(&self) -> Result<()> {
        for b in &self.backends {
            b.sh(&format!(
                "ip addr del {VIP4}/32 dev lo && ip -6 addr del {VIP6}/128 dev lo && \
                 ip route add unreachable {client4}/32 && ip -6 route add unreachable {client6}/128 && \
                 ethtool -K eth0 tx off tso off gso off >/dev/null",
                client4 = self.client4(),
                client6 = self.client6(),
            ))?;
        }
        Ok(())
    }

    /// The client's addresses (on its own link with [`TopologyOptions::client_link`]).
    pub fn client4(&self) -> Ipv4Addr {
        if self.opts.client_link {
            CLIENT_LINK_CLIENT4
        } else {
            CLIENT4
        }
    }
    pub fn client6(&self) -> Ipv6Addr {
        if self.opts.client_link {
            CLIENT_LINK_CLIENT6
        } else {
            CLIENT6
        }
    }

    /// The balancer's addresses on the client's link.
    pub fn lb4(&self) -> Ipv4Addr {
        if self.opts.client_link {
            CLIENT_LINK_LB4
        } else {
            LB4
        }
    }
    pub fn lb6(&self) -> Ipv6Addr {
        if self.opts.client_link {
            CLIENT_LINK_LB6
        } else {
            LB6
        }
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
        self.rack
            .spawn(&self.backends[i], &process_name, &argv)?
            .wait_for_log("listening", Duration::from_secs(10))
    }

    /// The file backend `i`'s server serves at `/metrics` (absent until a test writes it).
    pub fn metrics_file(&self, i: usize) -> PathBuf {
        self.rack.log_dir.join(format!("metrics-b{}.prom", i + 1))
    }

    /// The file listing (comma-separated) the models backend `i`'s server answers at
    /// `/v1/models` (none until a test writes it).
    pub fn models_file(&self, i: usize) -> PathBuf {
        self.rack.log_dir.join(format!("models-b{}.txt", i + 1))
    }

    /// Kills the test server of backend `i` (0-based).
    pub fn kill_backend_server(&mut self, i: usize) -> Result<()> {
        self.rack.kill(&format!("server-b{}", i + 1))
    }

    /// Starts `balancer run` again with the config `start_balancer` wrote, plus `args`.
    pub fn restart_balancer(&mut self, args: &[&str]) -> Result<()> {
        self.restart_balancer_with(&[], args)
    }

    /// Like [`Topology::restart_balancer`], the daemon started through `prefix` (a command
    /// and its arguments before the daemon's: `env NAME=value`, `prlimit --nofile=N:N`).
    pub fn restart_balancer_with(&mut self, prefix: &[&str], args: &[&str]) -> Result<()> {
        let path = self.rack.log_dir.join("balancer.toml");
        let bin = binary("balancer")?;
        let mut argv: Vec<String> = prefix.iter().map(|a| a.to_string()).collect();
        argv.extend([
            bin.to_string_lossy().to_string(),
            "run".to_string(),
            "--config".to_string(),
            path.to_string_lossy().to_string(),
        ]);
        argv.extend(args.iter().map(|a| (*a).to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.rack
            .spawn(&self.lb, "balancer", &argv)?
            .wait_for_log("balancer ready", Duration::from_secs(30))
    }

    /// Attaches an XDP pass-through program to the rack side of the balancer's link: in native
    /// mode a veth only receives `XDP_TX` frames when its peer has an XDP program.
    pub fn attach_peer_pass(&mut self, mode: AttachMode) -> Result<()> {
        self.rack.attach_pass("lb", mode)?;
        if self.opts.client_link {
            self.rack.attach_pass("lbc", mode)?;
        }
        Ok(())
    }

    /// A second balancer on the rack (namespace `lb2`, 10.111.0.3 / fd00:111::3), running the
    /// first one's config with its own pins, state file and socket: what an ECMP peer of the
    /// first balancer is. Its process is `balancer2`.
    pub fn start_second_balancer(&mut self) -> Result<()> {
        let ns = self.rack.host("lb2")?;
        self.rack.plug(
            "lb2",
            &ns,
            &["10.111.0.3/24".into(), "fd00:111::3/64".into()],
        )?;
        self.rack.attach_pass("lb2", AttachMode::Native)?;
        let log_dir = &self.rack.log_dir;
        let first = fs::read_to_string(log_dir.join("balancer.toml"))?;
        let mut config: RawConfig =
            toml::from_str(&first).context("the first balancer's config")?;
        config.pin_dir = Some(self.second_pin_dir().display().to_string());
        config.state_file = Some(log_dir.join("state2.json").display().to_string());
        config.api.socket = Some(log_dir.join("api2.sock").display().to_string());
        let config = crate::configs::to_toml(&config);
        self.rack
            .start_balancer(&ns, "balancer2", "balancer2.toml", &config)?;
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
        self.rack
            .start_balancer(&self.lb, "balancer", "balancer.toml", config)
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
                // The balancers' side of the rack: the outer sources of their tunnels.
                "--allow",
                "10.111.0.0/24",
                "--allow",
                "fd00:111::/64",
            ];
            self.rack
                .spawn(&self.backends[i], &format!("decap-b{}", i + 1), &argv)?
                .wait_for_log("decap ready", Duration::from_secs(30))?;
        }
        Ok(())
    }

    /// Where this rack's balancer pins its program and maps.
    pub fn pin_dir(&self) -> PathBuf {
        self.rack.pin_dir(None)
    }

    /// The second balancer's pin directory (bpffs refuses names with a dot).
    pub fn second_pin_dir(&self) -> PathBuf {
        self.rack.pin_dir(Some("lb2"))
    }

    /// The balancer's control socket.
    pub fn api_socket(&self) -> PathBuf {
        self.rack.log_dir.join("api.sock")
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
        self.rack.process(name)
    }

    /// The processes' logs, for failure messages.
    pub fn logs(&self) -> String {
        self.rack.logs()
    }
}

impl Topology {
    /// Rewrites the balancer's config and has it reload (SIGHUP); waits until it has.
    pub fn reload_balancer(&mut self, config: &str) -> Result<()> {
        fs::write(self.rack.log_dir.join("balancer.toml"), config)?;
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
