//! `cargo xtask`: project tasks. Depends on nothing that needs the eBPF toolchain, so it builds
//! on a fresh machine and can install that toolchain (`setup`) before anything else builds.

mod setup;

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
    /// Setup, then unit tests, then the root-only packet and network-namespace tests.
    Test {
        /// Only run tests whose name contains this.
        filter: Option<String>,
        /// Skip the root-only integration tests.
        #[arg(long)]
        unit_only: bool,
    },
    /// Setup, build, then run the demo: a rack in network namespaces with real traffic.
    Demo,
    /// Run a benchmark (release build); figures go to target/bench/<name>.json.
    Bench {
        /// Which benchmark: dataplane, control.
        name: String,
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
        Task::Setup => setup::run(),
        Task::Build { release } => build(release),
        Task::Test { filter, unit_only } => test(filter.as_deref(), unit_only),
        Task::Demo => demo(),
        Task::Bench { name, args } => bench(&name, &args),
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
    println!("xtask: cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(args)
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

fn test(filter: Option<&str>, unit_only: bool) -> Result<()> {
    setup::run()?;
    build(false)?;
    let mut unit = vec!["test", "--workspace"];
    if let Some(f) = filter {
        unit.extend(["--", f]);
    }
    cargo(&unit)?;
    if unit_only {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "the packet and network-namespace tests need root (BPF, namespaces): run as root, or pass --unit-only"
        );
    }
    // Root-only tests are #[ignore]d so that a plain `cargo test` passes without privileges.
    let mut integration = vec![
        "test",
        "-p",
        "balancer-tests",
        "--",
        "--ignored",
        "--test-threads=2",
    ];
    if let Some(f) = filter {
        integration.push(f);
    }
    cargo(&integration)
}

fn demo() -> Result<()> {
    setup::run()?;
    build(false)?;
    let bin = root().join("target/debug/balancer-demo");
    println!("xtask: {}", bin.display());
    let status = Command::new(&bin)
        .current_dir(root())
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!("the demo failed ({status})");
    }
    Ok(())
}

fn bench(name: &str, args: &[String]) -> Result<()> {
    const BENCHES: &[&str] = &["dataplane", "control", "llm", "client"];
    if !BENCHES.contains(&name) {
        bail!(
            "unknown benchmark {name:?}; choose one of {}",
            BENCHES.join(", ")
        );
    }
    setup::run()?;
    build(true)?;
    let bin = root().join("target/release/balancer-bench");
    let status = Command::new(&bin)
        .arg(name)
        .args(args)
        .current_dir(root())
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!("benchmark {name} failed ({status})");
    }
    Ok(())
}
