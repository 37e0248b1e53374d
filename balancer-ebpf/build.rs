//! Rebuild the eBPF objects when the `bpf-linker` binary changes: building this crate depends
//! on it, but cargo cannot express a dependency on a binary from another package.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found ({err}); run `cargo xtask setup`"),
    }
}
