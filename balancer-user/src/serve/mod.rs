//! The processes: the daemon (startup, its once-a-second thread, signals) and its HTTP API,
//! and the backend-side reporter (`balancer report`).

pub mod api;
pub mod daemon;
pub mod report;
