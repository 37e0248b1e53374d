//! Tests of `calibrate`.

use super::*;

/// A simulated server of `profile` on a loopback port.
fn start_sim_server(profile: Profile) -> SocketAddr {
    balancer_sim::server::spawn_local("gpu1", "some-model", profile).unwrap()
}

#[test]
fn a_running_server_is_measured_into_the_profile_it_runs() {
    // Fast steps (5 ms) so that the test takes seconds; a prefill slow enough to time.
    let truth = Profile::parse("truth:kv=8192:prefill=5000:decode=200:batch=8").unwrap();
    let addr = start_sim_server(truth.clone());
    let (p, times) = measure_server(&ServerOptions {
        addr,
        model: None,
        batch: 8,
        kv_tokens: None,
        step_tokens: None,
        name: "measured".into(),
    })
    .unwrap();
    // Read from the page and the options: exact.
    assert_eq!(p.name, "measured");
    assert_eq!(p.kv_tokens(), truth.kv_tokens());
    assert_eq!(p.max_num_seqs, 8);
    assert_eq!(times.together, 4);
    // Timed: near the truth (loose, as a loaded test machine stretches every step).
    let step = (p.step_base + p.step_per_seq).as_secs_f64();
    assert!((0.004..0.010).contains(&step), "a lone step of {step} s");
    assert!(
        (2_500.0..7_500.0).contains(&p.prefill_tokens_per_s),
        "prefill {} tokens/s",
        p.prefill_tokens_per_s
    );
    // What it writes, `--gpus @FILE` reads.
    let file = std::env::temp_dir().join(format!("calibrate-test-{}.profile", std::process::id()));
    write_profile(&file, "a test", &p, &times).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    let spec = text.lines().find(|l| !l.starts_with('#')).unwrap();
    assert_eq!(Profile::parse(spec).unwrap().kv_blocks, p.kv_blocks);
}

#[test]
fn a_server_that_lists_no_model_or_capacity_is_named_in_the_error() {
    // A port nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = measure_server(&ServerOptions {
        addr,
        model: None,
        batch: 4,
        kv_tokens: None,
        step_tokens: None,
        name: "x".into(),
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("/v1/models"), "{e:#}");
}

#[test]
fn measured_times_out_of_range_are_an_error_naming_the_field() {
    let times = Times {
        step_alone: f64::NAN,
        step_together: 0.01,
        together: 4,
        prefill: 1000.0,
    };
    let e = profile("bad", 4096, 4, None, &times).unwrap_err();
    assert!(format!("{e:#}").contains("decode="), "{e:#}");
}
