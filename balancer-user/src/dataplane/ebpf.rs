//! The eBPF objects built by `build.rs`, embedded in the binary, and loading them.

use aya::programs::{ProgramError, SchedClassifier, Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};
use balancer_common::maps::{FLOW_WAYS, FLOWS, NAT_REPLIES, SNAT_FLOWS, SNAT_PORTS};

use crate::base::config::AttachMode;

/// The balancer object (program `balancer` and its maps).
pub static BALANCER_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-balancer"));
/// The backend-side object (programs `decap` and `pass`).
pub static DECAP_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-decap"));

/// The backend-side passive latency object (tc programs `latency_ingress` and
/// `latency_egress`).
pub static LATENCY_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tc-latency"));

pub const BALANCER_PROGRAM: &str = "balancer";
pub const LATENCY_INGRESS_PROGRAM: &str = "latency_ingress";
pub const LATENCY_EGRESS_PROGRAM: &str = "latency_egress";
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

/// Connection-table buckets for a capacity of `max_flows` flows: a power of two.
pub fn flow_buckets(max_flows: u32) -> u32 {
    (max_flows.div_ceil(FLOW_WAYS as u32))
        .next_power_of_two()
        .max(256)
}

/// Loads the balancer object with a connection table for `max_flows` flows and verifies its
/// program.
pub fn load_balancer(max_flows: u32) -> Result<Ebpf, LoadError> {
    load_balancer_object(BALANCER_OBJECT, max_flows)
}

/// Like [`load_balancer`], from another build of the balancer object (a benchmark's baseline:
/// the program of an earlier commit timed beside this one).
pub fn load_balancer_object(object: &[u8], max_flows: u32) -> Result<Ebpf, LoadError> {
    raise_memlock_limit();
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(FLOWS, flow_buckets(max_flows))
        .map_max_entries(NAT_REPLIES, max_flows)
        .map_max_entries(SNAT_FLOWS, max_flows)
        .map_max_entries(SNAT_PORTS, max_flows)
        .load(object)?;
    load_program(&mut ebpf, BALANCER_PROGRAM)?;
    Ok(ebpf)
}

/// Loads the balancer object with its maps pinned under `pins`: maps already pinned there are
/// reused as they are (their contents and sizes), missing ones are created and pinned.
pub fn load_balancer_pinned(
    max_flows: u32,
    pins: &crate::dataplane::pinning::Pins,
) -> Result<Ebpf, LoadError> {
    raise_memlock_limit();
    let paths: Vec<(&str, std::path::PathBuf)> = balancer_common::maps::PINNED_MAPS
        .iter()
        .map(|m| (*m, pins.map(m)))
        .collect();
    let mut loader = EbpfLoader::new();
    loader.map_max_entries(FLOWS, flow_buckets(max_flows));
    loader.map_max_entries(NAT_REPLIES, max_flows);
    loader.map_max_entries(SNAT_FLOWS, max_flows);
    loader.map_max_entries(SNAT_PORTS, max_flows);
    for (name, path) in &paths {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader.load(BALANCER_OBJECT)?;
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

/// Loads the passive latency object and verifies both its programs.
pub fn load_latency() -> Result<Ebpf, LoadError> {
    raise_memlock_limit();
    let mut ebpf = Ebpf::load(LATENCY_OBJECT)?;
    for name in [LATENCY_INGRESS_PROGRAM, LATENCY_EGRESS_PROGRAM] {
        classifier(&mut ebpf, name)?
            .load()
            .map_err(|source| LoadError::Program { name, source })?;
    }
    Ok(ebpf)
}

/// The tc program `name` of a loaded object.
pub fn classifier<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut SchedClassifier, LoadError> {
    typed_program(ebpf, name)
}

fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), LoadError> {
    program(ebpf, name)?
        .load()
        .map_err(|source| LoadError::Program { name, source })
}

/// The XDP program `name` of a loaded object.
pub fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp, LoadError> {
    typed_program(ebpf, name)
}

/// Program `name` of a loaded object, as the program type `P` it must be.
fn typed_program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, LoadError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(LoadError::NoProgram(name))?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}

/// The XDP attach mode for a config value.
pub fn xdp_mode(mode: AttachMode) -> XdpMode {
    match mode {
        AttachMode::Native => XdpMode::Driver,
        AttachMode::Skb => XdpMode::Skb,
    }
}
