//! Build settings of the XDP objects.
//!
//! - Rebuild when the `bpf-linker` binary changes: building this crate depends on it, but
//!   cargo cannot express a dependency on a binary from another package.
//! - Generate 32-bit ALU instructions (BPF `alu32`, kernels >= 5.1): without them every 32-bit
//!   operation is emulated with 64-bit ones plus masks, which made the hashes on the packet path
//!   about twice as long. The CPU, v3 (which implies `alu32` and adds 32-bit jumps), is set by
//!   the nested build in `balancer-user/build.rs`; the feature stays for a build without it.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found ({err}); run `cargo xtask setup`"),
    }
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("bpf") {
        println!("cargo:rustc-link-arg=--cpu-features=+alu32");
    }
}
