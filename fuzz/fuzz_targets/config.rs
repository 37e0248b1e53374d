//! Config files: any text is a config or a clear error, and a valid config survives its own
//! file form.
#![no_main]

use balancer::base::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text) {
        Ok(config) => {
            let again =
                Config::parse(&config.to_toml()).expect("a valid config's file form is valid");
            assert_eq!(again, config, "the file form changed the config");
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
