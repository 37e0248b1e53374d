use std::process::ExitCode;

use balancer::state::wire::{Stats, Status, VipStatus};

use super::client_args::{ClientArgs, fail, print_json, si};

/// Show the VIPs with their backends: weights, health, table share, active flows, traffic rates;
/// under session persistence the clients each backend homes now and the capacity they are
/// spread by; the table fingerprint of each VIP (equal on every balancer with the same
/// weights); the fleet role and epoch, and the BGP announcements, when configured.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  balancer status\n  balancer status --json | jq '.vips[].backends[].flows'"
)]
pub struct StatusArgs {}

/// Show the data plane's counters (verdicts, connection table, drops by reason) and the traffic
/// per VIP and backend.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  balancer stats\n  balancer stats --json")]
pub struct StatsArgs {}

fn print_vips(vips: &[VipStatus]) {
    for v in vips {
        let endpoint = std::net::SocketAddr::new(v.address, v.port);
        println!(
            "VIP {} {endpoint}/{} {}  scheduler {}  table {} ({})  health {}  {}pps {}bps  {} flows",
            v.name,
            v.protocol,
            v.forwarding,
            v.scheduler,
            v.table_size,
            v.table_fingerprint,
            v.health_check,
            si(v.pps),
            si(v.bps),
            v.flows
        );
        println!(
            "  {:<40} {:>6} {:>7} {:<10} {:>8} {:>10} {:>12} {:>8} {:>8}",
            "BACKEND", "WEIGHT", "TABLE", "STATE", "FLOWS", "PACKETS", "BYTES", "PPS", "BPS"
        );
        for b in &v.backends {
            let state = if b.retiring {
                "removing".to_string()
            } else if !b.healthy {
                "unhealthy".to_string()
            } else if b.drained {
                "drained".to_string()
            } else {
                b.health.clone()
            };
            println!(
                "  {:<40} {:>6} {:>6.1}% {:<10} {:>8} {:>10} {:>12} {:>8} {:>8}",
                b.address.to_string(),
                b.weight,
                b.table_share * 100.0,
                state,
                b.flows,
                b.packets,
                b.bytes,
                si(b.pps),
                si(b.bps)
            );
        }
        let homes: Vec<String> = v
            .backends
            .iter()
            .filter_map(|b| {
                let capacity = match b.home_capacity {
                    Some(c) => format!("{c:.2}"),
                    None => "unknown".to_string(),
                };
                Some(format!("{} {:.2}/{capacity}", b.address, b.homed_clients?))
            })
            .collect();
        if !homes.is_empty() {
            println!(
                "  session persistence, clients homed/capacity: {}",
                homes.join(", ")
            );
        }
        if let Some(a) = &v.admission {
            print_admission(a);
        }
    }
}

/// A VIP's admission control: whether its pool is saturated, how it refuses, and per client
/// tier what was admitted and shed while saturated.
fn print_admission(a: &balancer::state::wire::AdmissionStatus) {
    let overflow = match &a.overflow {
        Some(t) => format!(", overflow to tier {t}"),
        None => String::new(),
    };
    if a.fair {
        print_fair_admission(a, &overflow);
        return;
    }
    println!(
        "  admission: pool {}; refuse by {}{overflow}",
        if a.saturated {
            "SATURATED (admitted tiers only)"
        } else {
            "open"
        },
        a.refuse
    );
    println!(
        "    {:<16} {:<10} {:>10} {:>12} {:>12} {:>12}",
        "TIER", "ADMITTED", "ADMITTED#", "SHED:SATUR", "SHED:CAP", "OVERFLOWED"
    );
    for t in &a.tiers {
        let admitted = match (t.admitted, t.cap) {
            (false, _) => "no".to_string(),
            (true, 0) => "yes".to_string(),
            (true, cap) => format!("<={cap}/s"),
        };
        println!(
            "    {:<16} {:<10} {:>10} {:>12} {:>12} {:>12}",
            t.tier, admitted, t.admitted_flows, t.shed_saturated, t.shed_over_cap, t.overflowed
        );
    }
}

/// Fair admission: the pool's capacity and per tenant its share, its rate now, what it asked
/// and what was decided.
fn print_fair_admission(a: &balancer::state::wire::AdmissionStatus, overflow: &str) {
    let capacity = match a.capacity {
        Some(c) => format!("{c:.1} new flows/s"),
        None => "not measured yet".to_string(),
    };
    println!(
        "  fair admission: pool {} (finishes {capacity}); refuse by {}{overflow}",
        if a.saturated {
            "SATURATED (tenants by share)"
        } else {
            "open"
        },
        a.refuse
    );
    println!(
        "    {:<16} {:>6} {:>10} {:>10} {:>10} {:>12} {:>12}",
        "TENANT", "SHARE", "RATE/s", "ASKED/s", "ADMITTED#", "SHED:RATE", "OVERFLOWED"
    );
    for t in a.tiers.iter().filter(|t| t.share.is_some()) {
        let rate = t.rate.map_or("-".to_string(), |r| format!("{r:.1}"));
        let asked = t.asked.map_or("-".to_string(), |r| format!("{r:.1}"));
        println!(
            "    {:<16} {:>6} {:>10} {:>10} {:>10} {:>12} {:>12}",
            t.tier,
            t.share.unwrap_or(0),
            rate,
            asked,
            t.admitted_flows,
            t.shed_over_cap,
            t.overflowed
        );
    }
}

pub fn status(opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    Ok(match opts.client()?.get::<Status>("/v1/status") {
        Ok(s) if opts.json => {
            print_json(&s);
            ExitCode::SUCCESS
        }
        Ok(s) => {
            println!(
                "interface {} ({} XDP), pinned at {}, up {} s, {} VIPs",
                s.interface,
                s.attach_mode,
                s.pin_dir,
                s.uptime_secs,
                s.vips.len()
            );
            if let Some(f) = &s.fleet {
                println!(
                    "fleet: instance {} is {}, leader {}, epoch {}{}, etcd {}",
                    f.instance,
                    f.role,
                    f.leader.as_deref().unwrap_or("unknown"),
                    f.epoch,
                    f.applied_secs_ago
                        .map(|a| format!(" (applied {a:.1} s ago)"))
                        .unwrap_or_default(),
                    f.etcd
                );
            }
            if let Some(b) = &s.bgp {
                let announced: Vec<String> = b.announced.iter().map(|a| a.to_string()).collect();
                println!(
                    "bgp: announcing [{}]{}{}",
                    announced.join(", "),
                    if b.drained.is_empty() {
                        String::new()
                    } else {
                        format!(", drained: {}", b.drained.join(", "))
                    },
                    b.last_error
                        .as_deref()
                        .map(|e| format!(", error: {e}"))
                        .unwrap_or_default()
                );
            }
            print_vips(&s.vips);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    })
}

pub fn stats(opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    Ok(match opts.client()?.get::<Stats>("/v1/stats") {
        Ok(s) if opts.json => {
            print_json(&s);
            ExitCode::SUCCESS
        }
        Ok(s) => {
            println!("{:<26} {:>14}", "COUNTER", "VALUE");
            for (name, value) in &s.counters {
                println!("{name:<26} {value:>14}");
            }
            println!();
            print_vips(&s.vips);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    })
}
