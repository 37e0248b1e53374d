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
mod tier;
mod top;
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
                  balancer top\n  \
                  sudo balancer decap --interface eth0 --gue-port 6080\n  \
                  balancer report --serve 0.0.0.0:9400   # on a GPU backend\n\n\
                  Exit codes: 0 ok, 1 failure (daemon unreachable, kernel error), 2 invalid \
                  input, 3 no such VIP or backend, 4 already exists, 5 token refused."
)]
pub struct Cli {
    /// Log filter (tracing env-filter syntax), e.g. `info` or `balancer=debug`.
    #[arg(long, global = true, env = "BALANCER_LOG", default_value = "info")]
    pub log: String,
    /// How the commands that talk to the daemon reach it, and how they print (before or
    /// after the subcommand).
    #[command(flatten)]
    pub client: client_args::ClientArgs,
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per command line: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    Run(run::RunArgs),
    Status(status::StatusArgs),
    Stats(status::StatsArgs),
    Vip(vip::VipArgs),
    Backend(backend::BackendArgs),
    Table(table::TableArgs),
    Weights(weights::WeightsArgs),
    Tier(tier::TierArgs),
    Reload(reload::ReloadArgs),
    Stop(reload::StopArgs),
    CheckConfig(check_config::CheckConfigArgs),
    Decap(decap::DecapArgs),
    Report(report::ReportArgs),
    Top(top::TopArgs),
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
    if let Err(e) = cli.client.check() {
        eprintln!("error: {e}");
        return Ok(ExitCode::from(EXIT_INVALID));
    }
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Status(_) => status::status(&cli.client),
        Command::Stats(_) => status::stats(&cli.client),
        Command::Vip(args) => vip::run(args, &cli.client),
        Command::Backend(args) => backend::run(args, &cli.client),
        Command::Table(args) => table::run(args, &cli.client),
        Command::Weights(args) => weights::run(args, &cli.client),
        Command::Tier(args) => tier::run(args, &cli.client),
        Command::Reload(_) => reload::reload(&cli.client),
        Command::Stop(args) => reload::stop(args, &cli.client),
        Command::CheckConfig(args) => check_config::run(args),
        Command::Decap(args) => decap::run(args),
        Command::Report(args) => report::run(args, &cli.client),
        Command::Top(args) => top::run(args, &cli.client),
    }
}

/// A tokio runtime for the long-running subcommands.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn client_options_go_before_or_after_the_subcommand() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("balancer").chain(args.iter().copied()))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            (cli.client.socket, cli.client.json, cli.client.connect)
        };
        let expected = (std::path::PathBuf::from("/tmp/b.sock"), true, None);
        assert_eq!(
            parse(&["--socket", "/tmp/b.sock", "--json", "status"]),
            expected
        );
        assert_eq!(
            parse(&["status", "--socket", "/tmp/b.sock", "--json"]),
            expected
        );
        assert_eq!(
            parse(&[
                "--json",
                "backend",
                "--socket",
                "/tmp/b.sock",
                "list",
                "web"
            ]),
            expected
        );
        let (_, _, connect) = parse(&[
            "--connect",
            "10.0.0.1:9090",
            "weights",
            "--token-file",
            "/etc/t",
        ]);
        assert_eq!(connect.as_deref(), Some("10.0.0.1:9090"));
        // --connect without a token file is refused wherever it is written.
        for args in [
            &["balancer", "--connect", "h:1", "status"][..],
            &["balancer", "status", "--connect", "h:1"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            let err = cli.client.check().unwrap_err();
            assert!(err.contains("needs --token-file"), "{args:?}: {err}");
        }
    }
}
