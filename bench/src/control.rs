//! `cargo xtask bench control`: the control plane's costs. Maglev table build time by backend
//! count and table size, slots moved by a removal or a reweight against the ideal, balance,
//! time to publish a table into the kernel, weight-change-to-first-packet latency, and the
//! time from backend reports (scrape results) to the table they weight being live, and the
//! daemon's resident memory with 100 VIPs x 100 backends.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::base::config::{Config, RawConfig};
use balancer::base::net::MacAddr;
use balancer_common::maglev::{MaglevBackend, build_table, slot_counts, slots_changed};

use super::{Figures, median};
use balancer_tests::configs::{backend, harness_settings, to_toml, vip};
use balancer_tests::netns::{Netns, PREFIX, sweep};
use balancer_tests::packet::{Harness, run_fd, tcp_frame};
use balancer_tests::rack::{Process, binary, mount_pin_root, pin_root};

/// Its page: the control plane's costs (`docs/benchmarks/control.md`).
pub const PAGE: super::page::Page = super::page::Page {
    name: "control",
    title: "Control plane: tables, weight changes, memory",
    about: "Maglev table build time by backend count and table size, slots moved by a removal \
            or a reweight against the ideal, balance, the time to publish a table into the \
            kernel, from a weight change to the first packet that follows it, from 100 backends' \
            reports to their table being live, and the daemon's resident memory with 100 VIPs \
            x 100 backends. Units are in the names (ms, MiB, pct).",
    columns: &[],
    flat: &[],
};

fn names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256 + 1))
        .collect()
}

fn backends(names: &[String], weight: impl Fn(usize) -> u32) -> Vec<MaglevBackend<'_>> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| MaglevBackend {
            identity: n.as_bytes(),
            weight: weight(i),
            id: i as u32,
        })
        .collect()
}

/// Median build time in ms of a table of `m` slots for `n` backends weighted by `weight`.
fn time_builds(n: usize, m: u32, runs: usize, weight: impl Fn(usize) -> u32) -> Result<f64> {
    let names = names(n);
    let input = backends(&names, weight);
    let mut samples = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let table = build_table(&input, m)?;
        samples.push(started.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(table);
    }
    Ok(median(&samples))
}

/// Maglev figures that need no kernel.
fn maglev(figures: &mut Figures) -> Result<()> {
    println!("Maglev table build time (median of 5), ms");
    println!("{:>8} {:>12} {:>12}", "backends", "M=65537", "M=655373");
    for n in [10usize, 100, 1000, 5000] {
        let small = time_builds(n, 65_537, 5, |_| 1)?;
        let large = time_builds(n, 655_373, 5, |_| 1)?;
        println!("{n:>8} {small:>12.2} {large:>12.2}");
        figures.insert(format!("maglev_build_{n}_65537_ms"), small);
        figures.insert(format!("maglev_build_{n}_655373_ms"), large);
    }
    println!("(Maglev paper: 1.8 ms at M=65537)");
    let ms = time_builds(100, 65_537, 5, |i| if i == 0 { 1 } else { 10 })?;
    println!("100 backends with unequal weights, M=65537: {ms:.2} ms");
    figures.insert("maglev_build_100_weighted_65537_ms".into(), ms);
    // The tables a load-driven policy publishes for a small pool: one or two backends far
    // ahead, the rest at the floor (the last backend with quota left takes the free slots in
    // one pass instead of walking to them).
    for (key, weights) in [
        ("one_ahead", [1000u32, 240, 10, 10]),
        ("two_ahead", [620, 410, 10, 20]),
    ] {
        let ms = time_builds(4, 65_537, 21, |i| weights[i])?;
        println!("4 backends weighted {weights:?}, M=65537: {ms:.3} ms (median of 21)");
        figures.insert(format!("maglev_build_4_{key}_65537_ms"), ms);
    }

    println!("\nSlots moved (M=65537), against what must move");
    println!(
        "{:>8} {:>22} {:>22} {:>10} {:>10}",
        "backends", "remove one: moved", "reweight one: moved", "max/mean", "min/mean"
    );
    for n in [10usize, 100, 1000] {
        let m = 65_537u32;
        let names = names(n);
        let all = backends(&names, |_| 10);
        let before = build_table(&all, m)?;
        let gone = (n / 2) as u32;
        let rest: Vec<_> = all.iter().copied().filter(|b| b.id != gone).collect();
        let after = build_table(&rest, m)?;
        let removed_slots = slot_counts(&before)[&gone];
        let moved = slots_changed(&before, &after);
        let extra_remove = (moved - removed_slots) as f64 / f64::from(m) * 100.0;

        let reweighted: Vec<_> = all
            .iter()
            .map(|b| MaglevBackend {
                weight: if b.id == gone { 5 } else { b.weight },
                ..*b
            })
            .collect();
        let after_w = build_table(&reweighted, m)?;
        let lost = slot_counts(&before)[&gone] - slot_counts(&after_w)[&gone];
        let moved_w = slots_changed(&before, &after_w);
        let extra_weight = (moved_w - lost) as f64 / f64::from(m) * 100.0;

        let counts = slot_counts(&before);
        let mean = f64::from(m) / n as f64;
        let max = *counts.values().max().unwrap_or(&0) as f64 / mean;
        let min = *counts.values().min().unwrap_or(&0) as f64 / mean;
        println!(
            "{n:>8} {:>12} (+{extra_remove:.2}%) {:>12} (+{extra_weight:.2}%) {max:>10.4} {min:>10.4}",
            moved, moved_w
        );
        figures.insert(format!("remove_one_of_{n}_slots_moved"), moved as f64);
        figures.insert(
            format!("remove_one_of_{n}_ideal_slots"),
            removed_slots as f64,
        );
        figures.insert(format!("remove_one_of_{n}_extra_pct"), extra_remove);
        figures.insert(format!("reweight_one_of_{n}_slots_moved"), moved_w as f64);
        figures.insert(format!("reweight_one_of_{n}_ideal_slots"), lost as f64);
        figures.insert(format!("reweight_one_of_{n}_extra_pct"), extra_weight);
        figures.insert(format!("balance_{n}_max_over_mean"), max);
        figures.insert(format!("balance_{n}_min_over_mean"), min);
    }
    println!("(ideal: a removal moves only the removed backend's slots, 1/N of the table; the");
    println!(" percentage is the extra share of the table that moved between survivors)");
    Ok(())
}

/// `vips` VIPs of `backends_per_vip` backends each (with MACs, so nothing is resolved),
/// backend `b` of VIP `v` weighted `weights(v, b)`.
fn vip_config(
    vips: usize,
    backends_per_vip: usize,
    weights: impl Fn(usize, usize) -> u32,
) -> RawConfig {
    let mut config = harness_settings(65_536);
    config.conntrack.removal_grace_secs = None;
    for v in 0..vips {
        let address = format!("10.200.{}.{}", v / 250, v % 250 + 1);
        let mut vip = vip(&format!("v{v}"), address, 80);
        vip.backend = (0..backends_per_vip)
            .map(|b| {
                let mut backend = backend(
                    format!("10.{}.{}.{}", 64 + b / 250, b % 250, v % 250 + 1),
                    Some(weights(v, b)),
                );
                backend.mac = Some(format!("02:00:00:00:{:02x}:{:02x}", b / 256, b % 256));
                backend
            })
            .collect();
        config.vip.push(vip);
    }
    config
}

/// Publishing, and the time from a weight change to the first packet on the new table.
fn kernel(figures: &mut Figures) -> Result<()> {
    let base = to_toml(&vip_config(1, 100, |_, _| 10));
    let mut h = Harness::new(&base)?;
    // Publish time: rebuild and swap one VIP's table (100 backends) through the daemon's path.
    let mut publish = Vec::new();
    let mut build = Vec::new();
    let mut kernel_publish = Vec::new();
    let mut first_packet = Vec::new();
    let client: IpAddr = "10.9.9.9".parse()?;
    let vip: IpAddr = "10.200.0.1".parse()?;
    for round in 0..20u32 {
        // Reweight backend `round` and find a flow whose backend the change moves.
        let text = to_toml(&vip_config(
            1,
            100,
            |_, b| {
                if b as u32 == round { 1 } else { 10 }
            },
        ));
        let config = Config::parse(&text)?;
        let before = h.balancer.vip("v0").context("vip")?.table.clone();
        let state = h.balancer.vip("v0").context("vip")?.clone();
        // Which flow will move: build the new table offline first.
        let after = {
            let staged = balancer::vips::build_table("probe", 65_537, &{
                let mut b = state.backends.clone();
                for s in b.values_mut() {
                    if let Some(c) = config.vips[0]
                        .backends
                        .iter()
                        .find(|c| c.address == s.address)
                    {
                        s.weight = c.weight;
                    }
                }
                b
            })?;
            staged.0
        };
        let (port, new_mac) = moved_flow(&h, &before, &after, client)?;
        // A prober sends the flow's SYN over and over from another thread and notes when the
        // new backend first answers; the daemon's apply runs meanwhile.
        let fd = h.program_fd()?;
        let started = Instant::now();
        let prober = probe_until(
            fd,
            tcp_frame(client, port, vip, 80, true, b""),
            new_mac,
            started,
        );
        let report = h
            .balancer
            .apply(&config.vips, &HashMap::<IpAddr, MacAddr>::new())?;
        let published = started.elapsed();
        build.push(report.table_build_time.as_secs_f64() * 1e3);
        kernel_publish.push(report.table_publish_time.as_secs_f64() * 1e3);
        let live = prober
            .join()
            .map_err(|_| anyhow::anyhow!("prober panicked"))?
            .context("the new table never answered")?;
        let frame = tcp_frame(client, port, vip, 80, true, b"");
        let (_, out) = h.run(&frame)?;
        if out[0..6] != new_mac {
            bail!("a packet after the change did not use the new table");
        }
        publish.push(published.as_secs_f64() * 1e3);
        first_packet.push(live.as_secs_f64() * 1e3);
        // Back to the base weights for the next round.
        h.reconfigure(&base)?;
    }
    let publish_ms = median(&publish);
    let build_ms = median(&build);
    let kernel_ms = median(&kernel_publish);
    let first_ms = median(&first_packet);
    println!("\nWeight change of one backend (VIP of 100 backends, M=65537), median of 20:");
    println!("  table build:                                    {build_ms:.3} ms");
    println!("  publish into the kernel (new map, fill, swap):  {kernel_ms:.3} ms");
    println!("  whole apply (returns after the kernel's wait):  {publish_ms:.3} ms");
    println!("  weight change to first packet on the new table: {first_ms:.3} ms");
    println!("  (the swap is live at once; the kernel then waits an RCU grace period for programs");
    println!("   still reading the old table before the update call returns)");
    figures.insert("table_build_100_65537_ms".into(), build_ms);
    figures.insert("publish_table_100_65537_ms".into(), kernel_ms);
    figures.insert("apply_weight_change_100_65537_ms".into(), publish_ms);
    figures.insert("weight_change_to_first_packet_ms".into(), first_ms);
    Ok(())
}

/// A flow (source port from `client`) whose slot the change from `before` to `after` gives to
/// another backend, and that backend's MAC.
fn moved_flow(
    h: &Harness,
    before: &[u32],
    after: &[u32],
    client: IpAddr,
) -> Result<(u16, [u8; 6])> {
    let state = h.balancer.vip("v0").context("vip")?;
    let raw = balancer_common::addr::raw_from_ip(client).0;
    for port in 1024..60000u16 {
        let s = balancer_common::flow_hash::slot(
            balancer_common::flow_hash::flow_hash(&raw, port.to_be()),
            state.config.table_size,
        ) as usize;
        if before[s] != after[s] {
            let mac = state
                .backends
                .values()
                .find(|b| b.id == after[s])
                .map(|b| b.mac.0)
                .context("backend")?;
            return Ok((port, mac));
        }
    }
    bail!("no flow moved by the change")
}

/// Sends `frame` through the program over and over from another thread until the answer
/// goes to `mac`; returns how long after `started` that was.
fn probe_until(
    fd: std::os::fd::RawFd,
    frame: Vec<u8>,
    mac: [u8; 6],
    started: Instant,
) -> std::thread::JoinHandle<Option<Duration>> {
    std::thread::spawn(move || {
        let mut out = vec![0u8; 2048];
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok((_, len)) = run_fd(fd, &frame, &mut out)
                && len >= 6
                && out[0..6] == mac
            {
                return Some(started.elapsed());
            }
        }
        None
    })
}

/// A page as a vLLM server with a DCGM exporter beside it reports: `used_gib` of 80 GiB.
fn inference_page(used_gib: u64, backend: usize) -> String {
    let (used, free) = (used_gib * 1024, (80 - used_gib) * 1024);
    let mut page = String::new();
    for engine in 0..2 {
        let _ = write!(
            page,
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"{engine}\",model_name=\"llama\"}} {}\n\
             # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"{engine}\",model_name=\"llama\"}} 2\n\
             # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"{engine}\",model_name=\"llama\"}} 0.4\n\
             # TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{engine=\"{engine}\",model_name=\"llama\"}} {}\n",
            backend % 7,
            1000 * backend
        );
    }
    let _ = write!(
        page,
        "# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{{gpu=\"0\",modelName=\"H100\"}} {used}\n\
         # TYPE DCGM_FI_DEV_FB_FREE gauge\nDCGM_FI_DEV_FB_FREE{{gpu=\"0\",modelName=\"H100\"}} {free}\n"
    );
    page
}

/// Scrape results to table live: a VIP of 100 backends under the `gpu` policy; one backend's
/// page changes; the pages of all 100 are parsed, the round runs (policy, table build,
/// publish), and a prober notes when a flow the change moves first reaches its new backend.
fn telemetry(figures: &mut Figures) -> Result<()> {
    let mut rig = TelemetryRig::new()?;
    let base: Vec<String> = (0..100).map(|b| inference_page(40, b)).collect();
    rig.scrape(&base)?;
    rig.round()?;
    let client: IpAddr = "10.9.9.9".parse()?;
    let vip_addr: IpAddr = "10.200.0.1".parse()?;
    let (mut to_live, mut round_ms, mut parse_ms) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..20usize {
        // Backend `round` fills its GPU: 60 of 80 GiB used halves its weight.
        let mut pages = base.clone();
        pages[round] = inference_page(60, round);
        let before = rig.h.balancer.vip("v0").context("vip")?.table.clone();
        let after = rig.table_halving(round)?;
        let (port, new_mac) = moved_flow(&rig.h, &before, &after, client)?;
        let fd = rig.h.program_fd()?;
        let started = Instant::now();
        let prober = probe_until(
            fd,
            tcp_frame(client, port, vip_addr, 80, true, b""),
            new_mac,
            started,
        );
        rig.scrape(&pages)?;
        let parsed = started.elapsed();
        let outcome = rig.round()?;
        let returned = started.elapsed();
        if outcome.report.tables_published != 1 {
            bail!(
                "round {round}: the change published no table: {:?}",
                outcome.decisions[round]
            );
        }
        let live = prober
            .join()
            .map_err(|_| anyhow::anyhow!("prober panicked"))?
            .context("the new table never answered")?;
        parse_ms.push(parsed.as_secs_f64() * 1e3);
        round_ms.push(returned.as_secs_f64() * 1e3);
        to_live.push(live.as_secs_f64() * 1e3);
        // Back to the base pages.
        rig.scrape(&base)?;
        rig.round()?;
    }
    let (parse, whole, live) = (median(&parse_ms), median(&round_ms), median(&to_live));
    println!(
        "\nScrape results to table live (VIP of 100 backends, gpu policy, M=65537), median of 20:"
    );
    println!("  parse 100 pages (vLLM + DCGM) into reports:      {parse:.3} ms");
    println!("  + policy, table build, publish (call returns):  {whole:.3} ms");
    println!(
        "  scrape results in hand to first packet on the new table: {live:.3} ms (target < 5 ms)"
    );
    figures.insert("telemetry_parse_100_pages_ms".into(), parse);
    figures.insert("telemetry_round_100_returns_ms".into(), whole);
    figures.insert("telemetry_scrape_to_live_100_ms".into(), live);
    Ok(())
}

/// A VIP of 100 backends under the `gpu` policy on the XDP program, with its telemetry store
/// and policy state, driven as the daemon's telemetry loop drives them.
struct TelemetryRig {
    h: Harness,
    vip: balancer::base::config::VipConfig,
    addresses: Vec<IpAddr>,
    store: balancer::steering::telemetry::store::TelemetryStore,
    policy: balancer::steering::policy::PolicyState,
    flows: HashMap<u32, u64>,
}

impl TelemetryRig {
    fn new() -> Result<TelemetryRig> {
        use balancer::steering::policy::{PolicyConfig, PolicyKind};
        let text = to_toml(&vip_config(1, 100, |_, _| 1));
        let h = Harness::new(&text)?;
        let mut vip = Config::parse(&text)?.vips.remove(0);
        vip.policy = PolicyConfig {
            kind: PolicyKind::Gpu,
            ewma_alpha: 1.0,
            ..PolicyConfig::default()
        };
        Ok(TelemetryRig {
            h,
            addresses: vip.backends.iter().map(|b| b.address).collect(),
            vip,
            store: Default::default(),
            policy: Default::default(),
            flows: HashMap::new(),
        })
    }

    /// Each backend's page parsed and recorded, as a scrape's results.
    fn scrape(&mut self, pages: &[String]) -> Result<()> {
        use balancer::steering::telemetry::{page, signals};
        let now = Instant::now();
        let endpoint = self.vip.endpoint();
        for (address, page) in self.addresses.iter().zip(pages) {
            let samples = page::parse(page).map_err(|e| anyhow::anyhow!(e))?;
            let signals = signals::extract(&samples)
                .validate()
                .map_err(|e| anyhow::anyhow!("{address}: {e}"))?;
            self.store.entry(&endpoint, *address).record(
                signals,
                now,
                self.vip.telemetry.derived_half_life,
            );
        }
        Ok(())
    }

    /// A weight round: the policy, the table build, the publish.
    fn round(&mut self) -> Result<balancer::steering::telemetry::round::RoundOutcome> {
        Ok(balancer::steering::telemetry::round::weight_round(
            &self.vip,
            &mut self.h.balancer,
            &self.store,
            &self.flows,
            &mut self.policy,
            Instant::now(),
        )?)
    }

    /// The table the round will build once backend `round`'s weight halves.
    fn table_halving(&self, round: usize) -> Result<Vec<u32>> {
        let mut backends = self.h.balancer.vip("v0").context("vip")?.backends.clone();
        for b in backends.values_mut() {
            b.policy_weight = Some(if b.address == self.addresses[round] {
                500
            } else {
                1000
            });
        }
        Ok(balancer::vips::build_table("probe", 65_537, &backends)?.0)
    }
}

/// The real daemon's resident memory with 100 VIPs x 100 backends.
fn daemon_memory(figures: &mut Figures) -> Result<()> {
    let tag = format!("{PREFIX}-benchrss-");
    sweep(&tag);
    let ns = Netns::create(&format!("{tag}lb"))?;
    ns.sh("ip link add eth0 type veth peer name peer0 && ip link set eth0 up && ip link set peer0 up && ip addr add 10.255.0.2/24 dev eth0")?;
    let dir = std::env::temp_dir().join(format!("{tag}logs"));
    std::fs::create_dir_all(&dir)?;
    // Pins on the tests' own BPF filesystem: `ip netns exec` hides /sys/fs/bpf.
    mount_pin_root()?;
    let pins = pin_root().join(format!("{tag}pins"));
    let _ = balancer::dataplane::pinning::Pins::new(pins.clone()).remove();
    let mut config = vip_config(100, 100, |_, _| 1);
    config.attach_mode = Some("skb".into());
    config.pin_dir = Some(pins.display().to_string());
    config.state_file = Some(dir.join("state.json").display().to_string());
    config.api.socket = Some(dir.join("api.sock").display().to_string());
    let config = to_toml(&config);
    let path = dir.join("balancer.toml");
    std::fs::write(&path, config)?;
    let bin = binary("balancer")?;
    let mut p = Process::spawn(
        &ns,
        "balancer",
        &[
            bin.to_str().unwrap_or_default(),
            "run",
            "--config",
            path.to_str().unwrap_or_default(),
        ],
        &dir,
    )?;
    p.wait_for_log("balancer ready", Duration::from_secs(120))?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid()))?;
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS")?;
    let build_ms: f64 = p
        .log_text()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("build_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    drop(p);
    let _ = balancer::dataplane::pinning::Pins::new(pins).remove();
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "\nDaemon with 100 VIPs x 100 backends (M=65537): RSS {:.1} MiB; all tables built and published in {build_ms:.0} ms",
        rss_kib / 1024.0
    );
    figures.insert("daemon_rss_100x100_mib".into(), rss_kib / 1024.0);
    figures.insert("daemon_publish_100x100_ms".into(), build_ms);
    Ok(())
}

/// Runs the benchmark; returns the figures (also printed).
pub fn run() -> Result<Figures> {
    let mut figures = Figures::new();
    maglev(&mut figures)?;
    kernel(&mut figures)?;
    telemetry(&mut figures)?;
    daemon_memory(&mut figures)?;
    Ok(figures)
}
