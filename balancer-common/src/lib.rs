//! Types and logic shared by the XDP program (`balancer-ebpf`) and the daemon (`balancer-user`).
//!
//! Everything the kernel and user space both read has exactly one definition here: map names and
//! capacities, `#[repr(C)]` key and value layouts with explicit padding and compile-time size
//! checks, counter indices, and the flow hash that decides a packet's Maglev slot.
//!
//! Without features the crate is `no_std` and allocation-free, as the eBPF program needs. The
//! `std` feature adds the pure logic the daemon runs (Maglev table population); `user` adds
//! `aya::Pod` impls so the types can be written into maps.
#![cfg_attr(not(feature = "std"), no_std)]

pub mod addr;
pub mod flow_cache;
pub mod flow_hash;
pub mod latency;
pub mod maps;
pub mod schedule;
pub mod stats;
pub mod vip_index;

#[cfg(feature = "std")]
pub mod maglev;

#[cfg(feature = "user")]
mod pod;
