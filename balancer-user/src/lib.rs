//! The balancer's control plane as a library. The `balancer` binary (`main.rs`, `cli/`) is a
//! thin command-line front end over it.
//!
//! The modules are layers; a layer imports only from the layers above it in this list (the
//! test `layers::imports_run_down_the_layers` checks it):
//! 1. [`base`]: values and config: network types, the validated config, files, TLS settings,
//!    the HTTP client.
//! 2. [`dataplane`]: the data-plane port (`Dataplane`) with its kernel and in-memory twins, the
//!    eBPF objects, pinned state, the host's network facts, the global settings.
//! 3. [`vips`]: VIPs and backends turned into tables on the data plane.
//! 4. [`steering`]: what steers the tables: telemetry, the weight policy, health checks, model
//!    discovery, the fleet.
//! 5. [`state`]: the daemon's state that combines them, its views and metrics.
//! 6. [`serve`]: the processes: the daemon and its API, the backend-side reporter.

pub mod base;
pub mod dataplane;
pub mod serve;
pub mod state;
pub mod steering;
pub mod vips;

#[cfg(test)]
mod layers;
