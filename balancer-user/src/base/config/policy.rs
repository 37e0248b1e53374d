//! A VIP's weight-policy settings, as the policy engine ([`crate::policy`]) reads them.

use std::time::Duration;

/// Largest weight a policy assigns.
pub const MAX_POLICY_WEIGHT: u32 = 1000;

/// Which policy computes a VIP's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// The configured weights.
    Static,
    /// Fewer active flows, more weight.
    LeastConn,
    /// Lower time to first token, more weight.
    LeastLatency,
    /// More free GPU memory (or KV headroom), more weight.
    Gpu,
    /// More free KV tokens, more weight.
    Tokens,
    /// A weighted mix of every signal.
    Composite,
}

impl PolicyKind {
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::Static => "static",
            PolicyKind::LeastConn => "least-conn",
            PolicyKind::LeastLatency => "least-latency",
            PolicyKind::Gpu => "gpu",
            PolicyKind::Tokens => "tokens",
            PolicyKind::Composite => "composite",
        }
    }

    pub fn parse(s: &str) -> Option<PolicyKind> {
        [
            PolicyKind::Static,
            PolicyKind::LeastConn,
            PolicyKind::LeastLatency,
            PolicyKind::Gpu,
            PolicyKind::Tokens,
            PolicyKind::Composite,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }

    /// Whether the policy reads backend reports.
    pub const fn needs_reports(self) -> bool {
        !matches!(self, PolicyKind::Static | PolicyKind::LeastConn)
    }
}

/// What stale reports mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleMode {
    /// Weight 0 until fresh reports arrive (the llm-d endpoint picker's choice).
    Saturated,
    /// Keep the last weight.
    Keep,
}

/// Factors of the composite policy (0 leaves a signal out).
#[derive(Clone, Debug, PartialEq)]
pub struct Factors {
    /// How strongly the expected prefill delay steers (0: off, and capacity comes from the KV
    /// capacity instead).
    pub delay: f64,
    pub kv: f64,
    pub gpu_memory: f64,
    pub queue: f64,
    pub tokens: f64,
    pub connections: f64,
    pub ttft: f64,
}

impl Default for Factors {
    fn default() -> Self {
        Factors {
            delay: 3.0,
            kv: 1.0,
            gpu_memory: 0.5,
            queue: 2.0,
            tokens: 0.5,
            connections: 0.5,
            ttft: 0.0,
        }
    }
}

/// A VIP's policy settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    pub kind: PolicyKind,
    pub factors: Factors,
    /// EWMA weight of the newest round, 0 < alpha <= 1 (1 = no smoothing).
    pub ewma_alpha: f64,
    /// Relative change below which a published weight stays.
    pub hysteresis: f64,
    /// Least share of the top weight a usable backend keeps, 0..1.
    pub floor: f64,
    /// KV-cache use at or above which a backend takes no new flows.
    pub kv_saturation: f64,
    /// Requests waiting at or above which a backend takes no new flows (0 = off).
    pub queue_saturation: u32,
    /// Free GPU memory below which a backend takes no new flows (0 = off).
    pub min_free_gpu_memory_bytes: f64,
    pub stale_after: Duration,
    pub stale: StaleMode,
    /// Published weights are multiples of this.
    pub quantum: u32,
    /// A backend's reported KV capacity and prefill time count within this factor of the
    /// pool's median either way (>= 1).
    pub max_ratio: f64,
    /// The most a backend's share of the scored backends' weight may be, as a multiple of its
    /// share of their configured weights (>= 1).
    pub max_share: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            kind: PolicyKind::Static,
            factors: Factors::default(),
            ewma_alpha: 0.5,
            hysteresis: 0.05,
            floor: 0.01,
            kv_saturation: 0.95,
            queue_saturation: 0,
            min_free_gpu_memory_bytes: 0.0,
            stale_after: Duration::from_millis(1000),
            stale: StaleMode::Saturated,
            quantum: 10,
            max_ratio: 10.0,
            max_share: 3.0,
        }
    }
}

impl PolicyConfig {
    /// Whether the policy reads each backend's active flows (the data plane then counts them).
    pub fn reads_flows(&self) -> bool {
        match self.kind {
            PolicyKind::LeastConn => true,
            PolicyKind::Composite => self.factors.connections > 0.0,
            _ => false,
        }
    }
}
