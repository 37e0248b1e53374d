//! Tests of [`super`].

use std::time::{Duration, Instant};

use super::tables::vip_key;
use super::*;
use crate::base::config::{BackendConfig, Config};
use crate::dataplane::memory::MemoryDataplane;
use balancer_common::maps::{BACKEND_F_ACTIVE, ForwardMode};

fn config(text: &str) -> Config {
    Config::parse(&format!("interface = \"eth0\"\n{text}")).unwrap()
}

fn two_vips() -> Config {
    config(
        r#"
[[vip]]
name = "web"
address = "10.100.0.1"
port = 80
[[vip.backend]]
address = "10.0.0.11"
[[vip.backend]]
address = "10.0.0.12"
weight = 3
[[vip]]
name = "dns"
address = "10.100.0.1"
port = 53
protocol = "udp"
forwarding = "gue"
table_size = 13
[[vip.backend]]
address = "10.0.0.11"
mac = "02:00:00:00:00:99"
"#,
    )
}

fn macs() -> HashMap<IpAddr, MacAddr> {
    (1..=20u8)
        .map(|i| {
            (
                IpAddr::from([10, 0, 0, 10 + i]),
                MacAddr([2, 0, 0, 0, 0, 10 + i]),
            )
        })
        .collect()
}

fn balancer() -> Balancer<MemoryDataplane> {
    Balancer::new(MemoryDataplane::default())
}

#[test]
fn apply_writes_vips_backends_tables_and_address_markers() {
    let mut lb = balancer();
    let report = lb.apply(&two_vips().vips, &macs()).unwrap();
    assert_eq!(report.vips_added, 2);
    let dp = lb.dataplane();
    // Two VIP entries plus one shared address marker.
    assert_eq!(dp.vips.len(), 3);
    assert!(
        dp.vips
            .contains_key(&vip_key("10.100.0.1".parse().unwrap(), 0, 0))
    );
    let web = lb.vip("web").unwrap();
    let meta = dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 80, 6)];
    assert_eq!(meta.vip_id, web.id);
    assert_eq!(meta.table_size, 65_537);
    // The published table: the Maglev slots, then the schedule (both backends listed).
    let published = &dp.tables[&web.id];
    assert_eq!(&published[..web.table.len()], web.table.as_slice());
    assert_eq!(
        published[web.table.len()..].len(),
        balancer_common::schedule::HEADER as usize + 2
    );
    assert_eq!(published[web.table.len()], 2);
    assert_eq!(published[web.table.len() + 2], 0, "reserved");
    // Shares follow weights 1:3.
    let shares = web.slot_shares();
    let a = shares[&"10.0.0.11".parse::<IpAddr>().unwrap()] as f64;
    let b = shares[&"10.0.0.12".parse::<IpAddr>().unwrap()] as f64;
    assert!((b / a - 3.0).abs() < 0.01, "shares {a} {b}");
    // The configured MAC wins over the neighbour table; ids are per (VIP, backend).
    let dns = lb.vip("dns").unwrap();
    let b11 = &dns.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()];
    assert_eq!(dp.backends[&b11.id].mac, [2, 0, 0, 0, 0, 0x99]);
    assert_ne!(
        b11.id,
        web.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].id
    );
    assert_eq!(
        dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 53, 17)].mode,
        ForwardMode::Gue as u8
    );
    assert_eq!(
        dp.vips[&vip_key("10.100.0.1".parse().unwrap(), 53, 17)].gue_port,
        6080u16.to_be()
    );
}

#[test]
fn admission_control_writes_tiers_caps_and_saturation_and_flags_the_vip() {
    use balancer_common::maps::{Admission, REFUSE_DROP, VIP_F_ADMISSION};
    let text = r#"
[[tier]]
name = "premium"
prefixes = ["10.9.5.0/24"]
[[tier]]
name = "standard"
dscp = [10]
[[tier]]
name = "spare"
[[vip]]
name = "llm"
address = "10.100.0.1"
port = 80
telemetry = { source = "push" }
policy = { kind = "composite" }
admission = { admit = { premium = 0, standard = 50 }, overflow = "spare", refuse = "drop" }
[[vip.backend]]
address = "10.0.0.11"
[[vip.backend]]
address = "10.0.0.12"
tier = "spare"
"#;
    let mut cfg = config(text);
    let mut lb = balancer();
    lb.set_tiers(&cfg.tiers).unwrap();
    lb.apply(&cfg.vips, &macs()).unwrap();
    let key = vip_key("10.100.0.1".parse().unwrap(), 80, 6);
    let endpoint = cfg.vips[0].endpoint();
    let id = lb.vip("llm").unwrap().id;
    assert_ne!(lb.dataplane().vips[&key].flags & VIP_F_ADMISSION, 0);
    let written = lb.dataplane().admission[&id];
    assert_eq!(
        written,
        Admission {
            saturated: 0,
            refuse: REFUSE_DROP,
            admit: 1 << 1 | 1 << 2,
            overflow_tier: 3,
            caps: [0, 0, 50, 0, 0, 0, 0, 0],
        }
    );
    // Saturation is published, kept across a config change, and taken back.
    assert!(lb.set_saturated(&endpoint, true).unwrap());
    assert!(!lb.set_saturated(&endpoint, true).unwrap(), "no change");
    assert_eq!(lb.dataplane().admission[&id].saturated, 1);
    cfg.vips[0]
        .admission
        .as_mut()
        .unwrap()
        .admit
        .remove("standard");
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(lb.dataplane().admission[&id].saturated, 1);
    assert_eq!(lb.dataplane().admission[&id].admit, 1 << 1);
    assert!(lb.set_saturated(&endpoint, false).unwrap());
    assert_eq!(lb.dataplane().admission[&id].saturated, 0);
    // Without admission control: the flag goes, the entry admits everything, and saturation
    // is ignored.
    cfg.vips[0].admission = None;
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(lb.dataplane().vips[&key].flags & VIP_F_ADMISSION, 0);
    assert_eq!(lb.dataplane().admission[&id], Admission::default());
    assert!(!lb.set_saturated(&endpoint, true).unwrap());
    assert!(!lb.vip("llm").unwrap().saturated);
}

#[test]
fn fair_admission_shares_the_pool_s_capacity_among_the_tenants_asking() {
    use balancer_common::maps::{
        ADMISSION_SATURATED, ADMISSION_TENANTS, VIP_F_ADMISSION, VIP_F_FAIR,
    };
    let text = r#"
[[tier]]
name = "team-a"
prefixes = ["10.9.1.0/24"]
share = 2
[[tier]]
name = "team-b"
prefixes = ["10.9.2.0/24"]
max_new_flows_per_sec = 40
[[vip]]
name = "llm"
address = "10.100.0.1"
port = 80
telemetry = { source = "push" }
policy = { kind = "composite" }
admission = { fair = true, default_share = 1 }
[[vip.backend]]
address = "10.0.0.11"
[[vip.backend]]
address = "10.0.0.12"
"#;
    let cfg = config(text);
    let mut lb = balancer();
    lb.set_tiers(&cfg.tiers).unwrap();
    lb.apply(&cfg.vips, &macs()).unwrap();
    let key = vip_key("10.100.0.1".parse().unwrap(), 80, 6);
    let endpoint = cfg.vips[0].endpoint();
    let state = lb.vip("llm").unwrap();
    let id = state.id;
    let pool: Vec<u32> = state.backends.values().map(|b| b.id).collect();
    let meta = lb.dataplane().vips[&key];
    assert_ne!(meta.flags & VIP_F_ADMISSION, 0);
    assert!(
        meta.counts_active(),
        "fair admission measures flows finished"
    );
    assert_ne!(meta.flags & VIP_F_FAIR, 0);
    // Not saturated: only team-b's own limit applies, at all times.
    assert_eq!(lb.dataplane().admission[&id].saturated, ADMISSION_TENANTS);
    let fair = lb.dataplane().fair[&id];
    assert_eq!(fair.intervals_ns[2], 25_000_000, "40 flows/s");
    assert_eq!(fair.intervals_ns[0], 0);
    assert_eq!(fair.intervals_ns[1], 0);
    // Rounds: the pool finishes 100 flows a second; team-a asks 500/s, the clients of no
    // tier 10/s, team-b 200/s (over its own limit).
    let t0 = Instant::now();
    lb.fair_round(&endpoint, t0).unwrap();
    {
        let dp = &mut lb.dataplane;
        for b in &pool {
            dp.backend_traffic.entry(*b).or_default().new_flows = 50 * 60;
            dp.active.insert(*b, 0);
        }
        let counts = dp.admission_counts.entry(id).or_default();
        counts[0].admitted = 10 * 60;
        counts[1].admitted = 100 * 60;
        counts[1].shed_over_cap = 400 * 60;
        counts[2].admitted = 40 * 60;
        counts[2].shed_over_cap = 160 * 60;
    }
    lb.fair_round(&endpoint, t0 + Duration::from_secs(60))
        .unwrap();
    let fair = lb.fair_state(id).unwrap();
    assert!((fair.capacity().unwrap() - 100.0).abs() < 1e-6, "{fair:?}");
    assert!(lb.set_saturated(&endpoint, true).unwrap());
    lb.fair_round(&endpoint, t0 + Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        lb.dataplane().admission[&id].saturated,
        ADMISSION_SATURATED | ADMISSION_TENANTS
    );
    let entry = lb.dataplane().fair[&id];
    // 95 to share: no tier asks 10 (under its quarter of it), and the other 85 go to team-a
    // (share 2) and team-b (share 1, asking 40 at most: its own limit) as 2:1.
    let rate = |t: usize| 1e9 / entry.intervals_ns[t] as f64;
    assert!(
        (rate(1) - 85.0 * 2.0 / 3.0).abs() < 0.01,
        "team-a {}",
        rate(1)
    );
    assert!((rate(2) - 85.0 / 3.0).abs() < 0.01, "team-b {}", rate(2));
    // The clients of no tier may burst up to the fair level (team-b's part, share 1).
    assert!((rate(0) - 85.0 / 3.0).abs() < 0.01, "no tier {}", rate(0));
    assert_eq!(entry.burst_ns, 500_000_000);
    // Fair admission off: the entry goes back to plain admission control.
    let mut cfg = cfg;
    cfg.vips[0].admission.as_mut().unwrap().fair = false;
    lb.apply(&cfg.vips, &macs()).unwrap();
    lb.fair_round(&endpoint, t0 + Duration::from_secs(61))
        .unwrap();
    assert_eq!(lb.dataplane().vips[&key].flags & VIP_F_FAIR, 0);
    assert_eq!(lb.dataplane().admission[&id].saturated, ADMISSION_SATURATED);
    assert!(lb.fair_state(id).is_none());
}

#[test]
fn tenant_affinity_writes_the_prefix_and_flags_the_vip() {
    let mut lb = balancer();
    let mut cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    let web_key = vip_key("10.100.0.1".parse().unwrap(), 80, 6);
    let id = lb.vip("web").unwrap().id;
    assert_eq!(lb.dataplane().source_prefixes[&id], SourcePrefix::WHOLE);
    assert_eq!(
        lb.dataplane().vips[&web_key].flags & balancer_common::maps::VIP_F_SOURCE_PREFIX,
        0
    );
    cfg.vips[0].scheduler = balancer_common::maps::Scheduler::SourceHash;
    cfg.vips[0].affinity_prefix = SourcePrefix {
        v4: 24,
        v6: 64,
        _pad: [0; 2],
    };
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(
        (
            lb.dataplane().source_prefixes[&id].v4,
            lb.dataplane().source_prefixes[&id].v6
        ),
        (24, 64)
    );
    assert_ne!(
        lb.dataplane().vips[&web_key].flags & balancer_common::maps::VIP_F_SOURCE_PREFIX,
        0
    );
    // Back to whole addresses: the flag goes, the entry is rewritten.
    cfg.vips[0].affinity_prefix = SourcePrefix::WHOLE;
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(lb.dataplane().source_prefixes[&id], SourcePrefix::WHOLE);
    assert_eq!(
        lb.dataplane().vips[&web_key].flags & balancer_common::maps::VIP_F_SOURCE_PREFIX,
        0
    );
}

#[test]
fn changes_reach_the_kernel_in_batches() {
    let mut lb = balancer();
    lb.apply(&two_vips().vips, &macs()).unwrap();
    // Adding two VIPs: one swap of all tables, then one of the index.
    assert_eq!(
        (lb.dataplane().table_swaps, lb.dataplane().index_swaps),
        (1, 1)
    );
    let mut cfg = two_vips();
    cfg.vips[0].backends[0].weight = 7;
    cfg.vips[1].backends[0].weight = 9;
    let report = lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(report.tables_published, 2);
    // Weights of two VIPs: one more table swap, no index swap.
    assert_eq!(
        (lb.dataplane().table_swaps, lb.dataplane().index_swaps),
        (2, 1)
    );
}

#[test]
fn applying_the_same_config_twice_changes_nothing() {
    let mut lb = balancer();
    lb.apply(&two_vips().vips, &macs()).unwrap();
    let publishes = lb.dataplane().publishes;
    let report = lb.apply(&two_vips().vips, &macs()).unwrap();
    assert_eq!(report, ApplyReport::default());
    assert_eq!(lb.dataplane().publishes, publishes);
}

#[test]
fn removing_a_backend_retires_it_and_keeps_the_others() {
    let mut lb = balancer();
    let mut cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    let before = lb.vip("web").unwrap().clone();
    let gone = before.backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].clone();
    let kept = before.backends[&"10.0.0.12".parse::<IpAddr>().unwrap()].clone();
    cfg.vips[0].backends.remove(0);
    let report = lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(report.vips_updated, 1);
    let dp = lb.dataplane();
    assert_eq!(
        dp.backends[&gone.id].flags, 0,
        "removed backend still active"
    );
    assert_eq!(dp.backends[&kept.id].flags, BACKEND_F_ACTIVE);
    assert_eq!(
        dp.backends[&kept.id].generation, kept.generation as u16,
        "survivor's flows must stay"
    );
    let web = lb.vip("web").unwrap();
    assert!(web.table.iter().all(|&id| id == kept.id));
}

#[test]
fn a_removed_backend_serves_its_flows_through_the_grace_period() {
    let mut lb = balancer();
    lb.set_removal_grace(Duration::from_secs(60));
    let mut cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    let gone = lb.vip("web").unwrap().backends[&"10.0.0.11".parse::<IpAddr>().unwrap()].clone();
    cfg.vips[0].backends.remove(0);
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert!(
        !lb.vip("web").unwrap().table.contains(&gone.id),
        "removed backend still in the table"
    );
    assert_eq!(
        lb.dataplane().backends[&gone.id].flags,
        BACKEND_F_ACTIVE,
        "flows cut before the grace period"
    );
    assert_eq!(lb.retiring().len(), 1);
    // Not yet.
    assert_eq!(lb.expire_retired(Instant::now()).unwrap(), 0);
    // Re-added within the grace period: same slot and generation, so flows continue.
    let mut back = cfg.clone();
    back.vips[0]
        .backends
        .insert(0, two_vips().vips[0].backends[0].clone());
    lb.apply(&back.vips, &macs()).unwrap();
    assert_eq!(lb.vip("web").unwrap().backends[&gone.address], gone);
    assert!(lb.retiring().is_empty());
    // Removed again, and the grace period passes.
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(
        lb.expire_retired(Instant::now() + Duration::from_secs(61))
            .unwrap(),
        1
    );
    assert_eq!(lb.dataplane().backends[&gone.id].flags, 0);
}

#[test]
fn unhealthy_backends_leave_the_table_and_are_deactivated_until_they_recover() {
    let mut lb = balancer();
    lb.apply(&two_vips().vips, &macs()).unwrap();
    let web = lb.vip("web").unwrap().clone();
    let endpoint = web.config.endpoint();
    let sick: IpAddr = "10.0.0.12".parse().unwrap();
    let before = web.backends[&sick].clone();
    assert!(lb.set_health(&endpoint, sick, false).unwrap());
    assert!(
        !lb.set_health(&endpoint, sick, false).unwrap(),
        "no change the second time"
    );
    let web = lb.vip("web").unwrap();
    assert!(
        !web.table.contains(&before.id),
        "unhealthy backend still in the table"
    );
    assert_eq!(
        lb.dataplane().backends[&before.id].flags,
        0,
        "its flows must be re-hashed"
    );
    // A config apply keeps it out.
    lb.apply(&two_vips().vips, &macs()).unwrap();
    assert!(!lb.vip("web").unwrap().table.contains(&before.id));
    // Recovery: back in the table, active, with a new generation.
    assert!(lb.set_health(&endpoint, sick, true).unwrap());
    let back = &lb.vip("web").unwrap().backends[&sick];
    assert!(lb.vip("web").unwrap().table.contains(&back.id));
    assert_eq!(lb.dataplane().backends[&back.id].flags, BACKEND_F_ACTIVE);
    assert_ne!(back.generation, before.generation);
}

#[test]
fn bounded_load_judges_backends_against_their_weights_averaged_over_the_mean_flow() {
    let mut lb = balancer();
    let mut cfg = two_vips();
    cfg.vips[0].policy.kind = crate::base::config::PolicyKind::LeastConn;
    cfg.vips[0].load_bound_pct = 25;
    lb.apply(&cfg.vips, &macs()).unwrap();
    let endpoint = cfg.vips[0].endpoint();
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap());
    let id = |lb: &Balancer<MemoryDataplane>, x: IpAddr| lb.vip("web").unwrap().backends[&x].id;
    let entry = |lb: &Balancer<MemoryDataplane>, x: IpAddr| lb.dataplane().backends[&id(lb, x)];
    let scale = balancer_common::maps::BOUND_SHARE_SCALE;
    // Written with the table: the shares of weights 1:3.
    assert_eq!(u32::from(entry(&lb, a).bound_share), scale / 4);
    assert_eq!(u32::from(entry(&lb, b).bound_share), scale * 3 / 4);
    // The VIP's flows last 8 s: 40 active, 10 new in 2 s.
    let vip_id = lb.vip("web").unwrap().id;
    let t0 = Instant::now();
    lb.refresh_bound_shares(t0).unwrap();
    lb.dataplane
        .vip_traffic
        .entry(vip_id)
        .or_default()
        .new_flows += 10;
    let (ia, ib) = (id(&lb, a), id(&lb, b));
    lb.dataplane.active.insert(ia, 10);
    lb.dataplane.active.insert(ib, 30);
    let t1 = t0 + Duration::from_secs(2);
    lb.refresh_bound_shares(t1).unwrap();
    assert_eq!(
        lb.vip("web").unwrap().bound.mean_flow(),
        Duration::from_secs(8)
    );
    // The policy turns the weights to 3:1: placement follows at once, the bound does not.
    lb.set_policy_weights(&endpoint, &[(a, 300), (b, 100)])
        .unwrap();
    assert_eq!(entry(&lb, a).weight, 300);
    assert_eq!(u32::from(entry(&lb, a).bound_share), scale / 4);
    // One mean flow duration later it has moved by 1 - 1/e of the way.
    lb.refresh_bound_shares(t1 + Duration::from_secs(8))
        .unwrap();
    let expected = 0.75 - 0.5 * (-1.0f64).exp();
    let got = f64::from(entry(&lb, a).bound_share) / f64::from(scale);
    assert!((got - expected).abs() < 1e-4, "{got} against {expected}");
    let other = f64::from(entry(&lb, b).bound_share) / f64::from(scale);
    assert!((got + other - 1.0).abs() < 1e-4);
    // A backend that is drained takes no flow, whatever its share.
    let mut drained = cfg.clone();
    drained.vips[0].backends[0].drained = true;
    lb.apply(&drained.vips, &macs()).unwrap();
    assert_eq!(entry(&lb, a).weight, 0);
    assert!(entry(&lb, a).bound_share > 0);
    // A VIP without a bound keeps no averages.
    cfg.vips[0].load_bound_pct = 0;
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(
        lb.refresh_bound_shares(t1 + Duration::from_secs(60))
            .unwrap(),
        0
    );
}

#[test]
fn returning_clients_are_sent_elsewhere_only_under_session_persistence() {
    use balancer_common::maps::BACKEND_F_RETURNING_ELSEWHERE as ELSEWHERE;
    let mut lb = balancer();
    let mut cfg = two_vips();
    cfg.vips[0].policy.kind = crate::base::config::PolicyKind::Composite;
    lb.apply(&cfg.vips, &macs()).unwrap();
    let endpoint = cfg.vips[0].endpoint();
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap());
    let flags = |lb: &Balancer<MemoryDataplane>, x: IpAddr| {
        lb.dataplane().backends[&lb.vip("web").unwrap().backends[&x].id].flags
    };
    // No persistence: no returning clients, nothing written.
    assert_eq!(
        lb.set_returning_elsewhere(&endpoint, &[(a, true), (b, false)])
            .unwrap(),
        0
    );
    assert_eq!(flags(&lb, a), BACKEND_F_ACTIVE);
    // With persistence: the flag on a, and off again; the same verdict twice writes nothing.
    cfg.vips[0].persistence = Duration::from_secs(60);
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(
        lb.set_returning_elsewhere(&endpoint, &[(a, true), (b, false)])
            .unwrap(),
        1
    );
    assert_eq!(flags(&lb, a), BACKEND_F_ACTIVE | ELSEWHERE);
    assert_eq!(flags(&lb, b), BACKEND_F_ACTIVE);
    assert_eq!(
        lb.set_returning_elsewhere(&endpoint, &[(a, true)]).unwrap(),
        0
    );
    // A weight change rewrites the entry with the flag kept.
    lb.set_policy_weights(&endpoint, &[(a, 900), (b, 100)])
        .unwrap();
    assert_eq!(flags(&lb, a), BACKEND_F_ACTIVE | ELSEWHERE);
    assert_eq!(
        lb.set_returning_elsewhere(&endpoint, &[(a, false)])
            .unwrap(),
        1
    );
    assert_eq!(flags(&lb, a), BACKEND_F_ACTIVE);
    // A reload to a static policy (no more rounds to lift it), or without persistence: the
    // entry loses the flag.
    lb.set_returning_elsewhere(&endpoint, &[(a, true)]).unwrap();
    cfg.vips[0].policy.kind = crate::base::config::PolicyKind::Static;
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(flags(&lb, a), BACKEND_F_ACTIVE);
    cfg.vips[0].policy.kind = crate::base::config::PolicyKind::Composite;
    lb.apply(&cfg.vips, &macs()).unwrap();
    lb.set_returning_elsewhere(&endpoint, &[(a, true)]).unwrap();
    cfg.vips[0].persistence = Duration::ZERO;
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(flags(&lb, a), BACKEND_F_ACTIVE);
}

#[test]
fn policy_weights_replace_configured_ones_until_the_policy_is_static() {
    let mut lb = balancer();
    let mut cfg = two_vips();
    cfg.vips[0].policy.kind = crate::base::config::PolicyKind::LeastConn;
    lb.apply(&cfg.vips, &macs()).unwrap();
    let endpoint = cfg.vips[0].endpoint();
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap());
    let report = lb
        .set_policy_weights(&endpoint, &[(a, 900), (b, 100)])
        .unwrap();
    assert_eq!(report.tables_published, 1);
    let shares = lb.vip("web").unwrap().slot_shares();
    assert!((shares[&a] as f64 / 65_537.0 - 0.9).abs() < 0.001);
    // Same weights again: nothing to publish.
    assert_eq!(
        lb.set_policy_weights(&endpoint, &[(a, 900), (b, 100)])
            .unwrap()
            .tables_published,
        0
    );
    // A config apply keeps them; a static policy drops them.
    lb.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(lb.vip("web").unwrap().backends[&a].policy_weight, Some(900));
    cfg.vips[0].policy.kind = crate::base::config::PolicyKind::Static;
    lb.apply(&cfg.vips, &macs()).unwrap();
    let shares = lb.vip("web").unwrap().slot_shares();
    assert!(
        (shares[&b] as f64 / shares[&a] as f64 - 3.0).abs() < 0.01,
        "configured 1:3 back"
    );
}

#[test]
fn fleet_weights_give_every_balancer_the_leaders_table() {
    // The leader sees backend .12 down and reweights .11; the follower sees all healthy.
    let cfg = two_vips();
    let mut leader = balancer();
    leader.apply(&cfg.vips, &macs()).unwrap();
    let endpoint = cfg.vips[0].endpoint();
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap());
    leader.set_health(&endpoint, b, false).unwrap();
    leader.set_policy_weights(&endpoint, &[(a, 700)]).unwrap();
    let mut follower = balancer();
    follower.apply(&cfg.vips, &macs()).unwrap();
    let fingerprint = |lb: &Balancer<MemoryDataplane>| lb.vip("web").unwrap().fingerprint();
    assert_ne!(fingerprint(&leader), fingerprint(&follower));
    let published = crate::steering::fleet::local_weights(&leader);
    assert_eq!(published["web"][&b], 0);
    let report = follower.set_fleet_weights(Some(&published)).unwrap();
    assert!(report.tables_published >= 1);
    assert_eq!(fingerprint(&leader), fingerprint(&follower));
    assert_eq!(
        follower.vip("web").unwrap().table,
        leader.vip("web").unwrap().table
    );
    // The same state again changes nothing; a VIP it does not name keeps local weights.
    assert_eq!(
        follower
            .set_fleet_weights(Some(&published))
            .unwrap()
            .tables_published,
        0
    );
    let mut partial = published.clone();
    partial.remove("web");
    follower.set_fleet_weights(Some(&partial)).unwrap();
    assert_ne!(fingerprint(&leader), fingerprint(&follower));
    // Back to its own view.
    follower.set_fleet_weights(Some(&published)).unwrap();
    follower.set_fleet_weights(None).unwrap();
    let mut fresh = balancer();
    fresh.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(fingerprint(&follower), fingerprint(&fresh));
}

#[test]
fn a_drained_backend_keeps_its_weight_for_undrain() {
    let mut lb = balancer();
    let mut cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    cfg.vips[0].backends[1].drained = true;
    lb.apply(&cfg.vips, &macs()).unwrap();
    let web = lb.vip("web").unwrap();
    let b = &web.backends[&"10.0.0.12".parse::<IpAddr>().unwrap()];
    assert!(!web.table.contains(&b.id));
    assert_eq!(b.weight, 3);
    assert_eq!(lb.dataplane().backends[&b.id].flags, BACKEND_F_ACTIVE);
    cfg.vips[0].backends[1].drained = false;
    lb.apply(&cfg.vips, &macs()).unwrap();
    let shares = lb.vip("web").unwrap().slot_shares();
    let (a, b) = (
        shares[&"10.0.0.11".parse::<IpAddr>().unwrap()] as f64,
        shares[&"10.0.0.12".parse::<IpAddr>().unwrap()] as f64,
    );
    assert!((b / a - 3.0).abs() < 0.01, "weights 1:3 restored: {a} {b}");
}

#[test]
fn drain_keeps_the_backend_active_but_out_of_the_table() {
    let mut lb = balancer();
    let mut cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    cfg.vips[0].backends[1].weight = 0;
    lb.apply(&cfg.vips, &macs()).unwrap();
    let web = lb.vip("web").unwrap();
    let drained = &web.backends[&"10.0.0.12".parse::<IpAddr>().unwrap()];
    assert!(!web.table.contains(&drained.id));
    assert_eq!(lb.dataplane().backends[&drained.id].flags, BACKEND_F_ACTIVE);
}

#[test]
fn removing_a_vip_clears_everything_it_owned() {
    let mut lb = balancer();
    let cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    let web_id = lb.vip("web").unwrap().id;
    lb.apply(&cfg.vips[1..], &macs()).unwrap();
    let dp = lb.dataplane();
    assert!(!dp.tables.contains_key(&web_id));
    // The address marker stays while "dns" uses the address.
    assert_eq!(dp.vips.len(), 2);
    lb.apply(&[], &macs()).unwrap();
    let dp = lb.dataplane();
    assert!(dp.vips.is_empty() && dp.tables.is_empty());
    assert!(dp.backends.values().all(|b| b.flags == 0));
}

#[test]
fn a_missing_mac_is_refused_before_anything_is_written() {
    let mut lb = balancer();
    let mut cfg = two_vips();
    cfg.vips[0].backends.push(BackendConfig {
        address: "192.0.2.1".parse().unwrap(),
        weight: 1,
        drained: false,
        mac: None,
        tier: None,
        from_pool: None,
    });
    let err = lb.apply(&cfg.vips, &macs()).unwrap_err();
    assert!(err.to_string().contains("192.0.2.1"), "{err}");
    assert!(lb.dataplane().vips.is_empty() && lb.dataplane().backends.is_empty());
}

#[test]
fn resizing_a_table_rebuilds_it_at_the_new_size() {
    let mut lb = balancer();
    let mut cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    cfg.vips[0].table_size = 13;
    lb.apply(&cfg.vips, &macs()).unwrap();
    let web = lb.vip("web").unwrap();
    assert_eq!(web.table.len(), 13);
    assert_eq!(
        lb.dataplane().tables[&web.id].len(),
        13 + balancer_common::schedule::HEADER as usize + web.backends.len()
    );
    assert_eq!(
        lb.dataplane().vips[&vip_key("10.100.0.1".parse().unwrap(), 80, 6)].table_size,
        13
    );
}

#[test]
fn a_snapshot_restores_the_same_bookkeeping_without_kernel_writes() {
    let mut lb = balancer();
    lb.set_removal_grace(Duration::from_secs(60));
    let mut cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    lb.set_health(&cfg.vips[0].endpoint(), "10.0.0.12".parse().unwrap(), false)
        .unwrap();
    cfg.vips[1].backends.clear();
    // A returning-client verdict the kernel holds comes back with the bookkeeping (any
    // telemetry policy: the verdict itself is the composite's).
    cfg.vips[0].policy.kind = crate::base::config::PolicyKind::LeastConn;
    cfg.vips[0].persistence = Duration::from_secs(60);
    lb.apply(&cfg.vips, &macs()).unwrap();
    let sticky: IpAddr = "10.0.0.11".parse().unwrap();
    lb.set_returning_elsewhere(&cfg.vips[0].endpoint(), &[(sticky, true)])
        .unwrap();
    let snapshot = lb.snapshot();
    let json = serde_json::to_string(&snapshot).unwrap();
    let restored = Balancer::restore(
        MemoryDataplane::default(),
        &serde_json::from_str(&json).unwrap(),
    )
    .unwrap();
    assert!(
        restored.dataplane().backends.is_empty(),
        "restore must not write the kernel"
    );
    for (a, b) in lb.vips().zip(restored.vips()) {
        assert_eq!(a.id, b.id);
        assert_eq!(a.config, b.config);
        assert_eq!(a.backends, b.backends);
        assert_eq!(a.table, b.table);
    }
    assert_eq!(restored.retiring().len(), 1);
    assert!(restored.vip("web").unwrap().backends[&sticky].returning_elsewhere);
    // Carrying on: the same config changes nothing; new ids do not collide.
    let mut restored = restored;
    let report = restored.apply(&cfg.vips, &macs()).unwrap();
    assert_eq!(report.tables_published, 0);
    cfg.vips[1].backends.push(BackendConfig {
        address: "10.0.0.15".parse().unwrap(),
        weight: 1,
        drained: false,
        mac: None,
        tier: None,
        from_pool: None,
    });
    restored.apply(&cfg.vips, &macs()).unwrap();
    let ids: HashSet<u32> = restored
        .vips()
        .flat_map(|v| v.backends.values().map(|b| b.id))
        .chain(restored.retiring().iter().map(|r| r.state.id))
        .collect();
    assert_eq!(ids.len(), 4, "ids collided after restore");
}

#[test]
fn ids_are_reused_last() {
    let mut pool = IdPool::new(3);
    let a = pool.take().unwrap();
    pool.give_back(a);
    assert_ne!(pool.take(), Some(a));
}

#[test]
fn clients_homed_age_over_the_fade_time_and_go_with_their_id() {
    use balancer_common::schedule::HOME_UNIT;
    let mut lb = balancer();
    let mut cfg = two_vips();
    lb.apply(&cfg.vips, &macs()).unwrap();
    let ids: Vec<u32> = lb
        .vip("web")
        .unwrap()
        .backends
        .values()
        .map(|b| b.id)
        .collect();
    let dns_id = lb.vip("dns").unwrap().backends.values().next().unwrap().id;
    let fill = |lb: &mut Balancer<MemoryDataplane>| {
        for id in ids.iter().chain([&dns_id]) {
            lb.dataplane.homes.insert(*id, 2 * HOME_UNIT);
        }
    };
    fill(&mut lb);
    // No VIP with persistence: none ages, and what was counted is cleared (persistence
    // switched off; switched on again, placements start from none).
    assert_eq!(lb.age_homes().unwrap(), 0);
    assert_eq!(lb.dataplane().homes[&ids[0]], 0);
    assert_eq!(lb.dataplane().homes[&dns_id], 0);
    // Persistence of 16 s on web: its counts fade over 4 s, losing a quarter a second; dns's
    // (without) are cleared.
    cfg.vips[0].persistence = Duration::from_secs(16);
    lb.apply(&cfg.vips, &macs()).unwrap();
    fill(&mut lb);
    assert_eq!(lb.age_homes().unwrap(), 1);
    assert_eq!(lb.dataplane().homes[&ids[0]], 2 * HOME_UNIT * 3 / 4);
    assert_eq!(lb.dataplane().homes[&dns_id], 0);
    // Its static policy has no weight rounds: the configured weights (1 and 3) are the
    // capacities.
    let capacity = |lb: &Balancer<MemoryDataplane>, id: u32| lb.dataplane.home_capacities[&id];
    assert_eq!((capacity(&lb, ids[0]), capacity(&lb, ids[1])), (1000, 3000));
    // A weight round's capacities replace them (a VIP without persistence takes them too: one
    // whose persistence is switched on has them at once).
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.11".parse().unwrap(), "10.0.0.12".parse().unwrap());
    let stranger: IpAddr = "10.9.9.9".parse().unwrap();
    let web = cfg.vips[0].endpoint();
    assert_eq!(
        lb.set_home_capacities(&web, &[(a, 1.6), (b, 0.4), (stranger, 1.0)])
            .unwrap(),
        2
    );
    assert_eq!((capacity(&lb, ids[0]), capacity(&lb, ids[1])), (1600, 400));
    // What an operator reads (status, metrics): clients homed and capacity per backend; none
    // for a VIP without persistence.
    let homes = lb.homes(&web).unwrap();
    assert_eq!(
        homes[&a],
        HomeReading {
            clients: 1.5,
            capacity: Some(1.6)
        }
    );
    assert_eq!(homes[&b].capacity, Some(0.4));
    assert!(lb.homes(&cfg.vips[1].endpoint()).unwrap().is_empty());
    assert_eq!(
        lb.set_home_capacities(&cfg.vips[1].endpoint(), &[(a, 0.5)])
            .unwrap(),
        1
    );
    assert_eq!(capacity(&lb, dns_id), 500);
    // Rounded up: the counts reach 0 (not stuck below the divisor).
    for _ in 0..200 {
        lb.age_homes().unwrap();
    }
    let homes = lb.dataplane().homes(&ids).unwrap();
    assert!(homes.values().all(|h| h.homed == 0), "{homes:?}");
    // (The capacities stay: a static VIP's configured weights, written again each second.)
    assert_eq!(homes[&ids[0]].capacity, 1000);
    // An id given to a new backend starts with none, and no capacity.
    lb.dataplane.homes.insert(ids[0], HOME_UNIT);
    lb.dataplane.reset_active(ids[0]).unwrap();
    assert!(!lb.dataplane().homes.contains_key(&ids[0]));
    assert!(!lb.dataplane().home_capacities.contains_key(&ids[0]));
}

#[test]
fn a_returning_client_counts_about_one_and_one_gone_fades() {
    use crate::dataplane::aged_homes;
    use balancer_common::flow_cache::TICK_NS;
    use balancer_common::schedule::{HOME_UNIT, home_fade_secs, home_refresh};
    // The data plane's adds and the daemon's ageing on one backend's count, in milliseconds,
    // for persistence times from a few seconds to an hour: placed at 0, returning every
    // flow-clock tick (~1.07 s) for ten fade times, then gone. (Under ~20 s the fade is a few
    // seconds and the once-a-second ageing coarse: a returning client counts a half to one.)
    for persistence_secs in [20u64, 60, 300, 3600] {
        let mut config = two_vips().vips.remove(0);
        config.persistence = Duration::from_secs(persistence_secs);
        let (ticks, fade) = (config.persistence_ticks(), home_fade_secs(persistence_secs));
        let tick_ms = TICK_NS / 1_000_000;
        let (returning_ms, end_ms) = (10 * fade * 1000, 13 * fade * 1000);
        let mut count = HOME_UNIT;
        let (mut lowest, mut highest, mut sum, mut samples) = (u64::MAX, 0, 0, 0);
        for ms in 1..=end_ms {
            if ms % tick_ms == 0 && ms <= returning_ms {
                count += home_refresh(ticks);
            }
            if ms % 1000 == 0 {
                count = aged_homes(count, fade);
            }
            if ms > 2 * fade * 1000 && ms <= returning_ms {
                lowest = lowest.min(count);
                highest = highest.max(count);
                (sum, samples) = (sum + count, samples + 1);
            }
        }
        // Returning: about one client on average, never off by a third (the adds come once a
        // tick, the ageing once a second).
        let mean = sum / samples;
        assert!(
            (HOME_UNIT * 9 / 10..=HOME_UNIT * 11 / 10).contains(&mean)
                && lowest >= HOME_UNIT * 2 / 3
                && highest <= HOME_UNIT * 4 / 3,
            "{persistence_secs} s: mean {mean}, {lowest}..{highest}"
        );
        // Three fade times after it left: under a twentieth of one.
        assert!(count < HOME_UNIT / 20, "{persistence_secs} s: {count}");
    }
}

#[test]
fn aged_homes_rounds_the_loss_up() {
    use crate::dataplane::aged_homes;
    assert_eq!(aged_homes(1024, 60), 1024 - 18);
    assert_eq!(aged_homes(3, 60), 2);
    assert_eq!(aged_homes(0, 60), 0);
    assert_eq!(aged_homes(7, 0), 0);
}
