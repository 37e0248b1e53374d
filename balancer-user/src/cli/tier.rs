use std::process::ExitCode;

use balancer::state::wire::{ChangeResult, TenantBody};

use super::change::report;
use super::client_args::ClientArgs;

/// Change a `[[tier]]` as a tenant of fair admission, live: its share of a saturated pool and
/// its own rate limit (the VIPs' admission entries change; no table, no connection).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  balancer tier set team-a --share 3\n  \
                        balancer tier set team-b --max-new-flows-per-sec 200\n  \
                        balancer tier set team-b --max-new-flows-per-sec 0   # no limit")]
pub struct TierArgs {
    #[command(subcommand)]
    command: TierCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TierCommand {
    /// Set a tier's share and/or its rate limit (absent: unchanged).
    Set {
        name: String,
        /// Its share (weight) of a saturated pool, 1-10000.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        share: Option<u32>,
        /// Its new flows per second on each VIP with fair admission, saturated or not (0
        /// removes the limit).
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100_000_000))]
        max_new_flows_per_sec: Option<u32>,
    },
}

pub fn run(args: TierArgs, opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    let client = opts.client()?;
    Ok(match args.command {
        TierCommand::Set {
            name,
            share,
            max_new_flows_per_sec,
        } => {
            if share.is_none() && max_new_flows_per_sec.is_none() {
                anyhow::bail!("nothing to change: give --share or --max-new-flows-per-sec");
            }
            let body = TenantBody {
                share: share.map(i64::from),
                max_new_flows_per_sec: max_new_flows_per_sec.map(i64::from),
            };
            report(
                opts,
                client.call::<_, ChangeResult>("PUT", &format!("/v1/tiers/{name}"), Some(&body)),
            )
        }
    })
}
