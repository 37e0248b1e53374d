use std::net::IpAddr;
use std::process::ExitCode;

use balancer::api::types::ChangeResult;
use balancer::config::{RawHealth, RawPolicy, RawTelemetry, RawVip};
use clap::Subcommand;

use super::change::report;
use super::client_args::{ClientArgs, fail, print_json};

/// Add, remove and list VIPs (virtual services).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  balancer vip list\n  \
                        balancer vip add web --address 10.100.0.1 --port 80\n  \
                        balancer vip add dns --address 10.100.0.1 --port 53 --protocol udp --forwarding gue\n  \
                        balancer vip add api --address 10.100.0.2 --port 443 --health http --health-path /health\n  \
                        balancer vip add llm --address 10.100.0.3 --port 8000 --policy composite --metrics-port 8000\n  \
                        balancer vip del web")]
pub struct VipArgs {
    #[command(subcommand)]
    command: VipCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Subcommand)]
enum VipCommand {
    /// List the VIPs and their settings.
    List,
    /// Add a VIP (its backends are added with `balancer backend add`).
    Add {
        /// Name to refer to the VIP by.
        name: String,
        #[arg(long)]
        address: IpAddr,
        #[arg(long)]
        port: u16,
        /// tcp or udp.
        #[arg(long, default_value = "tcp")]
        protocol: String,
        /// l2-dsr, ipip or gue.
        #[arg(long, default_value = "l2-dsr")]
        forwarding: String,
        /// Outer UDP port for gue.
        #[arg(long)]
        gue_port: Option<u16>,
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
    },
    /// Remove a VIP (its established connections end with it).
    Del { name: String },
}

pub fn run(args: VipArgs) -> anyhow::Result<ExitCode> {
    let client = args.client.client()?;
    Ok(match args.command {
        VipCommand::List => match client.get::<Vec<RawVip>>("/v1/vips") {
            Ok(vips) if args.client.json => {
                print_json(&vips);
                ExitCode::SUCCESS
            }
            Ok(vips) => {
                println!(
                    "{:<20} {:<28} {:<6} {:<8} {:>8} {:>8}  health",
                    "NAME", "ENDPOINT", "PROTO", "MODE", "TABLE", "BACKENDS"
                );
                for v in vips {
                    let addr = v.address.unwrap_or_default();
                    let endpoint = if addr.contains(':') {
                        format!("[{addr}]:{}", v.port.unwrap_or(0))
                    } else {
                        format!("{addr}:{}", v.port.unwrap_or(0))
                    };
                    println!(
                        "{:<20} {:<28} {:<6} {:<8} {:>8} {:>8}  {}",
                        v.name.unwrap_or_default(),
                        endpoint,
                        v.protocol.unwrap_or_default(),
                        v.forwarding.unwrap_or_default(),
                        v.table_size.unwrap_or(0),
                        v.backend.len(),
                        v.health
                            .and_then(|h| h.check)
                            .unwrap_or_else(|| "none".into())
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        VipCommand::Add {
            name,
            address,
            port,
            protocol,
            forwarding,
            gue_port,
            table_size,
            health,
            health_port,
            health_path,
            health_interval_ms,
            policy,
            metrics_port,
            push,
        } => {
            let body = RawVip {
                name: Some(name),
                address: Some(address.to_string()),
                port: Some(port.into()),
                protocol: Some(protocol),
                forwarding: Some(forwarding),
                gue_port: gue_port.map(i64::from),
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
                backend: Vec::new(),
            };
            report(
                &args.client,
                client.call::<_, ChangeResult>("POST", "/v1/vips", Some(&body)),
            )
        }
        VipCommand::Del { name } => report(
            &args.client,
            client.call::<(), ChangeResult>("DELETE", &format!("/v1/vips/{name}"), None),
        ),
    })
}
