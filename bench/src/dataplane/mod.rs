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
mod katran;
mod passive;

use cases::*;
use passive::*;

use anyhow::{Context as _, Result};
use aya::programs::{TestRun, TestRunOptions, Xdp};
use balancer::base::config::RawConfig;
use balancer::dataplane::ebpf;

use balancer_tests::configs::{
    Extra, entropy_sources, forwarding_vips, harness_settings, scheduled_vip, to_toml,
};
use balancer_tests::packet::{Harness, XDP_PASS, XDP_TX, tcp_frame};

use super::{BOOTSTRAP_RESAMPLES, Figures, median};

/// Its page: ns per packet by path (`docs/benchmarks/dataplane.md`).
pub const PAGE: super::page::Page = super::page::Page {
    name: "dataplane",
    title: "Data plane: cost per packet",
    about: "Nanoseconds per packet of the XDP program per path, through `BPF_PROG_TEST_RUN`, \
            the median of interleaved rounds (`rounds` below), against a bare `XDP_PASS` program timed in the \
            same rounds. Paths that leave the frame reusable run with the kernel's `repeat` \
            (1,000,000 runs a call); encapsulating paths as 20,000 single runs a round, \
            compared with `xdp_pass_single`. Compare \"ns over XDP_PASS\" across machines, not \
            absolute figures. An old build beside a new one: `cargo xtask bench dataplane -- \
            --baseline OBJECT` (each path's new / old ratio with its bootstrap 95% interval). \
            With `--katran-object PATH` (Katran's balancer built from its source), the \
            `vs_katran_*` rows time four paths on both programs as single runs: ours, ours over \
            the single-run floor, Katran's, and ours / Katran's net of that floor with its 95% \
            interval and the issue's target.",
    columns: &[
        ("_ns", "ns"),
        ("_over_pass_ns", "ns over XDP_PASS"),
        ("_ratio_to_pass", "x XDP_PASS"),
        ("_katran_ns", "Katran ns"),
        ("_net_over_katran", "net / Katran's"),
        ("_net_over_katran_low", "95% from"),
        ("_net_over_katran_high", "95% to"),
        ("_net_over_katran_target", "target"),
    ],
    flat: &[],
};

/// How a case is timed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// One syscall with `repeat` runs.
    Repeat,
    /// Many syscalls of one run each.
    Single,
}

/// The bare `XDP_PASS` program, for the baseline.
pub(crate) struct Bare {
    object: aya::Ebpf,
}

impl Bare {
    pub(crate) fn load() -> Result<Bare> {
        Ok(Bare {
            object: ebpf::load_decap()?,
        })
    }

    /// `repeat` runs of `frame` in one call: the kernel's mean ns per run.
    pub(crate) fn run(&mut self, frame: &[u8], repeat: u32) -> Result<f64> {
        let program = ebpf::program(&mut self.object, ebpf::PASS_PROGRAM)?;
        let (_, ns) = test_run(program, frame, repeat).context("the pass program")?;
        Ok(ns)
    }
}

/// `BPF_PROG_TEST_RUN` of `program` `repeat` times: the action and the kernel's mean ns per run.
pub(crate) fn test_run(program: &mut Xdp, frame: &[u8], repeat: u32) -> Result<(u32, f64)> {
    let mut out = [0u8; 4096];
    let r = program
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    Ok((r.return_value, r.duration.as_nanos() as f64))
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

/// How the benchmark runs.
pub struct Settings<'a> {
    /// Interleaved rounds (the most, with `until_width`).
    pub rounds: usize,
    pub repeat: u32,
    pub singles: u32,
    /// Another build's object, timed beside this one in the same rounds.
    pub baseline: Option<&'a [u8]>,
    /// Load every program afresh every this many rounds (0: once).
    pub reload_every: usize,
    /// Stop once every ratio's 95% interval is within ± this, after [`MIN_ROUNDS`].
    pub until_width: Option<f64>,
    /// Katran's object (built from its source), timed beside this program (`katran`).
    pub katran: Option<&'a [u8]>,
}

/// Rounds before `until_width` may stop a run.
const MIN_ROUNDS: usize = 6;

/// Runs the benchmark; returns the figures (also printed). With a baseline (the ELF bytes of
/// another build of the balancer object, e.g. an earlier commit's), that program runs every
/// path in the same rounds, interleaved, and each path's new / baseline ratio is reported;
/// with Katran's object, four paths are timed on it beside ours (`katran`).
pub fn run(settings: &Settings) -> Result<Figures> {
    let Settings {
        rounds,
        repeat,
        singles,
        baseline,
        reload_every,
        until_width,
        katran,
    } = *settings;
    let payload = [0x42u8; 64];
    let load = || -> Result<(Programs, Option<Programs>, Bare)> {
        let new = Programs::load(&payload)?;
        let old = baseline
            .map(|object| Programs::load_baseline(object, &payload, &new))
            .transpose()?;
        Ok((new, old, Bare::load()?))
    };
    let (mut new, mut old, mut bare) = load()?;
    let mut figures = Figures::default();
    verifier_headroom(&mut new, old.as_mut(), &mut figures)?;
    let load_katran = || katran.map(katran::Pair::load).transpose();
    let mut pair = load_katran()?;
    let mut beside_katran = katran::Samples::default();
    let pass_frame = tcp_frame(ip("10.9.0.1"), 2000, ip("10.111.0.2"), 22, false, &payload);
    let timing = Timing { repeat, singles };
    let mut samples = Samples::default();
    let mut done = 0;
    for round in 0..rounds {
        if reload_every > 0 && round > 0 && round % reload_every == 0 {
            (new, old, bare) = load()?;
            pair = load_katran()?;
        }
        samples.time_pass(&mut bare, &pass_frame, timing)?;
        samples.time_round(&mut new, old.as_mut(), round, timing)?;
        if let Some(pair) = pair.as_mut() {
            beside_katran.time_round(pair, round, singles)?;
        }
        done = round + 1;
        if let Some(width) = until_width
            && done >= MIN_ROUNDS
            && samples.widest_half_interval() <= width
        {
            println!("every ratio's 95% interval within ±{width} after {done} rounds");
            break;
        }
    }
    let cases: Vec<&Case> = new.cases().collect();
    samples.print_table(done, &cases, &mut figures);
    if !samples.baseline.is_empty() {
        samples.print_baseline(&cases, &mut figures);
    }
    if pair.is_some() {
        beside_katran.print(&samples.new["xdp_pass_single"], &mut figures);
    }
    passive_latency_cost(done, repeat, &mut figures)?;
    figures.insert("rounds".into(), done as f64);
    figures.insert("repeat".into(), f64::from(repeat));
    figures.insert("reload_every".into(), reload_every as f64);
    println!(
        "Programs loaded afresh every {} round(s).\n\
         Targets from the data-plane issue: established <= 60 ns, new flow <= 105 ns, non-VIP <= 20 ns over bare XDP_PASS.\n\
         Single-run figures include the kernel's per-call timing overhead; compare them with xdp_pass_single.",
        if reload_every == 0 {
            done
        } else {
            reload_every
        }
    );
    Ok(figures)
}

/// The verifier's limit on the instructions it processes to accept one program, its global
/// functions included (`BPF_COMPLEXITY_LIMIT_INSNS`).
const VERIFIER_LIMIT: u32 = 1_000_000;

/// Prints how many instructions the verifier processed to accept each build (a change that
/// crosses the limit fails to load with E2BIG), and records them.
fn verifier_headroom(
    new: &mut Programs,
    old: Option<&mut Programs>,
    figures: &mut Figures,
) -> Result<()> {
    let mut line = |name: &str, key: &str, h: &mut Harness| -> Result<()> {
        let n = h.verified_insns()?;
        println!(
            "{name}: the verifier processed {n} instructions ({:.1}% of its limit of {VERIFIER_LIMIT})",
            100.0 * f64::from(n) / f64::from(VERIFIER_LIMIT)
        );
        figures.insert(key.into(), f64::from(n));
        Ok(())
    };
    line("this build", "verified_insns", &mut new.main.0)?;
    if let Some(old) = old {
        line("the baseline", "baseline_verified_insns", &mut old.main.0)?;
    }
    Ok(())
}

/// Runs per timed case.
#[derive(Clone, Copy)]
struct Timing {
    repeat: u32,
    singles: u32,
}

/// One build of the program, loaded once per kind of case: the main config, NAT, source NAT
/// and admission control, each a program of its own with its cases. A baseline build loads
/// what its maps allow (no NAT program where it knows no NAT).
struct Programs {
    main: (Harness, Vec<Case>),
    nat: Option<(Harness, Vec<Case>)>,
    snat: Option<(Harness, Vec<Case>)>,
    admission: Option<(Harness, Vec<Case>)>,
}

impl Programs {
    /// This build's programs.
    fn load(payload: &[u8]) -> Result<Programs> {
        Ok(Programs {
            main: (main_harness(&config())?, main_cases(payload)),
            nat: Some(nat_setup(Harness::new(&nat_config(true))?, payload)?),
            snat: Some(snat_setup(Harness::new(&snat_config(true))?, payload)?),
            admission: Some(admission_setup(
                Harness::new(&admission_config(AdmissionLevel::Fair))?,
                payload,
            )?),
        })
    }

    /// A baseline object's programs: what its maps allow, timed with this build's first
    /// admission case (an open pool's new flow, a plain Maglev new flow where the baseline has
    /// no admission control).
    fn load_baseline(object: &[u8], payload: &[u8], new: &Programs) -> Result<Programs> {
        // Whether the baseline program knows tenant affinity (else its configs leave it out).
        let (main, prefix) = match Harness::with_object(&config(), object) {
            Ok(h) => (h, true),
            Err(e) => {
                println!(
                    "the baseline takes no tenant affinity ({e:#}): its source_hash_tenant case hashes whole addresses"
                );
                (Harness::with_object(&config_with(false), object)?, false)
            }
        };
        let mut main = main;
        pin_flows(&mut main)?;
        let nat = Harness::with_object(&nat_config(prefix), object)
            .ok()
            .map(|h| nat_setup(h, payload))
            .transpose()?;
        let snat = Harness::with_object(&snat_config(prefix), object)
            .ok()
            .map(|h| snat_setup(h, payload))
            .transpose()?;
        // A baseline that knows admission control runs the open pool's case as this build
        // does; an older one, the same VIPs without it.
        let first_admission = new.admission.as_ref().and_then(|(_, c)| c.first()).cloned();
        let admission_harness =
            match Harness::with_object(&admission_config(AdmissionLevel::Plain), object) {
                Ok(h) => h,
                Err(_) => Harness::with_object(&admission_config(AdmissionLevel::None), object)?,
            };
        let admission = Some((admission_harness, first_admission.into_iter().collect()));
        Ok(Programs {
            main: (main, main_cases(payload)),
            nat,
            snat,
            admission,
        })
    }

    /// Every case, in the order of the report.
    fn cases(&self) -> impl Iterator<Item = &Case> {
        [
            Some(&self.main),
            self.nat.as_ref(),
            self.snat.as_ref(),
            self.admission.as_ref(),
        ]
        .into_iter()
        .flatten()
        .flat_map(|(_, cases)| cases)
    }

    /// The program of each kind with its cases.
    fn kinds(&mut self) -> [Option<&mut (Harness, Vec<Case>)>; 4] {
        [
            Some(&mut self.main),
            self.nat.as_mut(),
            self.snat.as_mut(),
            self.admission.as_mut(),
        ]
    }
}

/// The main program with its flows pinned for the established cases.
fn main_harness(config: &str) -> Result<Harness> {
    let mut h = Harness::new(config)?;
    pin_flows(&mut h)?;
    Ok(h)
}

/// Each case's times over the rounds, this build's and the baseline's.
#[derive(Default)]
struct Samples {
    new: BTreeMap<&'static str, Vec<f64>>,
    baseline: BTreeMap<&'static str, Vec<f64>>,
}

impl Samples {
    /// The bare XDP_PASS program, repeated and in single runs.
    fn time_pass(&mut self, bare: &mut Bare, frame: &[u8], t: Timing) -> Result<()> {
        self.new
            .entry("xdp_pass")
            .or_default()
            .push(bare.run(frame, t.repeat)?);
        let mut single = 0.0;
        for _ in 0..t.singles {
            single += bare.run(frame, 1)?;
        }
        self.new
            .entry("xdp_pass_single")
            .or_default()
            .push(single / f64::from(t.singles));
        Ok(())
    }

    /// Every case once on this build and, with a baseline, on the baseline's program of the
    /// same kind: the two take turns going first (drift within a round falls on both alike).
    fn time_round(
        &mut self,
        new: &mut Programs,
        mut old: Option<&mut Programs>,
        round: usize,
        t: Timing,
    ) -> Result<()> {
        let baseline_first = round % 2 == 1;
        let mut old_kinds = old.as_mut().map(|o| o.kinds());
        for (k, kind) in new.kinds().into_iter().enumerate() {
            let Some((h, cases)) = kind else { continue };
            let mut old = old_kinds.as_mut().and_then(|o| o[k].as_deref_mut());
            for (i, case) in cases.iter().enumerate() {
                let mut old = old.as_deref_mut().and_then(|(b, c)| Some((b, c.get(i)?)));
                if let (Some((b, c)), true) = (old.as_mut(), baseline_first) {
                    let ns = time_case(b, c, t.repeat, t.singles)?;
                    self.baseline.entry(case.key).or_default().push(ns);
                }
                let ns = time_case(h, case, t.repeat, t.singles)?;
                self.new.entry(case.key).or_default().push(ns);
                if let (Some((b, c)), false) = (old.as_mut(), baseline_first) {
                    let ns = time_case(b, c, t.repeat, t.singles)?;
                    self.baseline.entry(case.key).or_default().push(ns);
                }
            }
        }
        Ok(())
    }

    /// The widest half-width of the ratios' 95% intervals, over the paths timed against the
    /// baseline (infinite before two rounds).
    fn widest_half_interval(&self) -> f64 {
        let mut widest = 0.0f64;
        for (key, base) in &self.baseline {
            let new = &self.new[key];
            if new.len() < 2 {
                return f64::INFINITY;
            }
            let ratios: Vec<f64> = new.iter().zip(base).map(|(n, b)| n / b).collect();
            let (_, (lo, hi)) = super::geomean_with_95(&ratios, BOOTSTRAP_RESAMPLES);
            widest = widest.max((hi - lo) / 2.0);
        }
        widest
    }

    /// Each path's median ns, its spread, and its cost over the bare program.
    fn print_table(&self, rounds: usize, cases: &[&Case], figures: &mut Figures) {
        let base = median(&self.new["xdp_pass"]);
        let base_single = median(&self.new["xdp_pass_single"]);
        println!(
            "XDP program cost per packet (BPF_PROG_TEST_RUN, {rounds} interleaved rounds, median [min..max])"
        );
        println!(
            "{:<28} {:>8} {:>18} {:>8} {:>9}  target",
            "path", "ns", "spread", "x pass", "+ns"
        );
        let mut row = |key: &str, what: &str, single: bool, target: Option<&str>| {
            let s = &self.new[key];
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
        for case in cases {
            row(
                case.key,
                case.what,
                case.method == Method::Single,
                case.target,
            );
        }
    }

    /// Each path against the baseline: the geometric mean of the rounds' ratios, its bootstrap
    /// 95% interval and the verdict.
    fn print_baseline(&self, cases: &[&Case], figures: &mut Figures) {
        println!(
            "\nThis program against the baseline object, same rounds: median ns, the geometric mean of the rounds' new / baseline ratios, its bootstrap 95% interval, and the rounds' range"
        );
        println!(
            "{:<28} {:>8} {:>10} {:>8} {:>16} {:>16}  verdict",
            "path", "new", "baseline", "ratio", "95% interval", "range"
        );
        for case in cases {
            let Some(base) = self.baseline.get(case.key) else {
                continue;
            };
            let new = &self.new[case.key];
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
}
