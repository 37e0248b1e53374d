//! Command-line parsing and dispatch; one module per subcommand.

mod check_config;
mod decap;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A runtime failure (the kernel refused something, a file could not be read, ...).
pub const EXIT_FAILURE: u8 = 1;
/// The configuration or the arguments are invalid (clap uses 2 for bad arguments too).
pub const EXIT_INVALID: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "balancer",
    version,
    about = "Layer-4 XDP load balancer for LLM inference fleets",
    long_about = "Layer-4 TCP/UDP load balancer whose data plane is an XDP program: VIPs, weighted \
                  Maglev consistent hashing, connection tracking, and L2 direct server return or \
                  IPIP/GUE encapsulation.",
    after_help = "Examples:\n  \
                  balancer check-config /etc/balancer/balancer.toml\n  \
                  sudo balancer run --config /etc/balancer/balancer.toml\n  \
                  sudo balancer decap --interface eth0 --gue-port 6080"
)]
pub struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info` or `balancer=debug`.
    #[arg(long, global = true, env = "BALANCER_LOG", default_value = "info")]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Run(run::RunArgs),
    CheckConfig(check_config::CheckConfigArgs),
    Decap(decap::DecapArgs),
}

pub fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::CheckConfig(args) => check_config::run(args),
        Command::Decap(args) => decap::run(args),
    }
}

/// A tokio runtime for the long-running subcommands.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}
