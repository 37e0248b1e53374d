use std::net::IpAddr;
use std::process::ExitCode;

use balancer::base::config::RawBackend;
use balancer::state::wire::{ChangeResult, WeightBody};
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
                        balancer backend del web 10.0.0.11       # leaves the table; its flows continue for the grace period\n  \
                        balancer backend drain --everywhere 10.0.0.11   # every VIP that has it, in one change\n  \
                        balancer backend undrain --everywhere 10.0.0.11")]
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
    /// Remove a backend from a VIP (or, with --everywhere, from every VIP and pool).
    Del(Target),
    /// Set a backend's weight (0 stops new flows, like drain).
    SetWeight {
        vip: String,
        address: IpAddr,
        /// New weight (0-65535).
        #[arg(allow_negative_numbers = true)]
        weight: i64,
    },
    /// Stop sending new flows to a backend; established ones continue.
    Drain(Target),
    /// Send new flows to a drained backend again, at its weight.
    Undrain(Target),
}

/// One backend of one VIP, or one backend everywhere.
#[derive(Debug, clap::Args)]
struct Target {
    /// The VIP.
    #[arg(required_unless_present = "everywhere", conflicts_with = "everywhere")]
    vip: Option<String>,
    /// The backend's address.
    #[arg(required_unless_present = "everywhere", conflicts_with = "everywhere")]
    address: Option<IpAddr>,
    /// Act on this backend in every VIP (and pool) that has it, as one change: a host's
    /// maintenance in one command.
    #[arg(long, value_name = "ADDRESS")]
    everywhere: Option<IpAddr>,
}

impl Target {
    /// The API path of this backend, then `action`.
    fn path(&self, action: &str) -> String {
        match (&self.everywhere, &self.vip, &self.address) {
            (Some(addr), _, _) => format!("/v1/backends/{addr}{action}"),
            (None, Some(vip), Some(addr)) => format!("/v1/vips/{vip}/backends/{addr}{action}"),
            // clap requires the VIP and the address without --everywhere.
            _ => unreachable!("clap requires VIP and ADDRESS without --everywhere"),
        }
    }
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
        BackendCommand::Del(target) => report(
            opts,
            client.call::<(), ChangeResult>("DELETE", &target.path(""), None),
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
        BackendCommand::Drain(target) => report(
            opts,
            client.call::<(), ChangeResult>("POST", &target.path("/drain"), None),
        ),
        BackendCommand::Undrain(target) => report(
            opts,
            client.call::<(), ChangeResult>("POST", &target.path("/undrain"), None),
        ),
    })
}
