//! `balancer decap`: the backend side of the ipip and gue forwarding modes. Loads the decap
//! program on a backend's interface, accepting encapsulated packets addressed to that
//! interface's addresses (and any extra ones given), from the outer sources allowed (any, or
//! those `--allow` lists: the balancers), until SIGINT/SIGTERM.

use anyhow::{Context as _, Result};
use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use balancer_common::addr::raw_from_ip;
use balancer_common::maps::{
    DECAP_ADDRS, DECAP_CONFIG, DECAP_SOURCES_V4, DECAP_SOURCES_V6, DECAP_STATS, DecapAddrKey,
    DecapConfig, MAX_DECAP_ADDRS, MAX_DECAP_SOURCES,
};
use balancer_common::stats::DecapStats;
use std::net::IpAddr;
use tokio::signal::unix::{SignalKind, signal};

use crate::base::config::AttachMode;
use crate::base::net::{Prefix, lpm_word_v4, lpm_words_v6};
use crate::dataplane::ebpf;
use crate::dataplane::ebpf::xdp_mode;
use crate::dataplane::netinfo::Interface;

/// Options of `balancer decap`.
#[derive(Clone, Debug)]
pub struct DecapOptions {
    pub interface: String,
    pub attach_mode: AttachMode,
    /// GUE port to strip; `None` strips IPIP only.
    pub gue_port: Option<u16>,
    /// Outer destinations accepted besides the interface's own addresses.
    pub extra_addresses: Vec<IpAddr>,
    /// Outer sources accepted (the balancers' addresses); empty: any. Tunnelled packets from
    /// others are dropped.
    pub allowed_sources: Vec<Prefix>,
}

/// The decap program loaded and configured, not yet attached.
pub struct Decapsulator {
    object: aya::Ebpf,
}

impl Decapsulator {
    /// Loads the object and accepts `addresses` as outer destinations, from outer sources in
    /// `allowed` (empty: any).
    pub fn load(
        addresses: &[IpAddr],
        gue_port: Option<u16>,
        allowed: &[Prefix],
    ) -> Result<Decapsulator> {
        if addresses.len() > MAX_DECAP_ADDRS as usize {
            anyhow::bail!("at most {MAX_DECAP_ADDRS} local addresses can be accepted");
        }
        for v4 in [true, false] {
            if allowed.iter().filter(|p| p.addr.is_ipv4() == v4).count()
                > MAX_DECAP_SOURCES as usize
            {
                anyhow::bail!("at most {MAX_DECAP_SOURCES} --allow prefixes per address family");
            }
        }
        let mut object = ebpf::load_decap()?;
        let mut config: Array<&mut MapData, DecapConfig> = object
            .map_mut(DECAP_CONFIG)
            .context("decap object has no config map")?
            .try_into()?;
        config.set(
            0,
            DecapConfig {
                gue_port: gue_port.unwrap_or(0).to_be(),
                restrict_sources: u8::from(!allowed.is_empty()),
                _pad: 0,
            },
            0,
        )?;
        let mut addrs: HashMap<&mut MapData, DecapAddrKey, u8> = object
            .map_mut(DECAP_ADDRS)
            .context("decap object has no address map")?
            .try_into()?;
        for addr in addresses {
            let (raw, family) = raw_from_ip(*addr);
            addrs.insert(
                DecapAddrKey {
                    addr: raw,
                    family,
                    _pad: [0; 3],
                },
                1,
                0,
            )?;
        }
        for p in allowed {
            let len = u32::from(p.len);
            match p.addr {
                IpAddr::V4(a) => {
                    let mut trie: LpmTrie<&mut MapData, u32, u8> = object
                        .map_mut(DECAP_SOURCES_V4)
                        .context("decap object has no IPv4 source map")?
                        .try_into()?;
                    trie.insert(&LpmKey::new(len, lpm_word_v4(&a)), 1, 0)?;
                }
                IpAddr::V6(a) => {
                    let mut trie: LpmTrie<&mut MapData, [u32; 4], u8> = object
                        .map_mut(DECAP_SOURCES_V6)
                        .context("decap object has no IPv6 source map")?
                        .try_into()?;
                    trie.insert(&LpmKey::new(len, lpm_words_v6(&a)), 1, 0)?;
                }
            }
        }
        Ok(Decapsulator { object })
    }

    /// Attaches the decap program to `interface`.
    pub fn attach(&mut self, interface: &str, mode: AttachMode) -> Result<()> {
        ebpf::program(&mut self.object, ebpf::DECAP_PROGRAM)?
            .attach(interface, xdp_mode(mode))
            .with_context(|| format!("attaching the decap program to {interface} ({mode})"))?;
        Ok(())
    }

    /// The decap program (for `BPF_PROG_TEST_RUN` tests).
    pub fn program(&mut self) -> Result<&mut aya::programs::Xdp> {
        Ok(ebpf::program(&mut self.object, ebpf::DECAP_PROGRAM)?)
    }

    /// Counters summed over CPUs.
    pub fn stats(&self) -> Result<DecapStats> {
        let map: PerCpuArray<&MapData, DecapStats> = self
            .object
            .map(DECAP_STATS)
            .context("decap object has no stats map")?
            .try_into()?;
        let mut sum = DecapStats::default();
        for v in map.get(&0, 0)?.iter() {
            sum.ipip += v.ipip;
            sum.gue += v.gue;
            sum.foreign += v.foreign;
            sum.malformed += v.malformed;
            sum.refused += v.refused;
        }
        Ok(sum)
    }
}

/// Runs the decapsulator until SIGINT or SIGTERM.
pub async fn run(opts: DecapOptions) -> Result<()> {
    let iface = Interface::by_name(&opts.interface)?;
    let mut addresses: Vec<IpAddr> = iface.addresses.iter().map(|(a, _)| *a).collect();
    addresses.extend(&opts.extra_addresses);
    addresses.sort();
    addresses.dedup();
    let mut decap = Decapsulator::load(&addresses, opts.gue_port, &opts.allowed_sources)?;
    decap.attach(&opts.interface, opts.attach_mode)?;
    tracing::info!(
        interface = %opts.interface,
        mode = %opts.attach_mode,
        gue_port = opts.gue_port.unwrap_or(0),
        addresses = ?addresses,
        allowed_sources = ?opts.allowed_sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "decap ready"
    );
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    if let Ok(s) = decap.stats() {
        tracing::info!(
            ipip = s.ipip,
            gue = s.gue,
            foreign = s.foreign,
            malformed = s.malformed,
            refused = s.refused,
            "decap counters at exit"
        );
    }
    Ok(())
}
