//! API bodies: any bytes are a request or a refusal; accepted VIPs validate or are refused
//! with a reason; pushed reports are checked.
#![no_main]

use balancer::base::config::{RawBackend, RawVip, validate_backend, validate_vip};
use balancer::state::wire::SchedulerBody;
use balancer::steering::telemetry::signals::Signals;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(raw) = serde_json::from_slice::<RawVip>(data) {
        let _ = validate_vip(raw, "vip");
    }
    if let Ok(raw) = serde_json::from_slice::<RawBackend>(data) {
        let _ = validate_backend(raw, "backend");
    }
    let _ = serde_json::from_slice::<Signals>(data);
    let _ = serde_json::from_slice::<SchedulerBody>(data);
    let _ = balancer::steering::discovery::parse_models(&String::from_utf8_lossy(data));
});
