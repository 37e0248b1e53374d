//! `cargo xtask setup`: everything a fresh machine needs, installed only where missing.
//!
//! 1. Host tools the tests use (iproute2, ethtool) and the build needs (protoc) from Debian
//!    packages.
//! 2. The nightly toolchain that builds the XDP object, with `rust-src` (`-Z build-std=core`).
//!    Its LLVM major version must match bpf-linker's (22): a mismatch fails at link time with
//!    "Invalid record", so it is checked here and reported plainly.
//! 3. bpf-linker 0.13.0 built against the system's LLVM 22 (`llvm-22-dev` and friends).
//! 4. The BPF filesystem at /sys/fs/bpf.
//! 5. The real-vLLM test environment and the L7 routers (Python, from PyPI; see
//!    `real_servers`).

use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// bpf-linker version and the LLVM major version it is built against.
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_MAJOR: u32 = 22;
/// Debian packages the tests and benchmarks run (nftables and HAProxy are `bench e2e`'s peers,
/// wrk and trafgen its independent generators;
/// BIRD and etcd run the fleet tests).
const HOST_PACKAGES: &[&str] = &[
    "iproute2",
    "ethtool",
    "procps",
    "iputils-ping",
    "util-linux",
    "nftables",
    "haproxy",
    // `bench e2e`'s independent generators: wrk (connections), trafgen (small UDP packets).
    "wrk",
    "netsniff-ng",
    "bird2",
    "etcd-server",
    // `balancer top`'s test drives it in tmux.
    "tmux",
    // promtool, for the shipped alerting rules' tests.
    "prometheus",
];
/// Debian packages the daemon's build needs: protoc and the well-known protobuf types, for
/// the etcd client's generated gRPC code (`etcd-client`'s build script runs protoc); and what
/// building and checking the Debian package needs (`dpkg-shlibdeps` from dpkg-dev for its
/// dependencies, `systemd-analyze` from systemd for its unit).
const BUILD_PACKAGES: &[&str] = &[
    "protobuf-compiler",
    "libprotobuf-dev",
    "dpkg-dev",
    "systemd",
];
/// Debian packages needed to build bpf-linker against LLVM 22.
const LLVM_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "libxml2-dev",
];

fn step(msg: &str) {
    println!("[setup] {msg}");
}

/// Installs Debian packages a task needs beyond the test rack's (e.g. a compiler).
pub fn install_tools(packages: &[&str]) -> Result<()> {
    install_packages(packages, &mut false)
}

/// The toolchain that builds the eBPF object (`BALANCER_EBPF_TOOLCHAIN`, default `nightly`).
pub fn ebpf_toolchain() -> String {
    std::env::var("BALANCER_EBPF_TOOLCHAIN").unwrap_or_else(|_| "nightly".into())
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
}

fn run_cmd(program: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    step(&format!("running: {program} {}", args.join(" ")));
    let status = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .status()
        .with_context(|| format!("running {program}"))?;
    if !status.success() {
        bail!("{program} {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn package_installed(name: &str) -> bool {
    output("dpkg-query", &["-W", "-f=${db:Status-Status}", name])
        .is_some_and(|s| s.trim() == "installed")
}

fn install_packages(packages: &[&str], updated: &mut bool) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !package_installed(p))
        .collect();
    if missing.is_empty() {
        step(&format!("packages present: {}", packages.join(" ")));
        return Ok(());
    }
    if output("apt-get", &["--version"]).is_none() {
        bail!("missing packages {missing:?} and no apt-get to install them");
    }
    if !*updated {
        run_cmd("apt-get", &["update", "-qq"], &[])?;
        *updated = true;
    }
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(&missing);
    run_cmd("apt-get", &args, &[("DEBIAN_FRONTEND", "noninteractive")])
}

fn llvm_major_of(toolchain: &str) -> Option<u32> {
    let vv = output("rustc", &[&format!("+{toolchain}"), "-vV"])?;
    vv.lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse().ok())
}

fn ensure_nightly() -> Result<()> {
    let toolchain = ebpf_toolchain();
    let installed = output("rustup", &["toolchain", "list"]).unwrap_or_default();
    if !installed.lines().any(|l| l.starts_with(&toolchain)) {
        run_cmd(
            "rustup",
            &["toolchain", "install", &toolchain, "--profile", "minimal"],
            &[],
        )?;
    } else {
        step(&format!("toolchain {toolchain} present"));
    }
    let components = output(
        "rustup",
        &[
            "component",
            "list",
            "--installed",
            "--toolchain",
            &toolchain,
        ],
    )
    .unwrap_or_default();
    if !components.lines().any(|l| l.starts_with("rust-src")) {
        run_cmd(
            "rustup",
            &["component", "add", "rust-src", "--toolchain", &toolchain],
            &[],
        )?;
    } else {
        step(&format!("rust-src for {toolchain} present"));
    }
    match llvm_major_of(&toolchain) {
        Some(LLVM_MAJOR) => {
            step(&format!(
                "{toolchain} uses LLVM {LLVM_MAJOR}, as bpf-linker does"
            ));
            Ok(())
        }
        Some(other) => bail!(
            "toolchain {toolchain} uses LLVM {other}, but bpf-linker {BPF_LINKER_VERSION} is built against LLVM {LLVM_MAJOR}; \
             linking would fail with \"Invalid record\". Set BALANCER_EBPF_TOOLCHAIN to a nightly on LLVM {LLVM_MAJOR} \
             (e.g. nightly-2026-05-19) and run setup again"
        ),
        None => {
            bail!("cannot read the LLVM version of toolchain {toolchain} (rustc +{toolchain} -vV)")
        }
    }
}

fn bpf_linker_ok() -> bool {
    output("bpf-linker", &["--version"]).is_some_and(|v| v.trim().ends_with(BPF_LINKER_VERSION))
}

fn ensure_bpf_linker(updated: &mut bool) -> Result<()> {
    if bpf_linker_ok() {
        step(&format!("bpf-linker {BPF_LINKER_VERSION} present"));
        return Ok(());
    }
    install_packages(LLVM_PACKAGES, updated)?;
    let prefix = format!("/usr/lib/llvm-{LLVM_MAJOR}");
    run_cmd(
        "cargo",
        &[
            "install",
            "--locked",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
            "--features",
            &format!("llvm-{LLVM_MAJOR}"),
        ],
        &[
            ("LLVM_PREFIX", &prefix),
            (&format!("LLVM_SYS_{LLVM_MAJOR}1_PREFIX"), &prefix),
        ],
    )?;
    if !bpf_linker_ok() {
        bail!(
            "bpf-linker was installed but `bpf-linker --version` does not answer {BPF_LINKER_VERSION}: is ~/.cargo/bin on PATH?"
        );
    }
    Ok(())
}

/// The cargo-fuzz version the fuzz targets are run with.
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Installs the cargo subcommand `cargo <sub>` (crate `cargo-<sub>`) at `version` unless that
/// version answers already.
fn ensure_cargo_subcommand(sub: &str, version: &str) -> Result<()> {
    let name = format!("cargo-{sub}");
    if output("cargo", &[sub, "--version"]).is_some_and(|v| v.contains(version)) {
        step(&format!("{name} {version} present"));
        return Ok(());
    }
    run_cmd(
        "cargo",
        &["install", "--locked", &name, "--version", version],
        &[],
    )
}

/// The cargo-deb version the Debian package is built with.
pub const CARGO_DEB_VERSION: &str = "3.8.0";

fn ensure_bpffs() -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf"))
    {
        step("bpffs mounted at /sys/fs/bpf");
        return Ok(());
    }
    run_cmd("mount", &["-t", "bpf", "bpf", "/sys/fs/bpf"], &[])
}

/// Whether the task at hand needs the real inference servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RealServers {
    /// A failure to install them fails setup (`setup`, `test`, `demo --real-vllm`).
    Required,
    /// Installed when possible; a failure is a warning (the demo and benchmarks on simulated
    /// servers).
    Optional,
}

/// Runs every setup step.
pub fn run(real_servers: RealServers) -> Result<()> {
    let mut updated = false;
    install_packages(HOST_PACKAGES, &mut updated)?;
    install_packages(BUILD_PACKAGES, &mut updated)?;
    ensure_nightly()?;
    ensure_bpf_linker(&mut updated)?;
    ensure_cargo_subcommand("fuzz", CARGO_FUZZ_VERSION)?;
    ensure_cargo_subcommand("deb", CARGO_DEB_VERSION)?;
    if let Err(e) = ensure_bpffs() {
        step(&format!(
            "warning: could not mount bpffs ({e:#}); pinning will not work"
        ));
    }
    use crate::real_servers::{EnvSpec, ensure};
    for spec in [EnvSpec::vllm(), EnvSpec::routers()] {
        match (ensure(&spec), real_servers) {
            (Ok(_), _) => {}
            (Err(e), RealServers::Required) => {
                return Err(e.context(format!("setting up {}", spec.lock.display())));
            }
            (Err(e), RealServers::Optional) => step(&format!(
                "warning: no environment for {} ({e:#}); what needs it cannot run",
                spec.lock.display()
            )),
        }
    }
    step("done");
    Ok(())
}

/// A quick check before building: fails with a pointer to `setup` when the toolchain is absent.
pub fn check_toolchain() -> Result<()> {
    if !bpf_linker_ok() || llvm_major_of(&ebpf_toolchain()) != Some(LLVM_MAJOR) {
        bail!("the eBPF toolchain is not ready: run `cargo xtask setup` first");
    }
    if output("protoc", &["--version"]).is_none() {
        bail!("protoc is missing (Debian protobuf-compiler): run `cargo xtask setup` first");
    }
    Ok(())
}
