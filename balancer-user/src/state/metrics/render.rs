//! The families read at scrape time from the data plane's counters and the daemon's views
//! (VIP and backend status, weights and the reports behind them), in Prometheus form.

use balancer_common::stats::{Counter, GlobalStats, NatLinkStats};

use super::Families;
use crate::state::wire::{Status, VipWeights};

/// The data plane's counters read at a scrape.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub global: GlobalStats,
    /// Frames NAT sent to its other link.
    pub nat_links: NatLinkStats,
}

/// The scrape-time families: global counters (when the data plane could be read), per VIP and
/// per backend traffic, health and table share, per backend weights, saturation and
/// telemetry; with `[bgp]` each VIP's announcement, with `[fleet]` this balancer's role and
/// its link to etcd.
pub fn families(counters: Option<&Counters>, status: &Status, weights: &[VipWeights]) -> Families {
    let vips = &status.vips;
    let mut f = Families::default();
    if let Some(fleet) = &status.fleet {
        let instance = [("instance_name", fleet.instance.as_str())];
        f.gauge(
            "balancer_fleet_leader",
            "1 while this balancer is its fleet's leader.",
            &instance,
            if fleet.role == crate::steering::fleet::FleetRole::Leader {
                1.0
            } else {
                0.0
            },
        );
        f.gauge(
            "balancer_fleet_etcd_up",
            "1 while the last exchange with etcd succeeded.",
            &instance,
            if fleet.etcd.is_ok() { 1.0 } else { 0.0 },
        );
        f.gauge(
            "balancer_fleet_epoch",
            "The fleet state epoch applied (or, on the leader, published) last.",
            &instance,
            fleet.epoch as f64,
        );
    }
    if status.bgp.is_some() {
        for vip in vips {
            f.gauge(
                "balancer_vip_announced",
                "1 while the VIP is announced over BGP (it has a backend to serve and is not drained).",
                &[("vip", vip.name.as_str())],
                if vip.announced { 1.0 } else { 0.0 },
            );
        }
    }
    if let Some(Counters { global, nat_links }) = counters {
        f.counter(
            "balancer_xdp_actions_total",
            "Packets by XDP verdict.",
            &[("action", "redirect")],
            (nat_links.to_backends + nat_links.to_clients) as f64,
        );
        for (to, frames) in [
            ("backends", nat_links.to_backends),
            ("clients", nat_links.to_clients),
        ] {
            f.counter(
                "balancer_nat_redirected_total",
                "Frames NAT sent to its other link ([nat] interface): client packets to the backends' link, replies to the clients'.",
                &[("to", to)],
                frames as f64,
            );
        }
        // Labels come from the counters' own names: `xdp_pass` is action "pass", `drop_fragment`
        // reason "fragment"; the connection-table results keep their historical labels.
        for counter in Counter::ALL {
            if let Some(action) = counter.name().strip_prefix("xdp_") {
                f.counter(
                    "balancer_xdp_actions_total",
                    "Packets by XDP verdict.",
                    &[("action", action)],
                    global.get(counter) as f64,
                );
            }
            if let Some(reason) = counter.name().strip_prefix("drop_") {
                f.counter(
                    "balancer_drops_total",
                    "Packets for a VIP dropped, by reason.",
                    &[("reason", reason)],
                    global.get(counter) as f64,
                );
            }
        }
        counters_by_result(
            &mut f,
            global,
            "balancer_conntrack_lookups_total",
            "Connection-table lookups by result (a TCP SYN always counts as a miss).",
            &[
                (Counter::ConntrackHit, "hit"),
                (Counter::ConntrackMiss, "miss"),
                (Counter::FlowRehashed, "rehashed"),
                (Counter::UdpFlowExpired, "udp_expired"),
            ],
        );
        f.counter(
            "balancer_flood_activations_total",
            "Times a CPU entered flood mode.",
            &[],
            global.get(Counter::FloodActivations) as f64,
        );
        f.counter(
            "balancer_flood_inserts_skipped_total",
            "New flows not recorded because of flood mode.",
            &[],
            global.get(Counter::FloodInsertsSkipped) as f64,
        );
        f.counter(
            "balancer_icmp_errors_forwarded_total",
            "ICMP errors about VIP flows forwarded to their backend.",
            &[],
            global.get(Counter::IcmpErrorForwarded) as f64,
        );
        f.counter(
            "balancer_icmp_too_big_sent_total",
            "ICMP fragmentation-needed / packet-too-big answers sent.",
            &[],
            global.get(Counter::IcmpTooBigSent) as f64,
        );
        counters_by_result(
            &mut f,
            global,
            "balancer_persistence_choices_total",
            "New flows of VIPs with session persistence, by outcome: returned to the client's backend, over its bounded load or sent elsewhere by the policy (both placed by the scheduler, the client keeping its backend), or placed by the scheduler for a client with no backend to return to.",
            &[
                (Counter::PersistenceReturned, "returned"),
                (Counter::PersistenceOverBound, "over_bound"),
                (Counter::PersistenceSentElsewhere, "sent_elsewhere"),
                (Counter::PersistencePlaced, "placed"),
            ],
        );
    }
    for vip in vips {
        let v = vip.name.as_str();
        f.counter(
            "balancer_vip_packets_total",
            "Packets to a VIP.",
            &[("vip", v)],
            vip.packets as f64,
        );
        f.counter(
            "balancer_vip_bytes_total",
            "Bytes to a VIP.",
            &[("vip", v)],
            vip.bytes as f64,
        );
        f.counter(
            "balancer_vip_new_flows_total",
            "Flows chosen from a VIP's Maglev table.",
            &[("vip", v)],
            vip.new_flows as f64,
        );
        f.gauge(
            "balancer_vip_flows",
            "Active flows of a VIP.",
            &[("vip", v)],
            vip.flows as f64,
        );
        if let Some(a) = &vip.admission {
            f.gauge(
                "balancer_admission_saturated",
                "1 while every eligible backend of the VIP's shared pool is saturated: admission control admits only the admitted tiers' new flows.",
                &[("vip", v)],
                if a.saturated { 1.0 } else { 0.0 },
            );
            for t in &a.tiers {
                for (outcome, flows) in [
                    ("admitted", t.admitted_flows),
                    ("shed_saturated", t.shed_saturated),
                    ("shed_over_cap", t.shed_over_cap),
                    ("overflowed", t.overflowed),
                ] {
                    f.counter(
                        "balancer_admission_flows_total",
                        "New flows admission control decided on while the pool was saturated, by client tier and outcome (shed: not admitted, because the tier is not admitted or its cap was spent; overflowed: of those shed, sent to the overflow tier).",
                        &[("vip", v), ("tier", t.tier.as_str()), ("outcome", outcome)],
                        flows as f64,
                    );
                }
            }
        }
        for b in &vip.backends {
            let addr = b.address.to_string();
            let l = [("vip", v), ("backend", addr.as_str())];
            f.counter(
                "balancer_backend_packets_total",
                "Packets sent to a backend.",
                &l,
                b.packets as f64,
            );
            f.counter(
                "balancer_backend_bytes_total",
                "Bytes sent to a backend.",
                &l,
                b.bytes as f64,
            );
            f.counter(
                "balancer_backend_new_flows_total",
                "Flows a backend took from the Maglev table.",
                &l,
                b.new_flows as f64,
            );
            f.gauge(
                "balancer_backend_flows",
                "Active flows of a backend: recorded, not yet ended by the client (FIN/RST) or evicted.",
                &l,
                b.flows as f64,
            );
            f.gauge(
                "balancer_backend_weight",
                "A backend's configured weight.",
                &l,
                f64::from(b.weight),
            );
            f.gauge(
                "balancer_backend_table_share",
                "A backend's share of its VIP's Maglev table (0..1).",
                &l,
                b.table_share,
            );
            if let Some(share) = b.bound_share {
                f.gauge(
                    "balancer_backend_bound_share",
                    "Under bounded load: a backend's share of its pool's weights averaged over the VIP's mean flow duration (0..1), what its share of active flows is held to times the bound.",
                    &l,
                    share,
                );
            }
            if let Some(clients) = b.homed_clients {
                f.gauge(
                    "balancer_backend_homed_clients",
                    "Under session persistence: the clients a backend homes now (placed, or returning within about a quarter of the persistence time); with a bound, a VIP's new client goes to the backend homing the fewest per unit of capacity when the scheduler's pick homes 3/2 as many.",
                    &l,
                    clients,
                );
            }
            if let Some(capacity) = b.home_capacity {
                f.gauge(
                    "balancer_backend_home_capacity",
                    "Under session persistence: the capacity a backend's clients are spread by (configured weight x KV-cache capacity against the pool's mean; 1 is a mean backend of weight 1); absent until the first weight round writes it.",
                    &l,
                    capacity,
                );
            }
            f.gauge(
                "balancer_backend_healthy",
                "1 if the backend passes its health checks (or is unchecked).",
                &l,
                if b.healthy { 1.0 } else { 0.0 },
            );
            f.gauge(
                "balancer_backend_drained",
                "1 if the backend is drained or being removed.",
                &l,
                if b.drained { 1.0 } else { 0.0 },
            );
        }
    }
    for v in weights {
        if let Some(ms) = v.scrape_interval_ms {
            f.gauge(
                "balancer_vip_scrape_interval_seconds",
                "Seconds from a scraped VIP's last scrape to its next: telemetry.interval_ms when fixed, else the pace its requests set (interval_ms to max_interval_ms).",
                &[("vip", v.vip.as_str())],
                ms as f64 / 1000.0,
            );
        }
        for b in &v.backends {
            let addr = b.address.to_string();
            let l = [("vip", v.vip.as_str()), ("backend", addr.as_str())];
            f.gauge(
                "balancer_backend_table_weight",
                "The weight its VIP's table is built with: the fleet leader's, else the policy's or the configured one; 0 while drained or unhealthy.",
                &l,
                f64::from(b.weight),
            );
            f.gauge(
                "balancer_backend_saturated",
                "1 while the policy holds the backend saturated (KV cache, queue or GPU memory over its cut-off).",
                &l,
                if b.saturated { 1.0 } else { 0.0 },
            );
            f.gauge(
                "balancer_backend_returning_elsewhere",
                "1 while session persistence sends the backend's returning clients elsewhere: the policy expects another backend to serve them sooner, their whole prompt prefilled there.",
                &l,
                if b.returning_elsewhere { 1.0 } else { 0.0 },
            );
            let Some(s) = &b.signals else { continue };
            let inputs = [
                (
                    "balancer_backend_kv_cache_usage",
                    "KV-cache use a backend reported (0..1).",
                    s.kv_usage,
                ),
                (
                    "balancer_backend_requests_running",
                    "Requests a backend reported running.",
                    s.running,
                ),
                (
                    "balancer_backend_requests_waiting",
                    "Requests a backend reported queued.",
                    s.waiting,
                ),
                (
                    "balancer_backend_requests_prefilling",
                    "Requests of a backend with no first token yet (queued, or in a chunked prefill).",
                    s.prefilling,
                ),
                (
                    "balancer_backend_gpu_memory_free_bytes",
                    "Free GPU memory a backend reported.",
                    s.gpu_memory_free_bytes(),
                ),
                (
                    "balancer_backend_tokens_per_second",
                    "Token throughput of a backend.",
                    s.tokens_per_second,
                ),
                (
                    "balancer_backend_ttft_seconds",
                    "Mean time to first token of a backend.",
                    s.ttft_seconds,
                ),
                (
                    "balancer_backend_prefill_seconds",
                    "Mean prefill time of the requests a backend finished over the last report interval.",
                    s.prefill_seconds,
                ),
                (
                    "balancer_backend_prefill_seconds_per_token",
                    "Prefill time per prompt token of the requests a backend finished over the last report interval.",
                    s.prefill_seconds_per_token,
                ),
                (
                    "balancer_backend_prefill_seconds_per_token_fastest",
                    "Fastest prefill time per prompt token a backend was measured at recently (its own speed).",
                    s.prefill_seconds_per_token_fastest,
                ),
                (
                    "balancer_backend_prefix_cache_hit_rate",
                    "Share of a backend's prompt tokens found in its prefix cache over the last report interval (0..1).",
                    s.prefix_cache_hit_rate,
                ),
                (
                    "balancer_backend_report_age_seconds",
                    "Age of a backend's latest report.",
                    b.report_age_ms.map(|a| a as f64 / 1000.0),
                ),
            ];
            for (name, help, value) in inputs {
                if let Some(value) = value {
                    f.gauge(name, help, &l, value);
                }
            }
        }
    }
    f
}

/// One counter family labelled by `result`, a sample per data-plane counter.
fn counters_by_result(
    f: &mut Families,
    global: &GlobalStats,
    name: &str,
    help: &str,
    results: &[(Counter, &str)],
) {
    for (counter, result) in results {
        f.counter(
            name,
            help,
            &[("result", result)],
            global.get(*counter) as f64,
        );
    }
}

#[cfg(test)]
mod tests {
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
        let text =
            Metrics::new()
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
                }],
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
        let rules = include_str!("../../../../packaging/prometheus/balancer.rules.yml");
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
    }
}
