//! A small deterministic random generator, so workloads, prompts and test inputs repeat
//! exactly for a seed.

/// A small deterministic generator (splitmix64), so workloads repeat exactly.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Exponential with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -self.unit().ln() * mean
    }
    /// Log-normal with the given median and shape.
    pub fn log_normal(&mut self, median: f64, sigma: f64) -> f64 {
        let (u1, u2) = (self.unit(), self.unit());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        median * (sigma * z).exp()
    }
    /// A log-normal sample rounded and clamped to `lo..=hi`.
    pub fn size(&mut self, median: f64, sigma: f64, lo: u32, hi: u32) -> u32 {
        (self.log_normal(median, sigma).round() as u32).clamp(lo, hi)
    }
}
