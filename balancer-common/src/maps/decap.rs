//! The backend-side decapsulator's map names and layouts.

use crate::addr::RawAddr;

/// Decapsulator settings: array of one [`DecapConfig`].
pub const DECAP_CONFIG: &str = "DECAP_CONFIG";
/// Decapsulator: outer destination addresses it accepts ([`DecapAddrKey`] -> `u8`, unused).
pub const DECAP_ADDRS: &str = "DECAP_ADDRS";
/// Decapsulator counters: per-CPU array of one
/// [`crate::stats::DecapStats`](super::crate::stats::DecapStats).
pub const DECAP_STATS: &str = "DECAP_STATS";
/// Most local addresses the decapsulator accepts as outer destinations.
pub const MAX_DECAP_ADDRS: u32 = 64;
/// Decapsulator: the IPv4 outer sources it accepts (LPM trie, network-order word -> `u8`,
/// unused), when [`DecapConfig::restrict_sources`] is set.
pub const DECAP_SOURCES_V4: &str = "DECAP_SOURCES_V4";
/// Decapsulator: the IPv6 outer sources it accepts (LPM trie of four network-order words).
pub const DECAP_SOURCES_V6: &str = "DECAP_SOURCES_V6";
/// Most prefixes of outer sources the decapsulator accepts, per family.
pub const MAX_DECAP_SOURCES: u32 = 64;

/// Settings of the backend-side decapsulator.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecapConfig {
    /// UDP destination port of GUE packets, network byte order; 0 = no GUE.
    pub gue_port: u16,
    /// 1: only tunnelled packets whose outer source lies in `DECAP_SOURCES_V4`/`_V6` are
    /// stripped, the others dropped; 0: any outer source.
    pub restrict_sources: u8,
    pub _pad: u8,
}
const _: () = assert!(core::mem::size_of::<DecapConfig>() == 4);

/// A local address the decapsulator accepts as an outer destination.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DecapAddrKey {
    pub addr: RawAddr,
    pub family: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<DecapAddrKey>() == 20);
