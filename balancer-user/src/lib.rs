//! The balancer's control plane as a library: configuration, the bookkeeping that turns VIPs
//! and backends into kernel state, the kernel access behind it, and the daemons. The `balancer`
//! binary is a thin command-line front end over this crate.

pub mod api;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod decap;
pub mod discovery;
pub mod ebpf;
pub mod error_text;
pub mod files;
pub mod fleet;
pub mod health;
pub mod http_client;
pub mod metrics;
pub mod net;
pub mod netinfo;
pub mod pinning;
pub mod policy;
pub mod report;
pub mod settings;
pub mod tasks;
pub mod telemetry;
pub mod tls;
pub mod vips;
