//! Tests of `fleet`.

use super::*;

#[test]
fn etcd_credentials_need_tls() {
    let raw = RawFleet {
        etcd: vec!["10.0.0.9:2379".into()],
        instance: Some("lb1".into()),
        username: Some("lb".into()),
        password_file: Some("/pw".into()),
        ..Default::default()
    };
    let e = validate_fleet(raw.clone()).unwrap_err().to_string();
    assert!(
        e.starts_with("fleet.username = (set): etcd credentials need TLS"),
        "{e}"
    );
    let secured = RawFleet {
        ca: Some("/ca.pem".into()),
        ..raw
    };
    assert!(validate_fleet(secured).unwrap().unwrap().auth.is_some());
}

#[test]
fn fleet_defaults_and_errors() {
    assert_eq!(validate_fleet(RawFleet::default()).unwrap(), None);
    let f = validate_fleet(RawFleet {
        etcd: vec!["10.0.0.9:2379".into()],
        instance: Some("lb1".into()),
        ..Default::default()
    })
    .unwrap()
    .unwrap();
    assert_eq!(f.prefix, "/balancer");
    assert_eq!(f.leader_key(), "/balancer/leader");
    assert_eq!(f.lease, Duration::from_secs(3));
    let err = |raw: RawFleet| validate_fleet(raw).unwrap_err().to_string();
    assert!(
        err(RawFleet {
            prefix: Some("/x".into()),
            ..Default::default()
        })
        .contains("fleet.etcd")
    );
    let base = RawFleet {
        etcd: vec!["10.0.0.9:2379".into()],
        instance: Some("lb1".into()),
        ..Default::default()
    };
    assert!(
        err(RawFleet {
            etcd: vec!["etcd:2379".into()],
            ..base.clone()
        })
        .contains("fleet.etcd[0]")
    );
    assert!(
        err(RawFleet {
            prefix: Some("balancer/".into()),
            ..base.clone()
        })
        .contains("fleet.prefix")
    );
    assert!(
        err(RawFleet {
            instance: Some("lb 1".into()),
            ..base.clone()
        })
        .contains("fleet.instance")
    );
    assert!(
        err(RawFleet {
            lease_secs: Some(1),
            ..base.clone()
        })
        .contains("fleet.lease_secs")
    );
    assert!(
        err(RawFleet {
            poll_ms: Some(2000),
            ..base.clone()
        })
        .contains("fleet.poll_ms")
    );
    // TLS and auth: each half without the other is named.
    let with = |f: fn(&mut RawFleet)| {
        let mut r = base.clone();
        f(&mut r);
        r
    };
    for (raw, key) in [
        (with(|r| r.cert = Some("/c.pem".into())), "fleet.cert"),
        (
            with(|r| {
                r.ca = Some("/ca.pem".into());
                r.cert = Some("/c.pem".into());
            }),
            "fleet.key",
        ),
        (
            with(|r| {
                r.ca = Some("/ca.pem".into());
                r.key = Some("/k.pem".into());
            }),
            "fleet.cert",
        ),
        (with(|r| r.ca = Some("ca.pem".into())), "fleet.ca"),
        (
            with(|r| r.username = Some("lb".into())),
            "fleet.password_file",
        ),
        (
            with(|r| r.password_file = Some("/pw".into())),
            "fleet.username",
        ),
        (
            with(|r| {
                r.ca = Some("/ca.pem".into());
                r.server_name = Some("etcd example".into());
            }),
            "fleet.server_name",
        ),
    ] {
        let e = err(raw);
        assert!(e.contains(key), "{key}: {e}");
    }
    let secured = validate_fleet(with(|r| {
        r.ca = Some("/ca.pem".into());
        r.cert = Some("/c.pem".into());
        r.key = Some("/k.pem".into());
        r.username = Some("lb".into());
        r.password_file = Some("/pw".into());
    }))
    .unwrap()
    .unwrap();
    let tls = secured.tls.clone().unwrap();
    assert_eq!(tls.ca, PathBuf::from("/ca.pem"));
    assert_eq!(secured.auth.as_ref().unwrap().username, "lb");
    // The file form says the same again.
    assert_eq!(
        validate_fleet(secured.to_raw()).unwrap().as_ref(),
        Some(&secured)
    );
}

#[test]
fn bgp_needs_both_route_files() {
    assert_eq!(validate_bgp(RawBgp::default()).unwrap(), None);
    let e = validate_bgp(RawBgp {
        routes_v4: Some("/run/v4.conf".into()),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("bgp.routes_v6"), "{e}");
    let raw = RawBgp {
        routes_v4: Some("/run/v4.conf".into()),
        routes_v6: Some("/run/v6.conf".into()),
        ..Default::default()
    };
    let e = validate_bgp(raw.clone()).unwrap_err().to_string();
    assert!(e.starts_with("bgp.prefixes = (absent): required"), "{e}");
    let e = validate_bgp(RawBgp {
        prefixes: vec!["10.100.0.0/16".into(), "10.0.0.0/33".into()],
        ..raw.clone()
    })
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("bgp.prefixes[1] = \"10.0.0.0/33\""), "{e}");
    let b = validate_bgp(RawBgp {
        prefixes: vec!["10.100.0.0/16".into(), "2001:db8::/48".into()],
        ..raw
    })
    .unwrap()
    .unwrap();
    assert_eq!(b.birdc, "birdc");
    assert!(b.may_announce("10.100.3.4".parse().unwrap()));
    assert!(b.may_announce("2001:db8::1".parse().unwrap()));
    assert!(!b.may_announce("10.101.0.1".parse().unwrap()));
    assert!(!b.may_announce("8.8.8.8".parse().unwrap()));
    assert_eq!(validate_bgp(b.to_raw()).unwrap(), Some(b));
}
