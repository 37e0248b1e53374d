//! `balancer-bench history`: the XDP program as several commits built it, each loaded and
//! configured by that commit's own daemon, timed on the paths every build has in the same
//! interleaved rounds, so that builds whose maps differ still compare.
//!
//! Each commit is checked out in a worktree and its `balancer` built (one target directory
//! for all, under `target/history/`). Each load starts that build's daemon in a namespace of
//! its own with the same minimal config (an L2 DSR VIP for TCP and UDP, one over IPv6, one
//! IPIP VIP, backends with their MACs), on a fresh pin directory; once its program forwards
//! a SYN, the daemon is killed and the program is timed through its pin (`BPF_PROG_TEST_RUN`
//! on the pinned program's fd), its maps as the daemon filled them. Every build is loaded
//! afresh every `reload_every` rounds, so that the rounds also sample where the JIT placed it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use aya::programs::Xdp;
use aya_obj::programs::XdpAttachType;
use balancer_tests::netns::{Netns, PREFIX, sweep};
use balancer_tests::packet::{XDP_PASS, XDP_TX, backend_mac, tcp_frame, udp_frame};
use balancer_tests::rack::{Process, mount_pin_root, pin_root, poll};

use super::dataplane::{Bare, Method, test_run};
use super::{BOOTSTRAP_RESAMPLES, Figures, geomean_with_95, median, verdict};

/// What `balancer-bench history` runs.
pub struct Settings<'a> {
    /// The workspace whose git history is read.
    pub root: &'a Path,
    /// The commits, oldest first (anything `git rev-parse` takes).
    pub commits: &'a [String],
    pub rounds: usize,
    /// Runs per syscall for the paths timed with the kernel's repeat.
    pub repeat: u32,
    /// Single-run syscalls per round for the encapsulating path.
    pub singles: u32,
    /// Load every build afresh every this many rounds (0: once).
    pub reload_every: usize,
}

/// A path every build has: the frame timed, the frame that opens its flow first (if any), the
/// action expected.
struct Case {
    key: &'static str,
    what: &'static str,
    method: Method,
    frame: Vec<u8>,
    opener: Option<Vec<u8>>,
    expect: u32,
}

const CLIENT: &str = "10.9.0.1";
const CLIENT6: &str = "2001:db8::5";
const VIP4: &str = "10.111.1.1";
const VIP_IPIP: &str = "10.111.1.2";
const VIP6: &str = "fd00:111:1::1";
const BACKENDS4: [&str; 3] = ["10.112.0.1", "10.112.0.2", "10.112.0.3"];
const BACKENDS6: [&str; 2] = ["fd00:112::1", "fd00:112::2"];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("a literal address")
}

fn cases() -> Vec<Case> {
    let payload = [0x5au8; 64];
    let (c4, c6) = (ip(CLIENT), ip(CLIENT6));
    let tcp = |client, sport, vip, syn| tcp_frame(client, sport, ip(vip), 80, syn, &payload);
    vec![
        Case {
            key: "non_vip",
            what: "TCP to the balancer's own address",
            method: Method::Repeat,
            frame: tcp_frame(c4, 2000, ip("10.111.0.2"), 22, false, &payload),
            opener: None,
            expect: XDP_PASS,
        },
        Case {
            key: "established_l2dsr",
            what: "established TCP, L2 DSR",
            method: Method::Repeat,
            frame: tcp(c4, 1000, VIP4, false),
            opener: Some(tcp(c4, 1000, VIP4, true)),
            expect: XDP_TX,
        },
        Case {
            key: "established_ipv6",
            what: "established TCP over IPv6, L2 DSR",
            method: Method::Repeat,
            frame: tcp(c6, 1003, VIP6, false),
            opener: Some(tcp(c6, 1003, VIP6, true)),
            expect: XDP_TX,
        },
        Case {
            key: "new_flow",
            what: "TCP SYN, Maglev and a connection-table write (repeat: warm cache)",
            method: Method::Repeat,
            frame: tcp(c4, 3000, VIP4, true),
            opener: None,
            expect: XDP_TX,
        },
        Case {
            key: "udp",
            what: "UDP of a known flow, L2 DSR",
            method: Method::Repeat,
            frame: udp_frame(c4, 1500, ip(VIP4), 53, &payload),
            opener: Some(udp_frame(c4, 1500, ip(VIP4), 53, &payload)),
            expect: XDP_TX,
        },
        Case {
            key: "established_ipip",
            what: "established TCP, IPIP (single runs)",
            method: Method::Single,
            frame: tcp(c4, 1001, VIP_IPIP, false),
            opener: Some(tcp(c4, 1001, VIP_IPIP, true)),
            expect: XDP_TX,
        },
    ]
}

/// The config every build's daemon gets: only settings the oldest builds know.
fn config(interface: &str, pin_dir: &Path, run_dir: &Path) -> String {
    let backend = |a: &str| {
        let mac = backend_mac(ip(a))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        format!("{{ address = \"{a}\", mac = \"{mac}\" }}")
    };
    let list = |addrs: &[&str]| {
        addrs
            .iter()
            .map(|a| backend(a))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let vip = |name: &str, addr: &str, port: u16, proto: &str, fwd: &str, backends: &[&str]| {
        format!(
            "[[vip]]\nname = \"{name}\"\naddress = \"{addr}\"\nport = {port}\nprotocol = \"{proto}\"\nforwarding = \"{fwd}\"\nbackend = [{}]\n\n",
            list(backends)
        )
    };
    format!(
        "interface = \"{interface}\"\npin_dir = \"{}\"\nstate_file = \"{}\"\n\n[api]\nsocket = \"{}\"\n\n[encap]\nsource_v4 = \"172.16.0.0/16\"\n\n{}{}{}{}",
        pin_dir.display(),
        run_dir.join(format!("{interface}.state.json")).display(),
        run_dir.join(format!("{interface}.sock")).display(),
        vip("web4", VIP4, 80, "tcp", "l2-dsr", &BACKENDS4),
        vip("dns4", VIP4, 53, "udp", "l2-dsr", &BACKENDS4),
        vip("web6", VIP6, 80, "tcp", "l2-dsr", &BACKENDS6),
        vip("ipip4", VIP_IPIP, 80, "tcp", "ipip", &BACKENDS4),
    )
}

/// A commit's build: its short hash, subject and daemon.
struct Build {
    sha: String,
    subject: String,
    daemon: PathBuf,
}

/// The work directory: worktrees, the shared target directory, the daemons, logs, configs.
fn work_dir(root: &Path) -> PathBuf {
    root.join("target/history")
}

fn git(root: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Builds `commit`'s daemon (kept under `target/history/bin/` for the next run).
fn build(root: &Path, commit: &str) -> Result<Build> {
    let spec = format!("{commit}^{{commit}}");
    let sha = git(root, &["rev-parse", "--short=9", &spec])
        .with_context(|| format!("{commit:?} is not a commit of this repository"))?;
    let subject = git(root, &["log", "-1", "--format=%s", &sha])?;
    let work = work_dir(root);
    let daemon = work.join("bin").join(format!("balancer-{sha}"));
    if !daemon.exists() {
        let tree = work.join(format!("src-{sha}"));
        let tree_text = tree.to_string_lossy().to_string();
        let _ = git(root, &["worktree", "remove", "--force", &tree_text]);
        git(root, &["worktree", "add", "--detach", &tree_text, &sha])?;
        println!("building {sha} ({subject})");
        let target = work.join("target");
        let status = Command::new("cargo")
            .args(["build", "-p", "balancer-user", "--bin", "balancer"])
            .current_dir(&tree)
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .context("running cargo")?;
        let removed = git(root, &["worktree", "remove", "--force", &tree_text]);
        if !status.success() {
            bail!("building {sha} failed ({status})");
        }
        removed?;
        std::fs::create_dir_all(work.join("bin"))?;
        std::fs::copy(target.join("debug/balancer"), &daemon)
            .with_context(|| format!("keeping {sha}'s daemon"))?;
    }
    Ok(Build {
        sha,
        subject,
        daemon,
    })
}

/// The namespace the daemons run in, and where each build's program is pinned.
struct Bench {
    ns: Netns,
    run_dir: PathBuf,
    /// Builds, each with its pin directory.
    builds: usize,
}

impl Bench {
    fn new(root: &Path, builds: usize) -> Result<Bench> {
        let name = format!("{PREFIX}-hist");
        sweep(&name);
        let ns = Netns::create(&name)?;
        let run_dir = work_dir(root).join("run");
        std::fs::create_dir_all(&run_dir)?;
        mount_pin_root()?;
        Ok(Bench {
            ns,
            run_dir,
            builds,
        })
    }

    fn pin_dir(i: usize) -> PathBuf {
        pin_root().join(format!("{PREFIX}-hist-{i}"))
    }

    /// Loads build `i` through its daemon on a fresh pin directory and interface; the pinned
    /// program once it forwards a SYN, the daemon killed.
    fn load(&self, i: usize, build: &Build, load: usize) -> Result<Xdp> {
        let pins = Bench::pin_dir(i);
        let _ = std::fs::remove_dir_all(&pins);
        let interface = format!("hist{i}");
        self.ns.sh(&format!(
            "ip link del {interface} 2>/dev/null || true; ip link add {interface} type veth peer name {interface}p && \
             ip addr add 10.111.0.2/24 dev {interface} && ip link set {interface} up && ip link set {interface}p up"
        ))?;
        let config_path = self.run_dir.join(format!("{interface}.toml"));
        std::fs::write(&config_path, config(&interface, &pins, &self.run_dir))?;
        let daemon = build.daemon.to_string_lossy();
        let config_text = config_path.to_string_lossy();
        let name = format!("{interface}-{}-{load}", build.sha);
        let argv = [daemon.as_ref(), "run", "--config", config_text.as_ref()];
        let mut process = Process::spawn(&self.ns, &name, &argv, &self.run_dir)?;
        process.wait_for_log("balancer ready", Duration::from_secs(60))?;
        let pin = pins.join("prog");
        let mut program = Xdp::from_pin(&pin, XdpAttachType::Interface)
            .with_context(|| format!("opening the pinned program {}", pin.display()))?;
        let syn = tcp_frame(ip(CLIENT), 999, ip(VIP4), 80, true, b"");
        let forwards = poll(Duration::from_secs(10), || {
            matches!(test_run(&mut program, &syn, 1), Ok((XDP_TX, _))).then_some(())
        });
        if forwards.is_none() {
            bail!("{}'s program did not forward a SYN to its VIP", build.sha);
        }
        process.signal_and_wait(libc::SIGKILL, Duration::from_secs(5))?;
        Ok(program)
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        for i in 0..self.builds {
            let _ = std::fs::remove_dir_all(Bench::pin_dir(i));
        }
    }
}

/// Mean ns per run by `method`: one call of `repeat` runs, or `singles` calls of one run.
fn mean_ns(
    method: Method,
    repeat: u32,
    singles: u32,
    mut call: impl FnMut(u32) -> Result<f64>,
) -> Result<f64> {
    let (calls, per_call) = match method {
        Method::Repeat => (1, repeat),
        Method::Single => (singles, 1),
    };
    let mut total = 0.0;
    for _ in 0..calls {
        total += call(per_call)?;
    }
    Ok(total / f64::from(calls))
}

/// Mean ns per run of `case` on a build's program, each run's action checked.
fn time_case(program: &mut Xdp, case: &Case, repeat: u32, singles: u32) -> Result<f64> {
    mean_ns(case.method, repeat, singles, |n| {
        let (action, ns) = test_run(program, &case.frame, n)?;
        if action != case.expect {
            bail!("{}: action {action}, expected {}", case.key, case.expect);
        }
        Ok(ns)
    })
}

/// Times: per path, per build, per round.
type Times = BTreeMap<&'static str, Vec<Vec<f64>>>;

/// Builds each commit, then times every build's program in the same rounds; prints the
/// medians and each build against the one before it and against the first.
pub fn run(s: &Settings) -> Result<Figures> {
    if s.commits.len() < 2 {
        bail!("name at least two commits, oldest first");
    }
    let builds = s
        .commits
        .iter()
        .map(|c| build(s.root, c))
        .collect::<Result<Vec<_>>>()?;
    let bench = Bench::new(s.root, builds.len())?;
    let cases = cases();
    let mut bare = Bare::load()?;
    let mut times: Times = BTreeMap::new();
    let mut pass_times: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut programs: Vec<Xdp> = Vec::new();
    let mut loads = 0;
    for round in 0..s.rounds {
        if programs.is_empty() || (s.reload_every > 0 && round % s.reload_every == 0) {
            programs.clear();
            for (i, b) in builds.iter().enumerate() {
                let mut program = bench.load(i, b, loads)?;
                for opener in cases.iter().filter_map(|c| c.opener.as_ref()) {
                    test_run(&mut program, opener, 1)?;
                }
                programs.push(program);
            }
            loads += 1;
        }
        for case in &cases {
            let per_build = times
                .entry(case.key)
                .or_insert_with(|| vec![Vec::new(); builds.len()]);
            // Each round starts with another build, so no build always runs first.
            for k in 0..builds.len() {
                let i = (k + round) % builds.len();
                per_build[i].push(time_case(&mut programs[i], case, s.repeat, s.singles)?);
            }
        }
        for (key, method) in [
            ("xdp_pass", Method::Repeat),
            ("xdp_pass_single", Method::Single),
        ] {
            let frame = &cases[0].frame;
            let t = mean_ns(method, s.repeat, s.singles, |n| bare.run(frame, n))?;
            pass_times.entry(key).or_default().push(t);
        }
        println!("round {} of {}", round + 1, s.rounds);
    }
    drop(programs);
    drop(bench);
    Ok(report(&builds, &cases, &times, &pass_times, loads))
}

/// Its page (`--page`): each path's median per build, each build against the one before it
/// and the last against the first.
pub const PAGE: super::page::Page = super::page::Page {
    name: "history",
    title: "Data plane: cost per packet across commits",
    about: "Nanoseconds per packet of the XDP program as each commit built it, through \
            `BPF_PROG_TEST_RUN`, each build loaded and configured by its own daemon with one \
            minimal config (an L2 DSR VIP for TCP and UDP, one over IPv6, an IPIP VIP), all \
            builds in the same interleaved rounds, each loaded afresh every round. Rows are \
            `<path>.<n>.<commit>`, oldest first; the ratios are geometric means of the rounds' \
            ratios with their bootstrap 95% interval. `non_vip` is TCP to the balancer's own \
            address; `new_flow` a SYN (repeat: warm cache); `established_ipip` single runs, \
            the others the kernel's repeat.",
    columns: &[
        ("_ns", "median ns"),
        ("_over_previous", "/ previous"),
        ("_over_previous_ci_low", "95% low"),
        ("_over_previous_ci_high", "95% high"),
        ("_over_first", "/ first"),
        ("_over_first_ci_low", "95% low"),
        ("_over_first_ci_high", "95% high"),
    ],
    flat: &["xdp_pass"],
};

/// The tables, and the figures for the JSON (rows `<path>.<n>.<commit>`, see [`PAGE`]).
fn report(
    builds: &[Build],
    cases: &[Case],
    times: &Times,
    pass: &BTreeMap<&'static str, Vec<f64>>,
    loads: usize,
) -> Figures {
    let mut figures = Figures::new();
    println!(
        "\nBuilds, oldest first, each loaded and configured by its own daemon ({loads} load(s) each):"
    );
    for (i, b) in builds.iter().enumerate() {
        let subject: String = b.subject.chars().take(80).collect();
        println!("  [{i}] {} {subject}", b.sha);
    }
    println!(
        "\nMedian ns per packet (BPF_PROG_TEST_RUN); bare XDP_PASS {:.1} (repeat), {:.1} (single runs)",
        median(&pass["xdp_pass"]),
        median(&pass["xdp_pass_single"])
    );
    figures.insert("xdp_pass_ns".into(), median(&pass["xdp_pass"]));
    figures.insert(
        "xdp_pass_single_ns".into(),
        median(&pass["xdp_pass_single"]),
    );
    let row = |case: &Case, i: usize| format!("{}.{i:02}.{}", case.key, builds[i].sha);
    print!("{:<20}", "path");
    for i in 0..builds.len() {
        print!(" {:>9}", format!("[{i}]"));
    }
    println!();
    for case in cases {
        print!("{:<20}", case.key);
        for (i, t) in times[case.key].iter().enumerate() {
            print!(" {:>9.1}", median(t));
            figures.insert(format!("{}_ns", row(case, i)), median(t));
        }
        println!("  {}", case.what);
    }
    println!(
        "\nEach build against the one before it, and the last against the first: the geometric mean of the rounds' ratios, its bootstrap 95% interval, the verdict"
    );
    let last = builds.len() - 1;
    let mut pairs: Vec<(usize, usize, &str)> =
        (1..builds.len()).map(|i| (i - 1, i, "previous")).collect();
    if builds.len() > 2 {
        pairs.push((0, last, "first"));
    }
    for (old, new, against) in pairs {
        println!("[{new}] / [{old}]");
        for case in cases {
            let t = &times[case.key];
            let ratios: Vec<f64> = t[new].iter().zip(&t[old]).map(|(n, o)| n / o).collect();
            let (ratio, ci) = geomean_with_95(&ratios, BOOTSTRAP_RESAMPLES);
            println!(
                "  {:<20} {:>6.3}  {:>6.3}..{:<6.3}  {}",
                case.key,
                ratio,
                ci.0,
                ci.1,
                verdict(ci)
            );
            let name = format!("{}_over_{against}", row(case, new));
            figures.insert(format!("{name}_ci_low"), ci.0);
            figures.insert(format!("{name}_ci_high"), ci.1);
            figures.insert(name, ratio);
        }
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_config_is_a_valid_config_with_every_vip_the_cases_reach() {
        let text = config(
            "hist0",
            Path::new("/run/blt-bpf/blt-hist-0"),
            Path::new("/tmp/run"),
        );
        let c = balancer::base::config::Config::parse(&text).expect("a valid config");
        assert_eq!(c.interface, "hist0");
        let endpoints: Vec<(IpAddr, u16)> = c.vips.iter().map(|v| (v.address, v.port)).collect();
        for (addr, port) in [(VIP4, 80), (VIP4, 53), (VIP6, 80), (VIP_IPIP, 80)] {
            assert!(endpoints.contains(&(ip(addr), port)), "{addr}:{port}");
        }
        assert!(
            c.vips
                .iter()
                .all(|v| v.backends.iter().all(|b| b.mac.is_some()))
        );
    }
}
