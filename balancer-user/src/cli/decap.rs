use std::net::IpAddr;
use std::process::ExitCode;

use balancer::base::config::AttachMode;
use balancer::base::net::Prefix;
use balancer::dataplane::decap::{self, DecapOptions};

use super::runtime;

/// Run the backend-side decapsulator for the ipip and gue forwarding modes: strip the outer
/// header of packets addressed to this interface's addresses and pass the inner packet to the
/// stack, until SIGINT or SIGTERM. The backend must also hold the VIP (e.g. on `lo`).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  sudo balancer decap --interface eth0 --allow 10.0.0.2 --allow 10.0.0.3\n  \
                        sudo balancer decap --interface eth0 --gue-port 6080 --mode skb --allow 10.0.0.0/29"
)]
pub struct DecapArgs {
    /// Interface the encapsulated packets arrive on.
    #[arg(long, short)]
    interface: String,
    /// XDP attach mode: native or skb.
    #[arg(long, default_value = "native")]
    mode: AttachMode,
    /// Also strip GUE (IP in UDP) sent to this port.
    #[arg(long)]
    gue_port: Option<u16>,
    /// Accept this outer destination too (repeatable); the interface's addresses always are.
    #[arg(long = "accept")]
    accept: Vec<IpAddr>,
    /// Strip only tunnelled packets whose outer source lies in this address or prefix (the
    /// balancers'; repeatable) and drop the others. Without it, any outer source is accepted,
    /// and anyone who can reach the interface can send traffic that appears to come from
    /// any client.
    #[arg(long = "allow", value_name = "SRC[/LEN]", value_parser = parse_prefix)]
    allow: Vec<Prefix>,
}

fn parse_prefix(s: &str) -> Result<Prefix, String> {
    s.parse()
}

pub fn run(args: DecapArgs) -> anyhow::Result<ExitCode> {
    if args.gue_port == Some(0) {
        anyhow::bail!("--gue-port must be between 1 and 65535");
    }
    let opts = DecapOptions {
        interface: args.interface,
        attach_mode: args.mode,
        gue_port: args.gue_port,
        extra_addresses: args.accept,
        allowed_sources: args.allow,
    };
    runtime()?.block_on(decap::run(opts))?;
    Ok(ExitCode::SUCCESS)
}
