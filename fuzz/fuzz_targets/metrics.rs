//! Metrics pages: any text is samples or an error naming its line; signals come out finite or
//! absent.
#![no_main]

use balancer::telemetry::{exposition, signals};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(page) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(samples) = exposition::parse(page) {
        let s = signals::extract(&samples);
        for v in [s.kv_usage, s.gpu_utilization].into_iter().flatten() {
            assert!((0.0..=1.0).contains(&v), "fraction {v} out of range");
        }
    }
});
