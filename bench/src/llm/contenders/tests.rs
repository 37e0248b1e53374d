//! Tests of `contenders`.

use super::*;

/// The telemetry settings `settings` give a VIP.
fn telemetry_of(settings: &VipSettings) -> balancer::base::config::RawTelemetry {
    let mut vip = balancer::base::config::RawVip::default();
    settings.apply(&mut vip);
    vip.telemetry.expect("a telemetry policy's contender")
}

#[test]
fn a_contender_may_name_its_own_scrape_interval() {
    let Contender::Balancer { name, settings } =
        Contender::parse("composite@4000", Some(2000)).unwrap()
    else {
        panic!("the balancer's");
    };
    assert_eq!(
        (name.as_str(), settings.scrape_ms),
        ("composite@4000", Some(4000))
    );
    let Contender::Balancer {
        settings: plain, ..
    } = Contender::parse("composite", Some(2000)).unwrap()
    else {
        panic!("the balancer's");
    };
    assert_eq!(
        VipSettings {
            scrape_ms: Some(4000),
            ..plain
        },
        settings
    );
    // A fixed interval sets the fastest and no pacing; none leaves the daemon's default.
    let telemetry = telemetry_of(&settings);
    assert_eq!(
        (telemetry.interval_ms, telemetry.requests_per_scrape),
        (Some(4000), Some(0))
    );
    let Contender::Balancer { settings, .. } = Contender::parse("composite", None).unwrap() else {
        panic!("the balancer's");
    };
    let telemetry = telemetry_of(&settings);
    assert_eq!(
        (telemetry.interval_ms, telemetry.requests_per_scrape),
        (None, None)
    );
    assert!(Contender::describe("composite@4000").ends_with("; scraping every 4000 ms"));
    for bad in [
        "composite@",
        "composite@5",
        "composite@fast",
        "composite@4000@2000",
        "sglang:cache_aware@4000",
        "nope@4000",
    ] {
        assert!(Contender::parse(bad, Some(2000)).is_err(), "{bad}");
    }
    let why = Contender::parse("composite@5", Some(2000))
        .unwrap_err()
        .to_string();
    assert!(why.contains("10-60000"), "{why}");
}

#[test]
fn tenant_affinity_names_carry_their_prefix() {
    let name = tenant_affinity(28);
    let Contender::Balancer { settings, .. } = Contender::parse(&name, Some(100)).unwrap() else {
        panic!("{name} is the balancer's");
    };
    assert_eq!(settings.affinity_prefix_v4, Some(28));
    assert_eq!(
        (
            settings.scheduler,
            settings.max_load_factor,
            settings.composite
        ),
        ("source-hash", Some(1.25), true)
    );
    assert!(Contender::describe(&name).contains("/28"));
    for bad in [
        "tenant-affinity/0",
        "tenant-affinity/33",
        "tenant-affinity/x",
    ] {
        let e = Contender::parse(bad, Some(100)).unwrap_err().to_string();
        assert!(e.contains("prefix length is 1-32"), "{bad}: {e}");
    }
}
