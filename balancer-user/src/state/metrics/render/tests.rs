//! The metrics page's families, and the shipped rules and dashboard against them.

use super::*;
use crate::state::metrics::Metrics;

fn status(fleet: Option<crate::steering::fleet::FleetStatus>, bgp: bool) -> Status {
    Status {
        interface: "eth0".into(),
        attach_mode: "native".into(),
        pin_dir: "/sys/fs/bpf/balancer/eth0".into(),
        uptime_secs: 1,
        vips: Vec::new(),
        fleet,
        bgp: bgp.then(|| crate::state::wire::BgpStatus {
            announced: Vec::new(),
            drained: Vec::new(),
            last_error: None,
        }),
    }
}

#[test]
fn every_data_plane_counter_is_exposed_once() {
    let mut global = GlobalStats::default();
    for (i, c) in global.counters.iter_mut().enumerate() {
        *c = 7_000_001 + i as u64;
    }
    let counters = Counters {
        global,
        nat_links: NatLinkStats {
            to_backends: 9_000_001,
            to_clients: 9_000_002,
        },
    };
    let text = Metrics::new()
        .unwrap()
        .render(families(Some(&counters), &status(None, false), &[]));
    for counter in Counter::ALL {
        let value = format!(" {}\n", global.get(counter));
        assert_eq!(
            text.matches(&value).count(),
            1,
            "{} ({value:?}) in\n{text}",
            counter.name()
        );
    }
    for line in [
        "balancer_xdp_actions_total{action=\"pass\"} 7000001",
        "balancer_xdp_actions_total{action=\"redirect\"} 18000003",
        "balancer_nat_redirected_total{to=\"backends\"} 9000001",
        "balancer_nat_redirected_total{to=\"clients\"} 9000002",
        "balancer_persistence_choices_total{result=\"returned\"} 7000017",
        "balancer_persistence_choices_total{result=\"placed\"} 7000020",
        "balancer_drops_total{reason=\"no_backend\"}",
        "balancer_drops_total{reason=\"encap_failed\"}",
        "balancer_conntrack_lookups_total{result=\"udp_expired\"}",
        "balancer_flood_activations_total ",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    // Without the data plane, no global families at all (not zeros).
    let text = Metrics::new()
        .unwrap()
        .render(families(None, &status(None, false), &[]));
    assert!(!text.contains("balancer_drops_total"), "{text}");
    assert!(!text.contains("balancer_fleet_leader"), "{text}");
}

#[test]
fn the_fleet_role_and_etcd_link_are_gauges() {
    let fleet = crate::steering::fleet::FleetStatus {
        instance: "lb1".into(),
        role: crate::steering::fleet::FleetRole::Leader,
        leader: Some("lb1".into()),
        epoch: 42,
        etcd: crate::steering::fleet::EtcdHealth::Failing("etcd unreachable".into()),
        applied_secs_ago: None,
    };
    let text = Metrics::new()
        .unwrap()
        .render(families(None, &status(Some(fleet), true), &[]));
    for line in [
        "balancer_fleet_leader{instance_name=\"lb1\"} 1",
        "balancer_fleet_etcd_up{instance_name=\"lb1\"} 0",
        "balancer_fleet_epoch{instance_name=\"lb1\"} 42",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

/// Every metric the shipped Prometheus rules and Grafana dashboard read is one the daemon
/// exposes (with a fleet, BGP, a VIP with a backend, and a report).
#[test]
fn the_shipped_rules_and_dashboard_read_only_metrics_the_daemon_exposes() {
    use crate::state::wire::{BackendStatus, VipStatus, WeightRow};
    let fleet = crate::steering::fleet::FleetStatus {
        instance: "lb1".into(),
        role: crate::steering::fleet::FleetRole::Follower,
        leader: Some("lb2".into()),
        epoch: 1,
        etcd: crate::steering::fleet::EtcdHealth::Ok,
        applied_secs_ago: Some(0.1),
    };
    let mut status = status(Some(fleet), true);
    let backend: std::net::IpAddr = "10.0.0.21".parse().unwrap();
    status.vips.push(VipStatus {
        name: "llm".into(),
        address: "10.100.0.2".parse().unwrap(),
        port: 8000,
        protocol: "tcp".into(),
        forwarding: "l2-dsr".into(),
        scheduler: "maglev".into(),
        table_size: 65537,
        table_fingerprint: "0".into(),
        health_check: "none".into(),
        packets: 1,
        bytes: 1,
        new_flows: 1,
        pps: 0.0,
        bps: 0.0,
        flows: 1,
        backends: vec![BackendStatus {
            address: backend,
            weight: 1,
            drained: false,
            healthy: true,
            health: "healthy".into(),
            table_share: 1.0,
            flows: 1,
            packets: 1,
            bytes: 1,
            new_flows: 1,
            pps: 0.0,
            bps: 0.0,
            retiring: false,
            bound_share: Some(0.25),
            homed_clients: Some(2.0),
            home_capacity: Some(1.6),
        }],
        announced: true,
        admission: Some(crate::state::wire::AdmissionStatus {
            saturated: true,
            refuse: "reset".into(),
            overflow: None,
            tiers: vec![crate::state::wire::TierAdmissionStatus {
                tier: "none".into(),
                admitted: false,
                cap: 0,
                admitted_flows: 0,
                shed_saturated: 7,
                shed_over_cap: 0,
                overflowed: 0,
                share: Some(2),
                rate: Some(31.5),
                asked: Some(40.0),
            }],
            fair: true,
            capacity: Some(95.0),
        }),
    });
    let weights = vec![VipWeights {
        vip: "llm".into(),
        policy: "composite".into(),
        telemetry: "scrape".into(),
        pool_saturated: Some(true),
        scrape_interval_ms: Some(4000),
        backends: vec![WeightRow {
            address: backend,
            configured_weight: 1,
            weight: 0,
            reason: "saturated: KV cache 97% >= 95%".into(),
            saturated: true,
            returning_elsewhere: false,
            signals: Some(crate::steering::telemetry::signals::Signals {
                kv_usage: Some(0.97),
                ..Default::default()
            }),
            report_age_ms: Some(100),
            flows: 1,
            reports: 1,
            errors: 0,
            last_error: None,
        }],
    }];
    let text =
        Metrics::new()
            .unwrap()
            .render(families(Some(&Counters::default()), &status, &weights));
    let exposed: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let rules = include_str!("../../../../../packaging/prometheus/balancer.rules.yml");
    let mut read = std::collections::BTreeSet::new();
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
        if word.starts_with("balancer_") {
            read.insert(word);
        }
    }
    assert!(read.len() >= 10, "{read:?}");
    let missing: Vec<_> = read.iter().filter(|n| !exposed.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "the rules read {missing:?}, which the daemon does not expose:\n{text}"
    );
    assert!(
        text.contains("balancer_backend_saturated{vip=\"llm\",backend=\"10.0.0.21\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("balancer_vip_announced{vip=\"llm\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("balancer_backend_bound_share{vip=\"llm\",backend=\"10.0.0.21\"} 0.25"),
        "{text}"
    );
    assert!(
        text.contains("balancer_vip_scrape_interval_seconds{vip=\"llm\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("balancer_admission_saturated{vip=\"llm\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "balancer_admission_flows_total{vip=\"llm\",tier=\"none\",outcome=\"shed_saturated\"} 7"
        ),
        "{text}"
    );
    for line in [
        "balancer_admission_capacity{vip=\"llm\"} 95",
        "balancer_admission_tenant_share{vip=\"llm\",tier=\"none\"} 2",
        "balancer_admission_tenant_rate{vip=\"llm\",tier=\"none\"} 31.5",
        "balancer_admission_tenant_asked{vip=\"llm\",tier=\"none\"} 40",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}
