use std::process::ExitCode;

use balancer::state::wire::Table;

use super::client_args::{ClientArgs, fail, print_json};

/// Show a VIP's Maglev table: each backend's share of the slots against its share of the
/// weights, and the table's fingerprint (equal on every balancer with the same backends).
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  balancer table web")]
pub struct TableArgs {
    /// The VIP's name.
    vip: String,
}

pub fn run(args: TableArgs, opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    Ok(
        match opts
            .client()?
            .get::<Table>(&format!("/v1/vips/{}/table", args.vip))
        {
            Ok(t) if opts.json => {
                print_json(&t);
                ExitCode::SUCCESS
            }
            Ok(t) => {
                println!(
                    "VIP {}: {} slots, fingerprint {}",
                    t.vip, t.table_size, t.fingerprint
                );
                println!(
                    "{:<40} {:>6} {:>9} {:>8} {:>9}",
                    "BACKEND", "WEIGHT", "W SHARE", "SLOTS", "S SHARE"
                );
                for b in &t.backends {
                    println!(
                        "{:<40} {:>6} {:>8.2}% {:>8} {:>8.2}%",
                        b.address.to_string(),
                        b.weight,
                        b.weight_share * 100.0,
                        b.slots,
                        b.slot_share * 100.0
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
    )
}
