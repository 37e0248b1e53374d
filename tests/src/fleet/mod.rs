//! A fleet in network namespaces: a client behind a router that runs BIRD with ECMP
//! (multipath) over two or three balancers, each running BIRD and `balancer` with `[fleet]`
//! and `[bgp]`; an etcd member; backends on the rack bridge.
//!
//! ```text
//!   client 10.112.0.10 ── router 10.112.0.1 │ 10.111.0.1 ─┐  BIRD AS 65000, merge paths (ECMP)
//!                                                        │
//!   lb1 10.111.0.2  BIRD AS 65001 + balancer ────────────┼─ br0 (rack)
//!   lb2 10.111.0.3  (lb3 10.111.0.4)         ────────────┤
//!   etcd 10.111.0.9                           ────────────┤
//!   b1..b3 10.111.0.11.. (VIP on lo, default via router) ┘
//! ```
//!
//! The router learns the VIP from every balancer that announces it and spreads flows over them
//! by an L4 hash; the balancers forward by L2 DSR to the backends, which answer the client
//! through the router. Everything is torn down on drop.

use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

mod routing;

use anyhow::{Result, bail};
use balancer::base::config::{AttachMode, RawConfig, RawFleet};
use balancer::serve::api::client::{Client, Endpoint};
use balancer::state::wire::Status;
use balancer::steering::fleet::FleetRole;

use crate::configs::{backend, tcp_health, to_toml, vip};
use crate::netns::Netns;
use crate::pki::TestPki;
use crate::rack::{Process, Rack, binary, poll, veth};
use crate::topology::{ECHO_PORT, HTTP_PORT, VIP4};

pub const ROUTER_RACK: Ipv4Addr = Ipv4Addr::new(10, 111, 0, 1);
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 112, 0, 10);
pub const ETCD: Ipv4Addr = Ipv4Addr::new(10, 111, 0, 9);
/// BGP timers of every session (seconds): a dead balancer's routes go after `HOLD`.
pub const HOLD: u64 = 3;

pub fn lb_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 111, 0, 2 + i as u8)
}
pub fn backend_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 111, 0, 11 + i as u8)
}

/// Whether the programs the fleet runs are installed (`cargo xtask setup` installs them).
pub fn tools_present() -> Result<()> {
    for tool in ["bird", "birdc", "etcd"] {
        if !["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|d| PathBuf::from(d).join(tool).exists())
        {
            bail!(
                "{tool} is not installed: run `cargo xtask setup` (Debian packages bird2, etcd-server)"
            );
        }
    }
    Ok(())
}

/// How the fleet's etcd is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtcdSecurity {
    /// Plain gRPC, no users.
    Plain,
    /// TLS with client certificates required (`--client-cert-auth`) and etcd's
    /// authentication on: the balancers log in as [`crate::pki::USER`] with a password.
    MutualTlsAndPassword,
}

pub struct Fleet {
    /// The core: processes, logs, pins, the bridge (dropped first: processes die before
    /// their namespaces go).
    pub rack: Rack,
    /// The certificates and passwords of a secured etcd.
    pub pki: Option<TestPki>,
    pub client: Netns,
    pub router: Netns,
    pub etcd: Netns,
    pub lbs: Vec<Netns>,
    pub backends: Vec<Netns>,
    /// The VIPs forward by NAT with source NAT from each balancer's own address (else by L2
    /// DSR).
    pub source_nat: bool,
}

impl Fleet {
    /// Builds the namespaces, starts etcd, the router's BIRD, the backends' servers, and on
    /// every balancer BIRD and `balancer run`; waits until the router has a route to the VIP
    /// through every balancer.
    pub fn build(tag: &str, balancers: usize, backends: usize) -> Result<Fleet> {
        Fleet::build_with(tag, balancers, backends, EtcdSecurity::Plain)
    }

    /// [`Fleet::build`] with VIPs that forward by NAT with source NAT, each balancer from its
    /// own address (so a flow's port is known to one balancer only).
    pub fn build_source_nat(tag: &str, balancers: usize, backends: usize) -> Result<Fleet> {
        Fleet::build_inner(tag, balancers, backends, EtcdSecurity::Plain, true)
    }

    /// [`Fleet::build`] with etcd secured as `security` says.
    pub fn build_with(
        tag: &str,
        balancers: usize,
        backends: usize,
        security: EtcdSecurity,
    ) -> Result<Fleet> {
        Fleet::build_inner(tag, balancers, backends, security, false)
    }

    fn build_inner(
        tag: &str,
        balancers: usize,
        backends: usize,
        security: EtcdSecurity,
        source_nat: bool,
    ) -> Result<Fleet> {
        tools_present()?;
        let rack = Rack::new(tag)?;
        let client = rack.host("client")?;
        let router = rack.host("router")?;
        let etcd = rack.host("etcd")?;
        let lbs = (0..balancers)
            .map(|i| rack.host(&format!("lb{}", i + 1)))
            .collect::<Result<Vec<_>>>()?;
        let backend_ns = (0..backends)
            .map(|i| rack.host(&format!("b{}", i + 1)))
            .collect::<Result<Vec<_>>>()?;
        let pki = match security {
            EtcdSecurity::Plain => None,
            EtcdSecurity::MutualTlsAndPassword => {
                Some(TestPki::make(&rack.log_dir.join("etcd-tls"), ETCD.into())?)
            }
        };
        let mut fleet = Fleet {
            rack,
            pki,
            client,
            router,
            etcd,
            lbs,
            backends: backend_ns,
            source_nat,
        };
        fleet.wire()?;
        fleet.start_etcd()?;
        fleet.start_router_bird()?;
        for i in 0..backends {
            fleet.start_backend(i)?;
        }
        for i in 0..balancers {
            fleet.start_lb_bird(i)?;
            fleet.start_balancer(i)?;
        }
        fleet.wait_for_paths(balancers, Duration::from_secs(20))?;
        Ok(fleet)
    }

    fn wire(&mut self) -> Result<()> {
        let mut hosts: Vec<(&Netns, String, Ipv4Addr)> = vec![
            (&self.router, "router".into(), ROUTER_RACK),
            (&self.etcd, "etcd".into(), ETCD),
        ];
        for (i, lb) in self.lbs.iter().enumerate() {
            hosts.push((lb, format!("lb{}", i + 1), lb_addr(i)));
        }
        for (i, b) in self.backends.iter().enumerate() {
            hosts.push((b, format!("b{}", i + 1), backend_addr(i)));
        }
        for (host, port, addr) in &hosts {
            self.rack.plug(port, host, &[format!("{addr}/24")])?;
        }
        // The client's own link to the router.
        veth(&self.router, "client", &self.client, "eth0")?;
        self.router.sh(
            "ip addr add 10.112.0.1/24 dev client && ip link set client up; \
             sysctl -qw net.ipv4.ip_forward=1 net.ipv4.fib_multipath_hash_policy=1 \
               net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0",
        )?;
        self.client.sh(&format!(
            "ip addr add {CLIENT}/24 dev eth0 && ip link set eth0 up && ip route add default via 10.112.0.1; \
             ethtool -K eth0 tx off tso off gso off >/dev/null 2>&1 || true"
        ))?;
        for b in &self.backends {
            b.sh(&format!(
                "ip addr add {VIP4}/32 dev lo; ip route add default via {ROUTER_RACK}; \
                 sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
                   net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2 \
                   net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0"
            ))?;
        }
        if self.source_nat {
            // Whole checksums and segments from the backends, whose replies native XDP
            // rewrites (see `Topology::unmodified_backends`).
            for b in &self.backends {
                b.sh("ethtool -K eth0 tx off tso off gso off >/dev/null")?;
            }
        }
        // Native XDP on a veth sends its XDP_TX frames only to a peer with an XDP program.
        for i in 0..self.lbs.len() {
            self.rack
                .attach_pass(&format!("lb{}", i + 1), AttachMode::Native)?;
        }
        Ok(())
    }

    /// Kills a process by name (SIGKILL).
    pub fn kill(&mut self, name: &str) -> Result<()> {
        self.rack.kill(name)
    }

    fn start_backend(&mut self, i: usize) -> Result<()> {
        let server = binary("test-backend")?;
        let name = format!("b{}", i + 1);
        let argv = [
            server.to_str().unwrap_or_default(),
            "--name",
            &name,
            "--http-port",
            &HTTP_PORT.to_string(),
            "--echo-port",
            &ECHO_PORT.to_string(),
        ];
        self.rack
            .spawn(&self.backends[i], &format!("server-{name}"), &argv)?
            .wait_for_log("listening", Duration::from_secs(10))
    }

    pub fn pin_dir(&self, i: usize) -> PathBuf {
        self.rack.pin_dir(Some(&format!("lb{}", i + 1)))
    }

    pub fn api_socket(&self, i: usize) -> PathBuf {
        self.rack.log_dir.join(format!("api-lb{}.sock", i + 1))
    }

    /// Balancer `i`'s config: the same VIPs and backends on every balancer; its own pins,
    /// socket, instance name and BIRD files.
    pub fn config(&self, i: usize) -> String {
        let path = |p: PathBuf| Some(p.display().to_string());
        let mut config = RawConfig {
            interface: Some("eth0".into()),
            attach_mode: Some("native".into()),
            pin_dir: path(self.pin_dir(i)),
            state_file: path(self.rack.log_dir.join(format!("state-lb{}.json", i + 1))),
            ..RawConfig::default()
        };
        config.api.socket = path(self.api_socket(i));
        // Prometheus (the fleet's test of the rules) scrapes every balancer on its address.
        config.metrics.listen = Some(format!("{}:9181", lb_addr(i)));
        config.fleet = self.fleet_settings(i);
        config.bgp.routes_v4 = path(self.bird_dir().join(format!("lb{}-vips4.conf", i + 1)));
        config.bgp.routes_v6 = path(self.bird_dir().join(format!("lb{}-vips6.conf", i + 1)));
        config.bgp.birdc = Some("birdc".into());
        config.bgp.socket = path(self.bird_socket(Some(i)));
        config.bgp.prefixes = vec!["10.111.1.0/24".into(), "fd00:111:1::/48".into()];
        for (name, port) in [("http4", HTTP_PORT), ("echo4", ECHO_PORT)] {
            let mut v = vip(name, VIP4, port);
            v.protocol = Some("tcp".into());
            if self.source_nat {
                v.forwarding = Some("nat".into());
                v.nat_source = vec!["interface".into()];
            }
            v.health = Some(tcp_health(200, 100, 2, 2));
            v.backend = (0..self.backends.len())
                .map(|b| backend(backend_addr(b), Some(100)))
                .collect();
            config.vip.push(v);
        }
        to_toml(&config)
    }

    /// Balancer `i`'s `[fleet]`: etcd, this fleet's prefix, its instance name, a 3 s lease;
    /// with a secured etcd, the CA, the client certificate and the user's password file.
    pub fn fleet_settings(&self, i: usize) -> RawFleet {
        let path = |p: &PathBuf| Some(p.display().to_string());
        let mut fleet = RawFleet {
            etcd: vec![format!("{ETCD}:2379")],
            prefix: Some(format!("/balancer/{}", self.rack.tag)),
            instance: Some(format!("lb{}", i + 1)),
            lease_secs: Some(3),
            poll_ms: Some(200),
            ..RawFleet::default()
        };
        if let Some(pki) = &self.pki {
            fleet.ca = path(&pki.ca);
            fleet.cert = path(&pki.client_cert);
            fleet.key = path(&pki.client_key);
            fleet.username = Some(crate::pki::USER.into());
            fleet.password_file = path(&pki.password_file);
        }
        fleet
    }

    /// Starts (or restarts) `balancer run` on balancer `i`; waits until it is ready.
    pub fn start_balancer(&mut self, i: usize) -> Result<()> {
        self.start_balancer_with(i, |_| {})
    }

    /// [`Fleet::start_balancer`] with its `[fleet]` changed by `edit` first (the config file
    /// keeps the change).
    pub fn start_balancer_with(
        &mut self,
        i: usize,
        edit: impl FnOnce(&mut RawFleet),
    ) -> Result<()> {
        let mut raw: RawConfig = toml::from_str(&self.config(i))?;
        edit(&mut raw.fleet);
        let config = to_toml(&raw);
        self.rack.start_balancer(
            &self.lbs[i],
            &format!("balancer-lb{}", i + 1),
            &format!("balancer-lb{}.toml", i + 1),
            &config,
        )
    }

    /// Balancer `i`'s API.
    pub fn api(&self, i: usize) -> Client {
        Client::new(Endpoint::Unix(self.api_socket(i)))
    }

    pub fn status(&self, i: usize) -> Result<Status> {
        self.api(i)
            .get("/v1/status")
            .map_err(|e| anyhow::anyhow!("status of lb{}: {e}", i + 1))
    }

    /// The balancers the router's route to the VIP goes through.
    pub fn router_paths(&self) -> Result<Vec<Ipv4Addr>> {
        let out = self
            .router
            .exec(&["ip", "route", "show", &format!("{VIP4}/32")])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut via: Vec<Ipv4Addr> = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "via")
            .filter_map(|w| w[1].parse().ok())
            .collect();
        via.sort();
        via.dedup();
        Ok(via)
    }

    /// Waits until the router's route to the VIP has `n` paths; the time it took.
    pub fn wait_for_paths(&self, n: usize, timeout: Duration) -> Result<Duration> {
        if let Some(((), took)) = poll(timeout, || {
            self.router_paths()
                .is_ok_and(|p| p.len() == n)
                .then_some(())
        }) {
            return Ok(took);
        }
        bail!(
            "the router's paths to the VIP are {:?}, not {n}, after {timeout:?}:\n{}",
            self.router_paths(),
            self.logs()
        )
    }

    /// Waits until `f` holds for the status of every running balancer in `lbs`.
    pub fn wait_for_status(
        &self,
        lbs: &[usize],
        timeout: Duration,
        what: &str,
        f: impl Fn(&Status) -> bool,
    ) -> Result<Duration> {
        if let Some(((), took)) = poll(timeout, || {
            lbs.iter()
                .all(|i| self.status(*i).is_ok_and(|s| f(&s)))
                .then_some(())
        }) {
            return Ok(took);
        }
        let statuses: Vec<String> = lbs
            .iter()
            .map(|i| {
                format!(
                    "lb{}: {:?}",
                    i + 1,
                    self.status(*i).map(|s| (s.fleet, s.bgp))
                )
            })
            .collect();
        bail!(
            "not {what} within {timeout:?}: {}\n{}",
            statuses.join("\n"),
            self.logs()
        )
    }

    /// Waits until exactly one balancer leads and every one names it as the leader (an
    /// election and the followers' next poll); returns its index.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize> {
        let fleets = || -> Vec<Option<balancer::steering::fleet::FleetStatus>> {
            (0..self.lbs.len())
                .map(|i| self.status(i).ok().and_then(|s| s.fleet))
                .collect()
        };
        let agreed = poll(timeout, || {
            let fleets = fleets();
            let leaders: Vec<usize> = (0..self.lbs.len())
                .filter(|i| {
                    fleets[*i]
                        .as_ref()
                        .is_some_and(|f| f.role == FleetRole::Leader)
                })
                .collect();
            let [one] = leaders[..] else {
                return None;
            };
            let name = format!("lb{}", one + 1);
            fleets
                .iter()
                .all(|f| f.as_ref().and_then(|f| f.leader.as_deref()) == Some(&name))
                .then_some(one)
        });
        match agreed {
            Some((one, _)) => Ok(one),
            None => bail!(
                "no single leader named by every balancer within {timeout:?}: {:?}",
                fleets()
            ),
        }
    }

    pub fn process(&mut self, name: &str) -> Option<&mut Process> {
        self.rack.process(name)
    }

    pub fn logs(&self) -> String {
        self.rack.logs()
    }

    /// The table fingerprint of `vip` on balancer `i`.
    pub fn fingerprint(&self, i: usize, vip: &str) -> Option<String> {
        self.status(i)
            .ok()?
            .vips
            .into_iter()
            .find(|v| v.name == vip)
            .map(|v| v.table_fingerprint)
    }

    /// New flows balancer `i` forwarded for `vip`.
    pub fn new_flows(&self, i: usize, vip: &str) -> u64 {
        self.status(i)
            .ok()
            .and_then(|s| s.vips.into_iter().find(|v| v.name == vip))
            .map_or(0, |v| v.new_flows)
    }

    /// Takes balancer `i` off the network as a dead host would be: its link goes down first
    /// (so no BGP notification or TCP reset reaches the router, which must notice by its hold
    /// timer), then its BIRD and daemon die.
    pub fn kill_balancer_host(&mut self, i: usize) -> Result<()> {
        self.lbs[i].sh("ip link set eth0 down")?;
        self.kill(&format!("bird-lb{}", i + 1))?;
        self.kill(&format!("balancer-lb{}", i + 1))?;
        Ok(())
    }
}
