//! LLM load for the routing benchmark, the demo and the real-server tests: workload shapes
//! ([`workload`]), the load generator that plays them over TCP ([`client`]), and the figures of
//! a run ([`stats`]).

pub mod client;
pub mod stats;
pub mod trace;
pub mod workload;
