use std::net::IpAddr;
use std::process::ExitCode;

use balancer::api::types::{ChangeResult, WeightBody};
use balancer::config::RawBackend;
use clap::Subcommand;

use super::change::report;
use super::client_args::{ClientArgs, fail, print_json};

/// Add, remove, reweight, drain and list the backends of a VIP.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  balancer backend list web\n  \
                        balancer backend add web 10.0.0.11 --weight 2\n  \
                        balancer backend set-weight web 10.0.0.11 5\n  \
                        balancer backend drain web 10.0.0.11     # no new flows; established ones continue\n  \
                        balancer backend undrain web 10.0.0.11\n  \
                        balancer backend del web 10.0.0.11       # leaves the table; its flows continue for the grace period")]
pub struct BackendArgs {
    #[command(subcommand)]
    command: BackendCommand,
}

#[derive(Debug, Subcommand)]
enum BackendCommand {
    /// List a VIP's backends.
    List { vip: String },
    /// Add a backend to a VIP.
    Add {
        vip: String,
        address: IpAddr,
        /// Relative share of new flows (0-65535).
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// Next-hop MAC (default: from the neighbour table).
        #[arg(long)]
        mac: Option<String>,
        /// Dedicate it to a priority tier (a `[[tier]]` of the config) instead of the shared
        /// pool.
        #[arg(long)]
        tier: Option<String>,
    },
    /// Remove a backend from a VIP.
    Del { vip: String, address: IpAddr },
    /// Set a backend's weight (0 stops new flows, like drain).
    SetWeight {
        vip: String,
        address: IpAddr,
        /// New weight (0-65535).
        #[arg(allow_negative_numbers = true)]
        weight: i64,
    },
    /// Stop sending new flows to a backend; established ones continue.
    Drain { vip: String, address: IpAddr },
    /// Send new flows to a drained backend again, at its weight.
    Undrain { vip: String, address: IpAddr },
}

pub fn run(args: BackendArgs, opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    let client = opts.client()?;
    let path =
        |vip: &str, addr: &IpAddr, action: &str| format!("/v1/vips/{vip}/backends/{addr}{action}");
    Ok(match args.command {
        BackendCommand::List { vip } => {
            match client.get::<Vec<RawBackend>>(&format!("/v1/vips/{vip}/backends")) {
                Ok(list) if opts.json => {
                    print_json(&list);
                    ExitCode::SUCCESS
                }
                Ok(list) => {
                    println!(
                        "{:<40} {:>6} {:<8} {:<12} MAC",
                        "BACKEND", "WEIGHT", "DRAINED", "TIER"
                    );
                    for b in list {
                        println!(
                            "{:<40} {:>6} {:<8} {:<12} {}",
                            b.address.unwrap_or_default(),
                            b.weight.unwrap_or(1),
                            if b.drained.unwrap_or(false) {
                                "yes"
                            } else {
                                "no"
                            },
                            b.tier.unwrap_or_else(|| "shared".into()),
                            b.mac.unwrap_or_else(|| "(neighbour table)".into())
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        BackendCommand::Add {
            vip,
            address,
            weight,
            mac,
            tier,
        } => {
            let body = RawBackend {
                address: Some(address.to_string()),
                weight: Some(weight.into()),
                drained: None,
                mac,
                tier,
            };
            report(
                opts,
                client.call::<_, ChangeResult>(
                    "POST",
                    &format!("/v1/vips/{vip}/backends"),
                    Some(&body),
                ),
            )
        }
        BackendCommand::Del { vip, address } => report(
            opts,
            client.call::<(), ChangeResult>("DELETE", &path(&vip, &address, ""), None),
        ),
        BackendCommand::SetWeight {
            vip,
            address,
            weight,
        } => report(
            opts,
            client.call::<_, ChangeResult>(
                "PUT",
                &path(&vip, &address, "/weight"),
                Some(&WeightBody { weight }),
            ),
        ),
        BackendCommand::Drain { vip, address } => report(
            opts,
            client.call::<(), ChangeResult>("POST", &path(&vip, &address, "/drain"), None),
        ),
        BackendCommand::Undrain { vip, address } => report(
            opts,
            client.call::<(), ChangeResult>("POST", &path(&vip, &address, "/undrain"), None),
        ),
    })
}
