//! Builds the XDP programs of `balancer-ebpf` for the BPF target (nightly, `-Z build-std=core`,
//! linked by `bpf-linker`) and leaves the objects in `OUT_DIR`, where `src/ebpf.rs` embeds them.
//! `BALANCER_EBPF_TOOLCHAIN` names the toolchain for that build (default `nightly`); its LLVM
//! major version must match bpf-linker's.
//!
//! This is `aya_build::build_ebpf` with one flag more: the programs are built for BPF CPU v3
//! (`-Ctarget-cpu=v3`: 32-bit jumps, kernels >= 5.1, as the `alu32` the eBPF crate's build
//! script asks for). CPU `generic` (v1) has no 32-bit compare, and every test of a 16-bit field
//! compiled to five instructions where v3 needs one: the entry function was 22% longer, the
//! verifier processed 39% more instructions, and the data-plane paths were up to 1.26x slower.
//! aya-build sets the nested build's `CARGO_ENCODED_RUSTFLAGS` itself, which hides every other
//! way to add a flag, so the nested cargo is run here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, anyhow, bail};
use cargo_metadata::Message;

/// The BPF processor the programs are built for.
const BPF_CPU: &str = "v3";

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("reading the workspace metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "balancer-ebpf")
        .ok_or_else(|| anyhow!("the balancer-ebpf package is missing from the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", ebpf.manifest_path))?;
    let toolchain = std::env::var("BALANCER_EBPF_TOOLCHAIN").unwrap_or_else(|_| "nightly".into());
    println!("cargo:rerun-if-env-changed=BALANCER_EBPF_TOOLCHAIN");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    build_ebpf(ebpf.name.as_str(), root_dir.as_std_path(), &toolchain, &out)?;
    // With AYA_BUILD_SKIP=1 (e.g. checking or fuzzing the parsers without the eBPF toolchain)
    // nothing is built: empty objects keep the crate compiling, and loading them fails with a
    // clear error at run time.
    for object in ["xdp-balancer", "xdp-decap", "tc-latency"] {
        let path = out.join(object);
        if !path.exists() {
            std::fs::write(&path, [])?;
        }
    }
    Ok(())
}

/// Builds `package`'s binaries for the BPF target of this host's byte order and copies them
/// into `out`.
fn build_ebpf(package: &str, root_dir: &Path, toolchain: &str, out: &Path) -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        println!("cargo:warning=AYA_BUILD_SKIP is set; skipping the eBPF build");
        return Ok(());
    }
    // The build-dependency rebuilds this crate when the eBPF crate's library changes; its
    // binaries, the programs, are covered by this.
    println!("cargo:rerun-if-changed={}", root_dir.display());
    let target = match std::env::var("CARGO_CFG_TARGET_ENDIAN").as_deref() {
        Ok("little") => "bpfel-unknown-none",
        Ok("big") => "bpfeb-unknown-none",
        other => bail!("unsupported byte order {other:?}"),
    };
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH")?;
    // As aya-build writes it: `bpf_target_arch` for the headers aya-ebpf picks.
    let arch = if arch.starts_with("riscv64") {
        "riscv64".to_string()
    } else {
        arch
    };
    let rustflags = [
        format!("--cfg=bpf_target_arch=\"{arch}\""),
        "-Cdebuginfo=2".into(),
        "-Clink-arg=--btf".into(),
        format!("-Ctarget-cpu={BPF_CPU}"),
    ]
    .join("\x1f");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", toolchain, "cargo", "build", "--package", package])
        .args([
            "--bins",
            "--message-format=json",
            "--release",
            "--target",
            target,
        ])
        .args(["-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(out.join("aya-build").join("target").join(package))
        .current_dir(root_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        // Its progress lines would come through as build warnings; compiler diagnostics still do.
        .env("CARGO_TERM_QUIET", "true")
        // The outer build's compiler and wrapper are not the nested one's.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {cmd:?} (is rustup installed?)"))?;
    let stderr = child.stderr.take().context("the nested cargo's stderr")?;
    let relay = std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            println!("cargo:warning={line}");
        }
    });
    let stdout = child.stdout.take().context("the nested cargo's stdout")?;
    let mut binaries = Vec::new();
    for message in Message::parse_stream(std::io::BufReader::new(stdout)) {
        match message.context("reading the nested cargo's messages")? {
            Message::CompilerArtifact(artifact) => {
                if let Some(executable) = artifact.executable {
                    binaries.push((artifact.target.name, executable.into_std_path_buf()));
                }
            }
            Message::CompilerMessage(m) => {
                for line in m.message.rendered.unwrap_or_default().lines() {
                    println!("cargo:warning={line}");
                }
            }
            _ => {}
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {cmd:?}"))?;
    let _ = relay.join();
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    for (name, binary) in binaries {
        let dst = out.join(name.as_str());
        std::fs::copy(&binary, &dst)
            .with_context(|| format!("copying {} to {}", binary.display(), dst.display()))?;
    }
    Ok(())
}
