//! The families read at scrape time from the data plane's counters and the daemon's views
//! (VIP and backend status, weights and the reports behind them), in Prometheus form.

use balancer_common::stats::{Counter, GlobalStats, NatLinkStats};

use super::Families;
use crate::state::wire::{BackendStatus, Status, VipStatus, VipWeights, WeightRow};
use crate::steering::fleet::{FleetRole, FleetStatus};

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
    let mut f = Families::default();
    if let Some(fleet) = &status.fleet {
        fleet_families(&mut f, fleet);
    }
    if status.bgp.is_some() {
        for vip in &status.vips {
            f.gauge(
                "balancer_vip_announced",
                "1 while the VIP is announced over BGP (it has a backend to serve and is not drained).",
                &[("vip", vip.name.as_str())],
                flag(vip.announced),
            );
        }
    }
    if let Some(counters) = counters {
        verdict_families(&mut f, counters);
        event_families(&mut f, &counters.global);
    }
    for vip in &status.vips {
        vip_families(&mut f, vip);
        for b in &vip.backends {
            backend_families(&mut f, &vip.name, b);
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
            weight_families(&mut f, &v.vip, b);
        }
    }
    f
}

/// 1.0 for true, 0.0 for false.
fn flag(on: bool) -> f64 {
    if on { 1.0 } else { 0.0 }
}

/// This balancer's place in its fleet.
fn fleet_families(f: &mut Families, fleet: &FleetStatus) {
    let instance = [("instance_name", fleet.instance.as_str())];
    f.gauge(
        "balancer_fleet_leader",
        "1 while this balancer is its fleet's leader.",
        &instance,
        flag(fleet.role == FleetRole::Leader),
    );
    f.gauge(
        "balancer_fleet_etcd_up",
        "1 while the last exchange with etcd succeeded.",
        &instance,
        flag(fleet.etcd.is_ok()),
    );
    f.gauge(
        "balancer_fleet_epoch",
        "The fleet state epoch applied (or, on the leader, published) last.",
        &instance,
        fleet.epoch as f64,
    );
}

/// What the data plane did with packets: XDP verdicts, drops by reason, NAT's redirects.
fn verdict_families(f: &mut Families, Counters { global, nat_links }: &Counters) {
    f.counter(
        "balancer_xdp_actions_total",
        "Packets the program handled (for a VIP or a VIP address, NAT replies), by XDP verdict.",
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
    // reason "fragment".
    for counter in Counter::ALL {
        if let Some(action) = counter.name().strip_prefix("xdp_") {
            f.counter(
                "balancer_xdp_actions_total",
                "Packets the program handled (for a VIP or a VIP address, NAT replies), by XDP verdict.",
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
}

/// The data plane's events: connection-table lookups, flood mode, ICMP, session persistence.
fn event_families(f: &mut Families, global: &GlobalStats) {
    counters_by_result(
        f,
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
    for (name, help, counter) in [
        (
            "balancer_flood_activations_total",
            "Times a CPU entered flood mode.",
            Counter::FloodActivations,
        ),
        (
            "balancer_flood_inserts_skipped_total",
            "New flows not recorded because of flood mode.",
            Counter::FloodInsertsSkipped,
        ),
        (
            "balancer_icmp_errors_forwarded_total",
            "ICMP errors about VIP flows forwarded to their backend.",
            Counter::IcmpErrorForwarded,
        ),
        (
            "balancer_icmp_too_big_sent_total",
            "ICMP fragmentation-needed / packet-too-big answers sent.",
            Counter::IcmpTooBigSent,
        ),
    ] {
        f.counter(name, help, &[], global.get(counter) as f64);
    }
    counters_by_result(
        f,
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

/// A VIP's traffic, and its admission control's decisions.
fn vip_families(f: &mut Families, vip: &VipStatus) {
    let l = [("vip", vip.name.as_str())];
    for (name, help, value) in [
        (
            "balancer_vip_packets_total",
            "Packets to a VIP.",
            vip.packets,
        ),
        ("balancer_vip_bytes_total", "Bytes to a VIP.", vip.bytes),
        (
            "balancer_vip_new_flows_total",
            "Flows chosen from a VIP's Maglev table.",
            vip.new_flows,
        ),
    ] {
        f.counter(name, help, &l, value as f64);
    }
    f.gauge(
        "balancer_vip_flows",
        "Active flows of a VIP.",
        &l,
        vip.flows as f64,
    );
    let Some(a) = &vip.admission else { return };
    f.gauge(
        "balancer_admission_saturated",
        "1 while every eligible backend of the VIP's shared pool is saturated: admission control admits only the admitted tiers' new flows.",
        &l,
        flag(a.saturated),
    );
    if let Some(c) = a.capacity {
        f.gauge(
            "balancer_admission_capacity",
            "Fair admission: the new flows per second the VIP's shared pool finishes, as measured; what the tenants share while it is saturated.",
            &l,
            c,
        );
    }
    for t in &a.tiers {
        let tl = [("vip", l[0].1), ("tier", t.tier.as_str())];
        if let Some(share) = t.share {
            f.gauge(
                "balancer_admission_tenant_share",
                "Fair admission: a tenant's share (weight).",
                &tl,
                f64::from(share),
            );
        }
        if let Some(rate) = t.rate {
            f.gauge(
                "balancer_admission_tenant_rate",
                "Fair admission: the new flows per second a tenant may open now (its fair share while the pool is saturated, its own limit at all times; absent: no limit).",
                &tl,
                rate,
            );
        }
        if let Some(asked) = t.asked {
            f.gauge(
                "balancer_admission_tenant_asked",
                "Fair admission: the new flows per second a tenant asked for lately.",
                &tl,
                asked,
            );
        }
        for (outcome, flows) in [
            ("admitted", t.admitted_flows),
            ("shed_saturated", t.shed_saturated),
            ("shed_over_cap", t.shed_over_cap),
            ("overflowed", t.overflowed),
        ] {
            f.counter(
                "balancer_admission_flows_total",
                "New flows admission control decided on while the pool was saturated (in fair admission, at all times), by client tier and outcome (shed: not admitted, because the tier is not admitted or its cap, or in fair admission its rate, was spent; overflowed: of those shed, sent to the overflow tier).",
                &[("vip", l[0].1), ("tier", t.tier.as_str()), ("outcome", outcome)],
                flows as f64,
            );
        }
    }
}

/// A backend's traffic, table share, health, and where persistence homes clients on it.
fn backend_families(f: &mut Families, vip: &str, b: &BackendStatus) {
    let addr = b.address.to_string();
    let l = [("vip", vip), ("backend", addr.as_str())];
    for (name, help, value) in [
        (
            "balancer_backend_packets_total",
            "Packets sent to a backend.",
            b.packets,
        ),
        (
            "balancer_backend_bytes_total",
            "Bytes sent to a backend.",
            b.bytes,
        ),
        (
            "balancer_backend_new_flows_total",
            "Flows a backend took from the Maglev table.",
            b.new_flows,
        ),
    ] {
        f.counter(name, help, &l, value as f64);
    }
    let gauges = [
        (
            "balancer_backend_flows",
            "Active flows of a backend: recorded, not yet ended by the client (FIN/RST) or evicted.",
            Some(b.flows as f64),
        ),
        (
            "balancer_backend_weight",
            "A backend's configured weight.",
            Some(f64::from(b.weight)),
        ),
        (
            "balancer_backend_table_share",
            "A backend's share of its VIP's Maglev table (0..1).",
            Some(b.table_share),
        ),
        (
            "balancer_backend_bound_share",
            "Under bounded load: a backend's share of its pool's weights averaged over the VIP's mean flow duration (0..1), what its share of active flows is held to times the bound.",
            b.bound_share,
        ),
        (
            "balancer_backend_homed_clients",
            "Under session persistence: the clients a backend homes now (placed, or returning within about a quarter of the persistence time); with a bound, a VIP's new client goes to the backend homing the fewest per unit of capacity when the scheduler's pick homes 3/2 as many.",
            b.homed_clients,
        ),
        (
            "balancer_backend_home_capacity",
            "Under session persistence: the capacity a backend's clients are spread by (configured weight x KV-cache capacity against the pool's mean; 1 is a mean backend of weight 1); absent until the first weight round writes it.",
            b.home_capacity,
        ),
        (
            "balancer_backend_healthy",
            "1 if the backend passes its health checks (or is unchecked).",
            Some(flag(b.healthy)),
        ),
        (
            "balancer_backend_drained",
            "1 if the backend is drained or being removed.",
            Some(flag(b.drained)),
        ),
    ];
    for (name, help, value) in gauges {
        if let Some(value) = value {
            f.gauge(name, help, &l, value);
        }
    }
}

/// A backend's weight and what the policy made of its latest report.
fn weight_families(f: &mut Families, vip: &str, b: &WeightRow) {
    let addr = b.address.to_string();
    let l = [("vip", vip), ("backend", addr.as_str())];
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
        flag(b.saturated),
    );
    f.gauge(
        "balancer_backend_returning_elsewhere",
        "1 while session persistence sends the backend's returning clients elsewhere: the policy expects another backend to serve them sooner, their whole prompt prefilled there.",
        &l,
        flag(b.returning_elsewhere),
    );
    if let Some(s) = &b.signals {
        report_families(f, &l, s, b.report_age_ms);
    }
}

/// What a backend's latest report said, the policy's inputs (a family per signal it gave).
fn report_families(
    f: &mut Families,
    l: &[(&str, &str)],
    s: &crate::steering::telemetry::signals::Signals,
    report_age_ms: Option<u64>,
) {
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
            report_age_ms.map(|a| a as f64 / 1000.0),
        ),
    ];
    for (name, help, value) in inputs {
        if let Some(value) = value {
            f.gauge(name, help, l, value);
        }
    }
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
mod tests;
