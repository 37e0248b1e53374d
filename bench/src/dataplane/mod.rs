//! `cargo xtask bench dataplane`: nanoseconds per packet of the XDP program through
//! BPF_PROG_TEST_RUN, per path, in interleaved rounds, against a bare `XDP_PASS` program
//! measured in the same run.
//!
//! Paths that leave the frame reusable run with the kernel's `repeat` (one syscall, many runs,
//! the kernel's average). Encapsulating paths cannot: `repeat` does not restore the frame
//! between repetitions, so each repetition would add another outer header. They are timed as
//! many single runs instead, and compared with the bare program timed the same way (a single
//! run's figure includes the kernel's per-call timing overhead, so only same-method ratios mean
//! anything).

use std::collections::BTreeMap;
use std::net::IpAddr;

mod cases;
mod passive;

use cases::*;
use passive::*;

use anyhow::{Context as _, Result};
use aya::programs::{TestRun, TestRunOptions};
use balancer::base::config::RawConfig;
use balancer::dataplane::ebpf;

use balancer_tests::configs::{
    Extra, entropy_sources, forwarding_vips, harness_settings, scheduled_vip, to_toml,
};
use balancer_tests::packet::{Harness, XDP_PASS, XDP_TX, tcp_frame};

use super::{Figures, median};

/// Bootstrap resamples of the per-round ratios behind each path's 95% interval.
const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// Its page: ns per packet by path (`docs/benchmarks/dataplane.md`).
pub const PAGE: super::page::Page = super::page::Page {
    name: "dataplane",
    title: "Data plane: cost per packet",
    about: "Nanoseconds per packet of the XDP program per path, through `BPF_PROG_TEST_RUN`, \
            in 9 interleaved rounds (median), against a bare `XDP_PASS` program timed in the \
            same rounds. Paths that leave the frame reusable run with the kernel's `repeat` \
            (1,000,000 runs a call); encapsulating paths as 20,000 single runs a round, \
            compared with `xdp_pass_single`. Compare \"ns over XDP_PASS\" across machines, not \
            absolute figures. An old build beside a new one: `cargo xtask bench dataplane -- \
            --baseline OBJECT` (each path's new / old ratio with its bootstrap 95% interval).",
    columns: &[
        ("_ns", "ns"),
        ("_over_pass_ns", "ns over XDP_PASS"),
        ("_ratio_to_pass", "x XDP_PASS"),
    ],
    flat: &[],
};

/// How a case is timed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    /// One syscall with `repeat` runs.
    Repeat,
    /// Many syscalls of one run each.
    Single,
}

/// The bare `XDP_PASS` program, for the baseline.
struct Bare {
    object: aya::Ebpf,
}

impl Bare {
    fn load() -> Result<Bare> {
        Ok(Bare {
            object: ebpf::load_decap()?,
        })
    }

    fn run(&mut self, frame: &[u8], repeat: u32) -> Result<f64> {
        let program = ebpf::program(&mut self.object, ebpf::PASS_PROGRAM)?;
        let mut out = vec![0u8; 4096];
        let r = program
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                repeat,
                ..TestRunOptions::default()
            })
            .context("test run of the pass program")?;
        Ok(r.duration.as_nanos() as f64)
    }
}

fn time_case(h: &mut Harness, case: &Case, repeat: u32, singles: u32) -> Result<f64> {
    match case.method {
        Method::Repeat => {
            let (action, _, per_run) = h.run_raw(&case.frame, repeat)?;
            anyhow::ensure!(
                action == case.expect,
                "{}: action {action}, expected {}",
                case.key,
                case.expect
            );
            Ok(per_run.as_nanos() as f64)
        }
        Method::Single => {
            let mut total = 0u128;
            let mut frame = case.frame.clone();
            for i in 0..singles {
                if case.fresh_ports {
                    set_tcp_source_port(&mut frame, i);
                }
                let (action, _, t) = h.run_raw(&frame, 1)?;
                anyhow::ensure!(
                    action == case.expect,
                    "{}: action {action}, expected {}",
                    case.key,
                    case.expect
                );
                total += t.as_nanos();
            }
            Ok(total as f64 / f64::from(singles))
        }
    }
}

/// Runs the benchmark; returns the figures (also printed). With `baseline` (the ELF bytes of
/// another build of the balancer object, e.g. an earlier commit's), that program runs every
/// path in the same rounds, interleaved, and each path's new / baseline ratio is reported.
pub fn run(rounds: usize, repeat: u32, singles: u32, baseline: Option<&[u8]>) -> Result<Figures> {
    let mut h = Harness::new(&config())?;
    pin_flows(&mut h)?;
    // Whether the baseline program knows tenant affinity (else its configs leave it out).
    let mut baseline_prefix = true;
    let mut old = baseline
        .map(|object| -> Result<Harness> {
            let mut b = match Harness::with_object(&config(), object) {
                Ok(b) => b,
                Err(e) => {
                    println!(
                        "the baseline takes no tenant affinity ({e:#}): its source_hash_tenant case hashes whole addresses"
                    );
                    baseline_prefix = false;
                    Harness::with_object(&config_with(false), object)?
                }
            };
            pin_flows(&mut b)?;
            Ok(b)
        })
        .transpose()?;
    let mut bare = Bare::load()?;
    let c4 = ip("10.9.0.1");
    let c6 = ip("2001:db8::5");
    let payload = [0x42u8; 64];
    let cases = vec![
        Case {
            key: "non_vip",
            what: "non-VIP TCP (to the balancer's own address)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 2000, ip("10.111.0.2"), 22, false, &payload),
            expect: XDP_PASS,
            fresh_ports: false,
            target: Some("<= xdp_pass + 20"),
        },
        Case {
            key: "established_l2dsr",
            what: "established TCP, L2 DSR (conntrack hit)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 1000, ip("10.111.1.1"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60"),
        },
        Case {
            key: "established_ipv6",
            what: "established TCP over IPv6, L2 DSR",
            method: Method::Repeat,
            frame: tcp_frame(c6, 1003, ip("fd00:111:1::1"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60"),
        },
        Case {
            key: "new_flow",
            what: "new flow: TCP SYN, Maglev lookup + connection-table write (repeat: warm cache)",
            method: Method::Repeat,
            frame: tcp_frame(c4, 3000, ip("10.111.1.1"), 80, true, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 105"),
        },
        Case {
            key: "new_flow_fresh_single",
            what: "new flow from a new client port every run into a 1M-flow table (single runs: cold cache)",
            method: Method::Single,
            frame: tcp_frame(c4, 3000, ip("10.111.1.1"), 80, true, &payload),
            expect: XDP_TX,
            fresh_ports: true,
            target: None,
        },
        Case {
            key: "established_ipip",
            what: "established TCP, IPIP encapsulation (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1001, ip("10.111.1.2"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60 over single-run xdp_pass"),
        },
        Case {
            key: "established_gue",
            what: "established TCP, GUE encapsulation (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1002, ip("10.111.1.3"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: Some("<= 60 over single-run xdp_pass"),
        },
        Case {
            key: "established_l2dsr_single",
            what: "established TCP, L2 DSR (single runs)",
            method: Method::Single,
            frame: tcp_frame(c4, 1000, ip("10.111.1.1"), 80, false, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        },
    ];
    let mut cases = cases;
    for (i, (key, _, _, what)) in SCHEDULER_CASES.iter().enumerate() {
        cases.push(Case {
            key: Box::leak(format!("new_flow_{key}").into_boxed_str()),
            what,
            method: Method::Repeat,
            frame: tcp_frame(c4, 3000, scheduler_vip(i), 80, true, &payload),
            expect: XDP_TX,
            fresh_ports: false,
            target: None,
        });
    }
    // NAT and source NAT, each on a program of its own; the baseline's too where it knows NAT.
    let (mut nat, nat_cases) = nat_setup(Harness::new(&nat_config(true))?, &payload)?;
    let (mut snat, snat_cases) = snat_setup(Harness::new(&snat_config(true))?, &payload)?;
    let mut old_nat = baseline
        .and_then(|o| Harness::with_object(&nat_config(baseline_prefix), o).ok())
        .map(|h| nat_setup(h, &payload))
        .transpose()?;
    let mut old_snat = baseline
        .and_then(|o| Harness::with_object(&snat_config(baseline_prefix), o).ok())
        .map(|h| snat_setup(h, &payload))
        .transpose()?;
    let (mut adm, adm_cases) = admission_setup(Harness::new(&admission_config(true))?, &payload)?;
    let mut old_adm = baseline
        .map(|o| Harness::with_object(&admission_config(false), o))
        .transpose()?;
    let pass_frame = tcp_frame(c4, 2000, ip("10.111.0.2"), 22, false, &payload);
    let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut baseline_samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        samples
            .entry("xdp_pass")
            .or_default()
            .push(bare.run(&pass_frame, repeat)?);
        let mut single = 0.0;
        for _ in 0..singles {
            single += bare.run(&pass_frame, 1)?;
        }
        samples
            .entry("xdp_pass_single")
            .or_default()
            .push(single / f64::from(singles));
        for case in &cases {
            // With a baseline, the two programs take turns going first (drift within a
            // round falls on both alike).
            let baseline_first = round % 2 == 1;
            if let (Some(b), true) = (old.as_mut(), baseline_first) {
                let ns = time_case(b, case, repeat, singles)?;
                baseline_samples.entry(case.key).or_default().push(ns);
            }
            let ns = time_case(&mut h, case, repeat, singles)?;
            samples.entry(case.key).or_default().push(ns);
            if let (Some(b), false) = (old.as_mut(), baseline_first) {
                let ns = time_case(b, case, repeat, singles)?;
                baseline_samples.entry(case.key).or_default().push(ns);
            }
        }
        for ((h, cases), mut old) in [
            ((&mut nat, &nat_cases), old_nat.as_mut()),
            ((&mut snat, &snat_cases), old_snat.as_mut()),
        ] {
            for (i, case) in cases.iter().enumerate() {
                let baseline_first = round % 2 == 1;
                let mut old = old.as_deref_mut().map(|(b, c)| (b, &c[i]));
                if let (Some((b, c)), true) = (old.as_mut(), baseline_first) {
                    let ns = time_case(b, c, repeat, singles)?;
                    baseline_samples.entry(case.key).or_default().push(ns);
                }
                let ns = time_case(h, case, repeat, singles)?;
                samples.entry(case.key).or_default().push(ns);
                if let (Some((b, c)), false) = (old.as_mut(), baseline_first) {
                    let ns = time_case(b, c, repeat, singles)?;
                    baseline_samples.entry(case.key).or_default().push(ns);
                }
            }
        }
        // Admission control; the baseline runs its first case only (an open pool's new flow
        // is a plain Maglev new flow there).
        for (i, case) in adm_cases.iter().enumerate() {
            let baseline_first = round % 2 == 1;
            let mut old = old_adm.as_mut().filter(|_| i == 0);
            if let (Some(b), true) = (old.as_mut(), baseline_first) {
                let ns = time_case(b, case, repeat, singles)?;
                baseline_samples.entry(case.key).or_default().push(ns);
            }
            let ns = time_case(&mut adm, case, repeat, singles)?;
            samples.entry(case.key).or_default().push(ns);
            if let (Some(b), false) = (old.as_mut(), baseline_first) {
                let ns = time_case(b, case, repeat, singles)?;
                baseline_samples.entry(case.key).or_default().push(ns);
            }
        }
    }

    let base = median(&samples["xdp_pass"]);
    let base_single = median(&samples["xdp_pass_single"]);
    let mut figures = Figures::default();
    println!(
        "XDP program cost per packet (BPF_PROG_TEST_RUN, {rounds} interleaved rounds, median [min..max])"
    );
    println!(
        "{:<28} {:>8} {:>18} {:>8} {:>9}  target",
        "path", "ns", "spread", "x pass", "+ns"
    );
    let mut row = |key: &str, what: &str, single: bool, target: Option<&str>| {
        let s = &samples[key];
        let med = median(s);
        let min = s.iter().copied().fold(f64::INFINITY, f64::min);
        let max = s.iter().copied().fold(0.0, f64::max);
        let reference = if single { base_single } else { base };
        println!(
            "{:<28} {:>8.1} {:>8.1}..{:<8.1} {:>8.2} {:>+9.1}  {}",
            key,
            med,
            min,
            max,
            med / reference,
            med - reference,
            target.unwrap_or("")
        );
        println!("    {what}");
        figures.insert(format!("{key}_ns"), med);
        figures.insert(format!("{key}_ratio_to_pass"), med / reference);
        figures.insert(format!("{key}_over_pass_ns"), med - reference);
    };
    row("xdp_pass", "bare XDP_PASS program (repeat)", false, None);
    row(
        "xdp_pass_single",
        "bare XDP_PASS program (single runs)",
        true,
        None,
    );
    for case in cases
        .iter()
        .chain(&nat_cases)
        .chain(&snat_cases)
        .chain(&adm_cases)
    {
        row(
            case.key,
            case.what,
            case.method == Method::Single,
            case.target,
        );
    }
    if !baseline_samples.is_empty() {
        println!(
            "\nThis program against the baseline object, same rounds: median ns, the geometric mean of the rounds' new / baseline ratios, its bootstrap 95% interval, and the rounds' range"
        );
        println!(
            "{:<28} {:>8} {:>10} {:>8} {:>16} {:>16}  verdict",
            "path", "new", "baseline", "ratio", "95% interval", "range"
        );
        for case in cases
            .iter()
            .chain(&nat_cases)
            .chain(&snat_cases)
            .chain(&adm_cases)
        {
            let Some(base) = baseline_samples.get(case.key) else {
                continue;
            };
            let new = &samples[case.key];
            let ratios: Vec<f64> = new.iter().zip(base).map(|(n, b)| n / b).collect();
            let (ratio, ci) = super::geomean_with_95(&ratios, BOOTSTRAP_RESAMPLES);
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(0.0, f64::max);
            println!(
                "{:<28} {:>8.1} {:>10.1} {:>8.3} {:>7.3}..{:<7.3} {:>7.3}..{:<7.3}  {}",
                case.key,
                median(new),
                median(base),
                ratio,
                ci.0,
                ci.1,
                lo,
                hi,
                super::verdict(ci)
            );
            figures.insert(format!("{}_baseline_ns", case.key), median(base));
            figures.insert(format!("{}_new_over_baseline", case.key), ratio);
            figures.insert(format!("{}_new_over_baseline_ci_low", case.key), ci.0);
            figures.insert(format!("{}_new_over_baseline_ci_high", case.key), ci.1);
        }
    }
    passive_latency_cost(rounds, repeat, &mut figures)?;
    figures.insert("rounds".into(), rounds as f64);
    figures.insert("repeat".into(), f64::from(repeat));
    println!(
        "Targets from the data-plane issue: established <= 60 ns, new flow <= 105 ns, non-VIP <= 20 ns over bare XDP_PASS.\n\
         Single-run figures include the kernel's per-call timing overhead; compare them with xdp_pass_single."
    );
    Ok(figures)
}
