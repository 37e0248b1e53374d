//! Command-line parsing and dispatch; one module per subcommand.

mod backend;
mod change;
mod check_config;
mod client_args;
mod decap;
mod reload;
mod report;
mod run;
mod status;
mod table;
mod vip;
mod weights;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A runtime failure: the daemon is unreachable, the kernel refused something, ...
pub const EXIT_FAILURE: u8 = 1;
/// The configuration, the arguments or the request are invalid (clap uses 2 too).
pub const EXIT_INVALID: u8 = 2;
/// No such VIP or backend.
pub const EXIT_NOT_FOUND: u8 = 3;
/// It exists already.
pub const EXIT_CONFLICT: u8 = 4;
/// The API's bearer token was refused.
pub const EXIT_UNAUTHORIZED: u8 = 5;

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
                  balancer status\n  \
                  balancer backend drain web 10.0.0.11\n  \
                  balancer weights\n  \
                  sudo balancer decap --interface eth0 --gue-port 6080\n  \
                  balancer report --serve 0.0.0.0:9400   # on a GPU backend\n\n\
                  Exit codes: 0 ok, 1 failure (daemon unreachable, kernel error), 2 invalid \
                  input, 3 no such VIP or backend, 4 already exists, 5 token refused."
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
    Status(status::StatusArgs),
    Stats(status::StatsArgs),
    Vip(vip::VipArgs),
    Backend(backend::BackendArgs),
    Table(table::TableArgs),
    Weights(weights::WeightsArgs),
    Reload(reload::ReloadArgs),
    Stop(reload::StopArgs),
    CheckConfig(check_config::CheckConfigArgs),
    Decap(decap::DecapArgs),
    Report(report::ReportArgs),
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
        Command::Status(args) => status::status(args),
        Command::Stats(args) => status::stats(args),
        Command::Vip(args) => vip::run(args),
        Command::Backend(args) => backend::run(args),
        Command::Table(args) => table::run(args),
        Command::Weights(args) => weights::run(args),
        Command::Reload(args) => reload::reload(args),
        Command::Stop(args) => reload::stop(args),
        Command::CheckConfig(args) => check_config::run(args),
        Command::Decap(args) => decap::run(args),
        Command::Report(args) => report::run(args),
    }
}

/// A tokio runtime for the long-running subcommands.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}
