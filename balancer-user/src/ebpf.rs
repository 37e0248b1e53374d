//! The XDP objects built by `build.rs`, embedded in the binary, and loading them.

use aya::programs::{ProgramError, Xdp};
use aya::{Ebpf, EbpfLoader};
use balancer_common::maps::FLOWS;

/// The balancer object (program `balancer` and its maps).
pub static BALANCER_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-balancer"));
/// The backend-side object (programs `decap` and `pass`).
pub static DECAP_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-decap"));

pub const BALANCER_PROGRAM: &str = "balancer";
pub const DECAP_PROGRAM: &str = "decap";
pub const PASS_PROGRAM: &str = "pass";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed (are you root, with BPF and BTF support?): {0}")]
    Object(#[from] aya::EbpfError),
    #[error("the object has no program {0:?}")]
    NoProgram(&'static str),
    #[error("program {name} was rejected: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
}

/// Raises `RLIMIT_MEMLOCK` for kernels that still charge BPF maps against it.
pub fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!(
            "could not raise RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Loads the balancer object with a connection table of `max_flows` entries and verifies its
/// program.
pub fn load_balancer(max_flows: u32) -> Result<Ebpf, LoadError> {
    raise_memlock_limit();
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(FLOWS, max_flows)
        .load(BALANCER_OBJECT)?;
    load_program(&mut ebpf, BALANCER_PROGRAM)?;
    Ok(ebpf)
}

/// Loads the backend-side object and verifies both its programs.
pub fn load_decap() -> Result<Ebpf, LoadError> {
    raise_memlock_limit();
    let mut ebpf = Ebpf::load(DECAP_OBJECT)?;
    load_program(&mut ebpf, DECAP_PROGRAM)?;
    load_program(&mut ebpf, PASS_PROGRAM)?;
    Ok(ebpf)
}

fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), LoadError> {
    program(ebpf, name)?
        .load()
        .map_err(|source| LoadError::Program { name, source })
}

/// The XDP program `name` of a loaded object.
pub fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp, LoadError> {
    ebpf.program_mut(name)
        .ok_or(LoadError::NoProgram(name))?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}
