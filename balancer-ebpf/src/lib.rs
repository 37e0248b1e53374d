//! Packet handling shared by the XDP programs in `src/bin/`: header layouts, the frame view,
//! bounds-checked parsing and checksums. The programs (and their maps) live in the binaries;
//! this library holds no maps, so each object carries only its own.
#![cfg_attr(target_arch = "bpf", no_std)]

pub mod csum;
pub mod headers;
pub mod parse;
