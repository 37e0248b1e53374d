//! The daemon's control API (server) and the CLI's client for it.

pub mod client;
pub mod listener;
pub mod server;
