//! `cargo xtask bench control`: the control plane's costs. Maglev table build time by backend
//! count and table size, slots moved by a removal or a reweight against the ideal, balance,
//! time to publish a table into the kernel, weight-change-to-first-packet latency, and the
//! daemon's resident memory with 100 VIPs x 100 backends.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::config::{Config, MacAddr};
use balancer_common::maglev::{MaglevBackend, build_table, slot_counts, slots_changed};

use super::{Figures, median};
use crate::netns::{Netns, PREFIX, sweep};
use crate::packet::{Harness, run_fd, tcp_frame};
use crate::topology::{Process, binary};

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

fn time_builds(n: usize, m: u32, runs: usize) -> Result<f64> {
    let names = names(n);
    let input = backends(&names, |_| 1);
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
        let small = time_builds(n, 65_537, 5)?;
        let large = time_builds(n, 655_373, 5)?;
        println!("{n:>8} {small:>12.2} {large:>12.2}");
        figures.insert(format!("maglev_build_{n}_65537_ms"), small);
        figures.insert(format!("maglev_build_{n}_655373_ms"), large);
    }
    println!("(Maglev paper: 1.8 ms at M=65537)");
    {
        let names = names(100);
        let input = backends(&names, |i| if i == 0 { 1 } else { 10 });
        let mut samples = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            std::hint::black_box(build_table(&input, 65_537)?);
            samples.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let ms = median(&samples);
        println!("100 backends with unequal weights, M=65537: {ms:.2} ms");
        figures.insert("maglev_build_100_weighted_65537_ms".into(), ms);
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

fn vip_config(
    vips: usize,
    backends_per_vip: usize,
    weights: impl Fn(usize, usize) -> u32,
) -> String {
    let mut text =
        String::from("interface = \"eth0\"\n[conntrack]\nmax_flows = 65536\nflood_threshold = 0\n");
    for v in 0..vips {
        let _ = write!(
            text,
            "[[vip]]\nname = \"v{v}\"\naddress = \"10.200.{}.{}\"\nport = 80\n",
            v / 250,
            v % 250 + 1
        );
        for b in 0..backends_per_vip {
            let _ = write!(
                text,
                "  [[vip.backend]]\n  address = \"10.{}.{}.{}\"\n  weight = {}\n  mac = \"02:00:00:00:{:02x}:{:02x}\"\n",
                64 + b / 250,
                b % 250,
                v % 250 + 1,
                weights(v, b),
                b / 256,
                b % 256
            );
        }
    }
    text
}

/// Publishing, and the time from a weight change to the first packet on the new table.
fn kernel(figures: &mut Figures) -> Result<()> {
    let base = vip_config(1, 100, |_, _| 10);
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
        let text = vip_config(1, 100, |_, b| if b as u32 == round { 1 } else { 10 });
        let config = Config::parse(&text)?;
        let mut moved = None;
        let before = h.balancer.vip("v0").context("vip")?.table.clone();
        let state = h.balancer.vip("v0").context("vip")?.clone();
        // Which flow will move: build the new table offline first.
        let after = {
            let staged = balancer::balancer::build_table("probe", 65_537, &{
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
        for port in 1024..60000u16 {
            let raw = balancer_common::addr::raw_from_ip(client).0;
            let s = balancer_common::flow_hash::slot(
                balancer_common::flow_hash::flow_hash(&raw, port.to_be()),
                state.config.table_size,
            ) as usize;
            if before[s] != after[s] {
                let new_mac = h
                    .balancer
                    .vip("v0")
                    .context("vip")?
                    .backends
                    .values()
                    .find(|b| b.id == after[s])
                    .map(|b| b.mac.0)
                    .context("backend")?;
                moved = Some((port, new_mac));
                break;
            }
        }
        let (port, new_mac) = moved.context("no flow moved by the reweight")?;
        let frame = tcp_frame(client, port, vip, 80, true, b"");
        // A prober sends the flow's SYN over and over from another thread and notes when the
        // new backend first answers; the daemon's apply runs meanwhile.
        let fd = h.program_fd()?;
        let started = Instant::now();
        let prober = std::thread::spawn(move || -> Option<Duration> {
            let mut out = vec![0u8; 2048];
            while started.elapsed() < Duration::from_secs(5) {
                if let Ok((_, len)) = run_fd(fd, &frame, &mut out)
                    && len >= 6
                    && out[0..6] == new_mac
                {
                    return Some(started.elapsed());
                }
            }
            None
        });
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

/// The real daemon's resident memory with 100 VIPs x 100 backends.
fn daemon_memory(figures: &mut Figures) -> Result<()> {
    let tag = format!("{PREFIX}-benchrss-");
    sweep(&tag);
    let ns = Netns::create(&format!("{tag}lb"))?;
    ns.sh("ip link add eth0 type veth peer name peer0 && ip link set eth0 up && ip link set peer0 up && ip addr add 10.255.0.2/24 dev eth0")?;
    let dir = std::env::temp_dir().join(format!("{tag}logs"));
    std::fs::create_dir_all(&dir)?;
    let config = vip_config(100, 100, |_, _| 1).replace(
        "interface = \"eth0\"",
        "interface = \"eth0\"\nattach_mode = \"skb\"",
    );
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
    drop(ns);
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
    daemon_memory(&mut figures)?;
    Ok(figures)
}
