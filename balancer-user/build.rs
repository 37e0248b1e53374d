//! Builds the XDP programs of `balancer-ebpf` for the BPF target (nightly, `-Z build-std=core`,
//! linked by `bpf-linker`) and leaves the objects in `OUT_DIR`, where `src/ebpf.rs` embeds them.
//! `BALANCER_EBPF_TOOLCHAIN` names the toolchain for that build (default `nightly`); its LLVM
//! major version must match bpf-linker's.

use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

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
    let package = aya_build::Package {
        name: ebpf.name.as_str(),
        root_dir: root_dir.as_str(),
        ..Default::default()
    };
    let toolchain = std::env::var("BALANCER_EBPF_TOOLCHAIN").unwrap_or_else(|_| "nightly".into());
    println!("cargo:rerun-if-env-changed=BALANCER_EBPF_TOOLCHAIN");
    // aya-build relays the nested cargo's progress lines as build warnings; keep it quiet so
    // only real compiler diagnostics come through.
    // SAFETY: the build script is single-threaded.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    aya_build::build_ebpf([package], Toolchain::Custom(&toolchain))?;
    // With AYA_BUILD_SKIP=1 (e.g. checking or fuzzing the parsers without the eBPF toolchain)
    // aya-build builds nothing: empty objects keep the crate compiling, and loading them fails
    // with a clear error at run time.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    for object in ["xdp-balancer", "xdp-decap", "tc-latency"] {
        let path = out.join(object);
        if !path.exists() {
            std::fs::write(&path, [])?;
        }
    }
    Ok(())
}
