use std::net::IpAddr;
use std::process::ExitCode;

use balancer::base::config::{RawHealth, RawPolicy, RawTelemetry, RawVip};
use balancer::serve::api::client::Client;
use balancer::state::wire::ChangeResult;
use clap::{Args, Subcommand};

use super::change::report;
use super::client_args::{ClientArgs, fail, print_json};

/// Add, remove and list VIPs (virtual services).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  balancer vip list\n  \
                        balancer vip add web --address 10.100.0.1 --port 80\n  \
                        balancer vip add dns --address 10.100.0.1 --port 53 --protocol udp --forwarding gue\n  \
                        balancer vip add api --address 10.100.0.2 --port 443 --health http --health-path /health\n  \
                        balancer vip add llm --address 10.100.0.3 --port 8000 --policy composite --metrics-port 8000\n  \
                        balancer vip add chat --address 10.100.0.4 --port 8000 --scheduler source-hash --max-load-factor 1.25\n  \
                        balancer vip set-scheduler web least-conn\n  \
                        balancer vip set-scheduler chat maglev --persistence-secs 600\n  \
                        balancer vip drain web\n  \
                        balancer vip del web")]
pub struct VipArgs {
    #[command(subcommand)]
    command: VipCommand,
}

/// `vip add`'s arguments.
#[derive(Debug, Args)]
struct AddArgs {
    /// Name to refer to the VIP (or the service) by.
    name: String,
    #[arg(long, required = true)]
    address: Vec<IpAddr>,
    #[arg(long, required = true)]
    port: Vec<u16>,
    /// tcp or udp.
    #[arg(long, default_values_t = ["tcp".to_string()])]
    protocol: Vec<String>,
    /// l2-dsr, ipip, gue or nat.
    #[arg(long, default_value = "l2-dsr")]
    forwarding: String,
    /// Outer UDP port for gue.
    #[arg(long)]
    gue_port: Option<u16>,
    /// Source NAT for nat: "interface" or an address (repeat for one per family).
    #[arg(long)]
    nat_source: Vec<String>,
    /// Maglev table size (a prime).
    #[arg(long)]
    table_size: Option<u32>,
    /// Health check of its backends: none, tcp or http.
    #[arg(long, default_value = "none")]
    health: String,
    /// Port checked (default: the VIP's port).
    #[arg(long)]
    health_port: Option<u16>,
    /// HTTP path checked.
    #[arg(long)]
    health_path: Option<String>,
    /// Milliseconds between checks.
    #[arg(long)]
    health_interval_ms: Option<u64>,
    /// Weight policy: static, least-conn, least-latency, gpu, tokens, composite.
    #[arg(long, default_value = "static")]
    policy: String,
    /// Scrape each backend's metrics page on this port (/metrics).
    #[arg(long, conflicts_with = "push")]
    metrics_port: Option<u16>,
    /// Backends push their reports (balancer report --push).
    #[arg(long)]
    push: bool,
    /// How new flows pick a backend: maglev, source-hash, round-robin,
    /// weighted-round-robin, random, weighted-random, least-conn, power-of-two.
    #[arg(long, default_value = "maglev")]
    scheduler: String,
    /// Session persistence: a client's new flows go to its previous backend while it
    /// returns within this many seconds (0 = off).
    #[arg(long)]
    persistence_secs: Option<u32>,
    /// Bounded load: no new clients by hash or persistence for a backend above this
    /// multiple of its weighted share of active flows (e.g. 1.25).
    #[arg(long)]
    max_load_factor: Option<f64>,
    /// Tenant affinity: source hash and persistence key on the first this many bits of
    /// an IPv4 client's address (e.g. 24; default 32, the whole address).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=32))]
    affinity_prefix_v4: Option<u8>,
    /// ...and of an IPv6 client's (e.g. 64; default 128).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=128))]
    affinity_prefix_v6: Option<u8>,
    /// Admission control: while every backend of the shared pool is saturated, admit new
    /// flows of this `[[tier]]` only, at most CAP per second per CPU (no =CAP: no cap).
    /// Repeatable; any admission flag turns admission control on.
    #[arg(long = "admit", value_name = "TIER[=CAP]")]
    admit: Vec<String>,
    /// Admission control: send the new flows not admitted to this tier's backends.
    #[arg(long, value_name = "TIER")]
    admission_overflow: Option<String>,
    /// Admission control: refuse the new flows not admitted with a TCP RST ("reset", the
    /// default; UDP is dropped) or by dropping them ("drop").
    #[arg(long, value_name = "reset|drop")]
    admission_refuse: Option<String>,
    /// Fair admission: every `[[tier]]` is a tenant (and the clients of no tier one more);
    /// while the shared pool is saturated, each is admitted by its `share` of the new flows
    /// the pool can take (instead of --admit's tiers).
    #[arg(long)]
    fair_admission: bool,
    /// Fair admission: the share of the clients of no tier (default 1).
    #[arg(long, value_name = "SHARE", requires = "fair_admission")]
    default_share: Option<u32>,
    /// Model routing: take the backends of this `[[pool]]` of the config...
    #[arg(long)]
    pool: Option<String>,
    /// ...that serve this model.
    #[arg(long, requires = "pool")]
    model: Option<String>,
}

#[derive(Debug, Subcommand)]
enum VipCommand {
    /// List the VIPs and their settings.
    List,
    /// Add a VIP (its backends are added with `balancer backend add`). Repeat --address (an
    /// IPv4 and an IPv6 one), --port or --protocol for a service: one VIP for each
    /// combination, named NAME-PORT-PROTOCOL-v4/v6 (a suffix for each repeated option).
    Add(Box<AddArgs>),
    /// Change a VIP's scheduler (established flows keep their backends).
    SetScheduler {
        name: String,
        /// maglev, source-hash, round-robin, weighted-round-robin, random, weighted-random,
        /// least-conn or power-of-two.
        scheduler: String,
        /// Session persistence in seconds (0 = off; unchanged if absent).
        #[arg(long)]
        persistence_secs: Option<u32>,
        /// Bounded load factor (0 removes it; unchanged if absent).
        #[arg(long)]
        max_load_factor: Option<f64>,
        /// Tenant affinity's IPv4 source prefix length (32: whole addresses; unchanged if
        /// absent).
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=32))]
        affinity_prefix_v4: Option<u8>,
        /// Its IPv6 source prefix length (128: whole addresses; unchanged if absent).
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=128))]
        affinity_prefix_v6: Option<u8>,
    },
    /// Remove a VIP (its established connections end with it).
    Del { name: String },
    /// Stop announcing a VIP over BGP (`[bgp]`): the routers send its new traffic to the
    /// fleet's other balancers; what still arrives here is forwarded as before.
    Drain { name: String },
    /// Announce a drained VIP again.
    Undrain { name: String },
}

pub fn run(args: VipArgs, opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    let client = opts.client()?;
    Ok(match args.command {
        VipCommand::List => list(&client, opts),
        VipCommand::Add(add) => {
            let body = add_body(*add)?;
            report(
                opts,
                client.call::<_, ChangeResult>("POST", "/v1/vips", Some(&body)),
            )
        }
        VipCommand::SetScheduler {
            name,
            scheduler,
            persistence_secs,
            max_load_factor,
            affinity_prefix_v4,
            affinity_prefix_v6,
        } => {
            let body = balancer::state::wire::SchedulerBody {
                scheduler,
                persistence_secs: persistence_secs.map(i64::from),
                max_load_factor,
                affinity_prefix_v4: affinity_prefix_v4.map(i64::from),
                affinity_prefix_v6: affinity_prefix_v6.map(i64::from),
            };
            report(
                opts,
                client.call::<_, ChangeResult>(
                    "PUT",
                    &format!("/v1/vips/{name}/scheduler"),
                    Some(&body),
                ),
            )
        }
        VipCommand::Del { name } => report(
            opts,
            client.call::<(), ChangeResult>("DELETE", &format!("/v1/vips/{name}"), None),
        ),
        VipCommand::Drain { name } => report(
            opts,
            client.call::<(), ChangeResult>("POST", &format!("/v1/vips/{name}/drain"), None),
        ),
        VipCommand::Undrain { name } => report(
            opts,
            client.call::<(), ChangeResult>("POST", &format!("/v1/vips/{name}/undrain"), None),
        ),
    })
}

/// `vip list`: a line per VIP, or the JSON.
fn list(client: &Client, opts: &ClientArgs) -> ExitCode {
    match client.get::<Vec<RawVip>>("/v1/vips") {
        Ok(vips) if opts.json => {
            print_json(&vips);
            ExitCode::SUCCESS
        }
        Ok(vips) => {
            println!(
                "{:<20} {:<28} {:<6} {:<8} {:>8} {:>8}  {:<8} SERVICE",
                "NAME", "ENDPOINT", "PROTO", "MODE", "TABLE", "BACKENDS", "HEALTH"
            );
            for v in vips {
                let addr = v.address.unwrap_or_default();
                let endpoint = if addr.contains(':') {
                    format!("[{addr}]:{}", v.port.unwrap_or(0))
                } else {
                    format!("{addr}:{}", v.port.unwrap_or(0))
                };
                println!(
                    "{:<20} {:<28} {:<6} {:<8} {:>8} {:>8}  {:<8} {}",
                    v.name.unwrap_or_default(),
                    endpoint,
                    v.protocol.unwrap_or_default(),
                    v.forwarding.unwrap_or_default(),
                    v.table_size.unwrap_or(0),
                    v.backend.len(),
                    v.health
                        .and_then(|h| h.check)
                        .unwrap_or_else(|| "none".into()),
                    v.service.unwrap_or_else(|| "-".into())
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// The `POST /v1/vips` body of `vip add`.
fn add_body(args: AddArgs) -> anyhow::Result<RawVip> {
    let AddArgs {
        name,
        address,
        port,
        protocol,
        forwarding,
        gue_port,
        nat_source,
        table_size,
        health,
        health_port,
        health_path,
        health_interval_ms,
        policy,
        metrics_port,
        push,
        scheduler,
        persistence_secs,
        max_load_factor,
        affinity_prefix_v4,
        affinity_prefix_v6,
        admit,
        admission_overflow,
        admission_refuse,
        fair_admission,
        default_share,
        pool,
        model,
    } = args;
    let admission = admission_body(
        admit,
        admission_overflow,
        admission_refuse,
        fair_admission.then_some(default_share),
    )?;
    // One value goes in the singular key, several make a service.
    use balancer::base::config::service::one_or_many;
    let (address, addresses) = one_or_many(address.iter().map(IpAddr::to_string).collect());
    let (port, ports) = one_or_many(port.into_iter().map(i64::from).collect());
    let (protocol, protocols) = one_or_many(protocol);
    let body = RawVip {
        name: Some(name),
        address,
        addresses,
        port,
        ports,
        protocol,
        protocols,
        service: None,
        forwarding: Some(forwarding),
        gue_port: gue_port.map(i64::from),
        nat_source,
        table_size: table_size.map(i64::from),
        health: Some(RawHealth {
            check: Some(health),
            port: health_port.map(i64::from),
            path: health_path,
            interval_ms: health_interval_ms.map(|v| v as i64),
            ..RawHealth::default()
        }),
        telemetry: match (metrics_port, push) {
            (Some(port), _) => Some(RawTelemetry {
                source: Some("scrape".into()),
                port: Some(port.into()),
                ..RawTelemetry::default()
            }),
            (None, true) => Some(RawTelemetry {
                source: Some("push".into()),
                ..RawTelemetry::default()
            }),
            (None, false) => None,
        },
        policy: Some(RawPolicy {
            kind: Some(policy),
            ..RawPolicy::default()
        }),
        scheduler: Some(scheduler),
        persistence_secs: persistence_secs.map(i64::from),
        max_load_factor,
        affinity_prefix_v4: affinity_prefix_v4.map(i64::from),
        affinity_prefix_v6: affinity_prefix_v6.map(i64::from),
        admission,
        pool,
        model,
        backend: Vec::new(),
    };
    Ok(body)
}

/// `vip add`'s admission flags as the config's `[vip.admission]` table (`None` when none is
/// given); `fair` is `Some(default share)` for fair admission. A cap that is not a number is
/// refused here, naming the flag; the rest is checked by the daemon with the whole config.
fn admission_body(
    admit: Vec<String>,
    overflow: Option<String>,
    refuse: Option<String>,
    fair: Option<Option<u32>>,
) -> anyhow::Result<Option<balancer::base::config::RawAdmission>> {
    if admit.is_empty() && overflow.is_none() && refuse.is_none() && fair.is_none() {
        return Ok(None);
    }
    let mut tiers = std::collections::BTreeMap::new();
    for entry in admit {
        let (tier, cap) = match entry.split_once('=') {
            Some((tier, cap)) => (
                tier.to_string(),
                cap.parse::<i64>().map_err(|_| {
                    anyhow::anyhow!("--admit {entry:?}: the cap after '=' must be a whole number")
                })?,
            ),
            None => (entry, 0),
        };
        tiers.insert(tier, cap);
    }
    Ok(Some(balancer::base::config::RawAdmission {
        admit: tiers,
        overflow,
        refuse,
        fair: fair.map(|_| true),
        default_share: fair.flatten().map(i64::from),
    }))
}

#[cfg(test)]
mod tests {
    use super::admission_body;

    #[test]
    fn admission_flags_make_the_admission_table() {
        assert_eq!(admission_body(Vec::new(), None, None, None).unwrap(), None);
        let a = admission_body(
            vec!["premium".into(), "standard=200".into()],
            Some("spare".into()),
            Some("drop".into()),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.admit.get("premium"), Some(&0));
        assert_eq!(a.admit.get("standard"), Some(&200));
        assert_eq!(a.overflow.as_deref(), Some("spare"));
        assert_eq!(a.refuse.as_deref(), Some("drop"));
        // Refusal alone turns it on, admitting no tier.
        let a = admission_body(Vec::new(), None, Some("reset".into()), None)
            .unwrap()
            .unwrap();
        assert!(a.admit.is_empty());
        assert_eq!(a.fair, None);
        // Fair admission alone turns it on, with its default share when given.
        let a = admission_body(Vec::new(), None, None, Some(Some(3)))
            .unwrap()
            .unwrap();
        assert_eq!((a.fair, a.default_share), (Some(true), Some(3)));
        let a = admission_body(Vec::new(), None, None, Some(None))
            .unwrap()
            .unwrap();
        assert_eq!((a.fair, a.default_share), (Some(true), None));
        let err = admission_body(vec!["premium=lots".into()], None, None, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("--admit \"premium=lots\": the cap after '=' must be a whole number"),
            "{err}"
        );
    }
}
