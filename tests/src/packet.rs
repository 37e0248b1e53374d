//! Packet-level testing of the XDP program through `BPF_PROG_TEST_RUN`: a harness that loads
//! the real object and fills its maps with the daemon's own code (config → `Balancer` →
//! `KernelDataplane`), frame builders, and the expected outputs built independently of the
//! program with `etherparse`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use aya::programs::{TestRun, TestRunOptions};
use balancer::base::config::Config;
use balancer::base::net::MacAddr;
use balancer::dataplane::ebpf;
use balancer::dataplane::kernel::KernelDataplane;
use balancer::dataplane::netinfo::Interface;
use balancer::dataplane::settings::{data_plane_settings, snat_sources};
use balancer::dataplane::{Dataplane as _, NatSweep, NatSweepSettings};
use balancer::vips::Balancer;
use balancer_common::addr::raw_from_ip;
use balancer_common::flow_hash::{flow_hash, slot};
use balancer_common::maps::GlobalConfig;
use etherparse::{IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header, PacketBuilder, UdpHeader};

pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

/// The balancer's MAC in fixtures (frames for VIPs are addressed to it).
pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// The client's (or upstream router's) MAC in fixtures.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x10];

/// The MAC fixtures give a backend: derived from its address.
pub fn backend_mac(addr: IpAddr) -> [u8; 6] {
    let o = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets()[12..].to_vec(),
    };
    [0x02, 0xbe, o[0], o[1], o[2], o[3]]
}

/// Name of an XDP action.
pub fn action_name(action: u32) -> &'static str {
    match action {
        XDP_ABORTED => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_TX => "XDP_TX",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "XDP_?",
    }
}

/// The loaded balancer program with maps filled from a config.
pub struct Harness {
    object: aya::Ebpf,
    pub balancer: Balancer<KernelDataplane>,
    pub config: Config,
    pub settings: GlobalConfig,
    out: Vec<u8>,
}

/// The interface fixtures pretend the balancer runs on.
pub fn fixture_interface() -> Interface {
    Interface {
        name: "eth0".into(),
        index: 2,
        mac: MacAddr(LB_MAC),
        mtu: 1500,
        addresses: vec![
            ("10.111.0.2".parse().expect("v4"), 24),
            ("fd00:111::2".parse().expect("v6"), 64),
        ],
    }
}

impl Harness {
    /// Loads the program and publishes the VIPs of `config_text` (whose `interface` is
    /// ignored); backends get [`backend_mac`] unless they name a MAC.
    pub fn new(config_text: &str) -> Result<Harness> {
        Self::with_settings(config_text, |_| {})
    }

    /// Like [`Harness::new`], then lets `tweak` change the global settings before they are
    /// written.
    pub fn with_settings(
        config_text: &str,
        tweak: impl FnOnce(&mut GlobalConfig),
    ) -> Result<Harness> {
        Self::build(config_text, ebpf::BALANCER_OBJECT, tweak)
    }

    /// Like [`Harness::new`], with another build of the balancer object (`object`: its ELF
    /// bytes), e.g. an earlier commit's as a benchmark baseline.
    pub fn with_object(config_text: &str, object: &[u8]) -> Result<Harness> {
        Self::build(config_text, object, |_| {})
    }

    fn build(
        config_text: &str,
        object: &[u8],
        tweak: impl FnOnce(&mut GlobalConfig),
    ) -> Result<Harness> {
        let config = Config::parse(config_text)?;
        let mut settings = data_plane_settings(&config, &fixture_interface(), 0x5eed)?;
        tweak(&mut settings);
        let snat = snat_sources(&config, &fixture_interface())?;
        let mut object = ebpf::load_balancer_object(object, config.conntrack.max_flows)?;
        let dataplane = KernelDataplane::from_ebpf(&mut object)?;
        let mut balancer = Balancer::new(dataplane);
        balancer.set_settings(&settings)?;
        balancer.set_removal_grace(config.conntrack.removal_grace);
        balancer.set_tiers(&config.tiers)?;
        balancer.set_snat_sources(snat);
        let macs: HashMap<IpAddr, MacAddr> = config
            .vips
            .iter()
            .flat_map(|v| v.backends.iter())
            .map(|b| (b.address, MacAddr(backend_mac(b.address))))
            .collect();
        balancer.apply(&config.vips, &macs)?;
        Ok(Harness {
            object,
            balancer,
            config,
            settings,
            out: vec![0u8; 4096],
        })
    }

    /// Re-applies a changed config (VIPs, backends, weights).
    pub fn reconfigure(&mut self, config_text: &str) -> Result<()> {
        let config = Config::parse(config_text)?;
        let macs: HashMap<IpAddr, MacAddr> = config
            .vips
            .iter()
            .flat_map(|v| v.backends.iter())
            .map(|b| (b.address, MacAddr(backend_mac(b.address))))
            .collect();
        self.balancer.set_tiers(&config.tiers)?;
        self.balancer
            .set_snat_sources(snat_sources(&config, &fixture_interface())?);
        self.balancer.apply(&config.vips, &macs)?;
        self.config = config;
        Ok(())
    }

    /// Runs the program once on `frame`: the action and the frame it left.
    pub fn run(&mut self, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
        let (action, len, _) = self.run_raw(frame, 1)?;
        Ok((action, self.out[..len].to_vec()))
    }

    /// Runs the program `repeat` times on `frame` in one syscall: the action, the output
    /// length, and the kernel's average time per run.
    pub fn run_raw(&mut self, frame: &[u8], repeat: u32) -> Result<(u32, usize, Duration)> {
        let program = ebpf::program(&mut self.object, ebpf::BALANCER_PROGRAM)?;
        let result = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut self.out),
                repeat,
                ..TestRunOptions::default()
            })
            .context("BPF_PROG_TEST_RUN")?;
        if result.return_value == XDP_ABORTED {
            bail!("XDP_ABORTED for frame {frame:02x?}");
        }
        Ok((
            result.return_value,
            result.data_size_out as usize,
            result.duration,
        ))
    }

    /// Sweeps the source-NAT tables as the daemon does, with the flow clock at `now` ticks.
    pub fn sweep_nat(&self, now: u64) -> Result<NatSweep> {
        let settings = NatSweepSettings::from_config(&self.config.nat);
        Ok(self
            .balancer
            .dataplane()
            .nat_sweeper()?
            .run(now, &settings)?)
    }

    /// The program's file descriptor, for running it from another thread ([`run_fd`]).
    pub fn program_fd(&mut self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::{AsFd, AsRawFd};
        let program = ebpf::program(&mut self.object, ebpf::BALANCER_PROGRAM)?;
        Ok(program.fd()?.as_fd().as_raw_fd())
    }

    /// The instructions the verifier processed to accept the program, its global functions
    /// included (the kernel's `verified_insns`): the load fails past 1,000,000.
    pub fn verified_insns(&mut self) -> Result<u32> {
        let program = ebpf::program(&mut self.object, ebpf::BALANCER_PROGRAM)?;
        program
            .info()?
            .verified_instruction_count()
            .context("the kernel does not report the verifier's instruction count")
    }

    /// The backend the VIP's table assigns to a flow (what a connection-table miss picks).
    pub fn table_backend(&self, vip: &str, client: IpAddr, sport: u16) -> Result<IpAddr> {
        let state = self
            .balancer
            .vip(vip)
            .with_context(|| format!("no VIP {vip}"))?;
        let (raw, _) = raw_from_ip(client);
        let id =
            state.table[slot(flow_hash(&raw, sport.to_be()), state.config.table_size) as usize];
        state
            .backends
            .values()
            .find(|b| b.id == id)
            .map(|b| b.address)
            .with_context(|| format!("slot holds unknown backend id {id}"))
    }
}

/// Ethernet + IPv4/IPv6 + TCP frame from `client`:`sport` to `dst`:`dport`.
pub fn tcp_frame(
    client: IpAddr,
    sport: u16,
    dst: IpAddr,
    dport: u16,
    syn: bool,
    payload: &[u8],
) -> Vec<u8> {
    let step = tcp_builder(client, sport, dst, dport);
    let step = if syn { step.syn() } else { step.ack(1) };
    let mut out = Vec::new();
    step.write(&mut out, payload).expect("build TCP frame");
    out
}

/// A TCP segment with the given flags (e.g. FIN|ACK, RST) from `client`:`sport`.
pub fn tcp_flags_frame(
    client: IpAddr,
    sport: u16,
    dst: IpAddr,
    dport: u16,
    fin: bool,
    rst: bool,
) -> Vec<u8> {
    let step = tcp_builder(client, sport, dst, dport).ack(1);
    let step = if fin { step.fin() } else { step };
    let step = if rst { step.rst() } else { step };
    let mut out = Vec::new();
    step.write(&mut out, &[]).expect("build TCP frame");
    out
}

/// Ethernet + IPv4/IPv6 + TCP headers from the client to `dst`, flags still to set.
fn tcp_builder(
    client: IpAddr,
    sport: u16,
    dst: IpAddr,
    dport: u16,
) -> etherparse::PacketBuilderStep<etherparse::TcpHeader> {
    let eth = PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC);
    match (client, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .tcp(sport, dport, 1000, 65535),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .tcp(sport, dport, 1000, 65535),
        _ => panic!("mixed families"),
    }
}

/// Which backend an L2 DSR output frame went to, from its destination MAC.
pub fn backend_of_output(out: &[u8], backends: &[IpAddr]) -> Option<IpAddr> {
    backends
        .iter()
        .copied()
        .find(|b| out.len() >= 6 && out[..6] == backend_mac(*b))
}

/// Keeps the calling thread on the CPU it runs on (per-CPU state such as round-robin
/// cursors and the flood window then stays the same across `BPF_PROG_TEST_RUN` calls).
pub fn pin_to_current_cpu() {
    // SAFETY: sched_getcpu has no preconditions; a zeroed cpu_set_t with one bit set, for the
    // calling thread.
    let (cpu, rc) = unsafe {
        let cpu = libc::sched_getcpu();
        assert!(
            cpu >= 0,
            "sched_getcpu: {}",
            std::io::Error::last_os_error()
        );
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        (
            cpu,
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
        )
    };
    assert_eq!(
        rc,
        0,
        "pinning the test thread to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

/// Ethernet + IPv4/IPv6 + UDP frame.
pub fn udp_frame(client: IpAddr, sport: u16, dst: IpAddr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC);
    let mut out = Vec::new();
    match (client, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .udp(sport, dport)
            .write(&mut out, payload),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .udp(sport, dport)
            .write(&mut out, payload),
        _ => panic!("mixed families"),
    }
    .expect("build UDP frame");
    out
}

/// Inserts an 802.1Q tag (VLAN `vid`) after the Ethernet addresses.
pub fn with_vlan(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    out.extend_from_slice(&0x8100u16.to_be_bytes());
    out.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    out.extend_from_slice(&frame[12..]);
    out
}

/// The frame L2 DSR makes of `frame`: to the backend's MAC, from the balancer's.
pub fn expect_l2dsr(frame: &[u8], backend: IpAddr) -> Vec<u8> {
    let mut out = frame.to_vec();
    out[0..6].copy_from_slice(&backend_mac(backend));
    out[6..12].copy_from_slice(&LB_MAC);
    out
}

/// Per-flow entropy for the outer header, as the design specifies it: the XOR of the client
/// address's first and last 32-bit words (packet byte order) and the source port.
pub fn encap_entropy(client: IpAddr, sport: u16) -> u32 {
    let (raw, _) = raw_from_ip(client);
    raw[0] ^ raw[3] ^ u32::from(sport.to_be())
}

/// How a frame is encapsulated.
#[derive(Clone, Copy, Debug)]
pub struct Encap {
    pub backend: IpAddr,
    /// Outer source (network part) and host-order mask of entropy bits.
    pub source: IpAddr,
    pub entropy_mask: u32,
    /// GUE destination port, or `None` for IPIP.
    pub gue_port: Option<u16>,
}

/// The frame the balancer makes of `frame` (Ethernet, optional VLAN tags, IP packet) when
/// encapsulating it to `e.backend`. `l3_off` is the inner IP header's offset in `frame`.
pub fn expect_encap(frame: &[u8], l3_off: usize, client: IpAddr, sport: u16, e: Encap) -> Vec<u8> {
    let inner = &frame[l3_off..];
    let inner_v4 = inner[0] >> 4 == 4;
    let inner_len = if inner_v4 {
        u16::from_be_bytes([inner[2], inner[3]]) as usize
    } else {
        40 + u16::from_be_bytes([inner[4], inner[5]]) as usize
    };
    let inner = &inner[..inner_len];
    let tos = if inner_v4 {
        inner[1]
    } else {
        (inner[0] << 4) | (inner[1] >> 4)
    };
    let entropy = encap_entropy(client, sport);
    let udp_len = e.gue_port.map_or(0, |_| 8);
    let mut out = Vec::new();
    out.extend_from_slice(&backend_mac(e.backend));
    out.extend_from_slice(&LB_MAC);
    // VLAN tags, if any, stay.
    out.extend_from_slice(&frame[12..l3_off - 2]);
    let inner_proto = if inner_v4 {
        IpNumber::IPV4
    } else {
        IpNumber::IPV6
    };
    let proto = if e.gue_port.is_some() {
        IpNumber::UDP
    } else {
        inner_proto
    };
    match (e.backend, e.source) {
        (IpAddr::V4(dst), IpAddr::V4(src)) => {
            out.extend_from_slice(&0x0800u16.to_be_bytes());
            let src = u32::from(src) | (entropy & e.entropy_mask);
            let mut h = Ipv4Header::new(
                (inner_len + udp_len) as u16,
                64,
                proto,
                src.to_be_bytes(),
                dst.octets(),
            )
            .expect("outer IPv4");
            h.dscp = etherparse::IpDscp::try_new(tos >> 2).expect("dscp");
            h.ecn = etherparse::IpEcn::try_new(tos & 3).expect("ecn");
            h.dont_fragment = true;
            h.header_checksum = h.calc_header_checksum();
            out.extend_from_slice(&h.to_bytes());
        }
        (IpAddr::V6(dst), IpAddr::V6(src)) => {
            out.extend_from_slice(&0x86ddu16.to_be_bytes());
            let mut s = src.octets();
            let last =
                u32::from_be_bytes([s[12], s[13], s[14], s[15]]) | (entropy & e.entropy_mask);
            s[12..].copy_from_slice(&last.to_be_bytes());
            let h = Ipv6Header {
                traffic_class: tos,
                flow_label: Ipv6FlowLabel::try_new(entropy & 0xf_ffff).expect("label"),
                payload_length: (inner_len + udp_len) as u16,
                next_header: proto,
                hop_limit: 64,
                source: s,
                destination: dst.octets(),
            };
            out.extend_from_slice(&h.to_bytes());
        }
        _ => panic!("outer source family must match the backend's"),
    }
    if let Some(port) = e.gue_port {
        let udp = UdpHeader {
            source_port: ((entropy & 0x3fff) | 0xc000) as u16,
            destination_port: port,
            length: (inner_len + 8) as u16,
            checksum: 0,
        };
        out.extend_from_slice(&udp.to_bytes());
    }
    out.extend_from_slice(inner);
    out
}

/// Sum of a frame's `len` bytes from `off` as 16-bit words (for checksum checks).
pub fn ones_complement_sum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in bytes.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Runs the XDP program behind `prog_fd` once on `frame` (`BPF_PROG_TEST_RUN`): the action and
/// the output length. Usable from any thread while the harness lives.
pub fn run_fd(
    prog_fd: std::os::fd::RawFd,
    frame: &[u8],
    out: &mut [u8],
) -> std::io::Result<(u32, usize)> {
    let mut attr = [0u8; 128];
    let put32 =
        |a: &mut [u8; 128], at: usize, v: u32| a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    let put64 =
        |a: &mut [u8; 128], at: usize, v: u64| a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    put32(&mut attr, 0, prog_fd as u32);
    put32(&mut attr, 8, frame.len() as u32);
    put32(&mut attr, 12, out.len() as u32);
    put64(&mut attr, 16, frame.as_ptr() as u64);
    put64(&mut attr, 24, out.as_mut_ptr() as u64);
    put32(&mut attr, 32, 1);
    // SAFETY: a zeroed bpf_attr for BPF_PROG_TEST_RUN (command 10) pointing at live buffers.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, 10, attr.as_mut_ptr(), attr.len() as u32) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let retval = u32::from_ne_bytes(attr[4..8].try_into().expect("4 bytes"));
    let len = u32::from_ne_bytes(attr[12..16].try_into().expect("4 bytes")) as usize;
    Ok((retval, len))
}
