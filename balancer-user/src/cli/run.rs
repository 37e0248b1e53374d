use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use balancer::config::ConfigError;
use balancer::daemon::{self, RunOptions};

use super::{EXIT_INVALID, runtime};

/// Run the balancer daemon: load and attach the XDP program, publish the VIPs of the config,
/// and forward until SIGINT or SIGTERM (which detach it). SIGHUP re-reads the config.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  sudo balancer run --config /etc/balancer/balancer.toml")]
pub struct RunArgs {
    /// Path of the TOML config file.
    #[arg(long, short)]
    config: PathBuf,
    /// Seconds to wait for each backend's next-hop MAC to resolve.
    #[arg(long, default_value_t = 3.0)]
    neighbour_timeout: f64,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if !(0.0..=600.0).contains(&args.neighbour_timeout) {
        anyhow::bail!("--neighbour-timeout must be between 0 and 600 seconds");
    }
    let opts = RunOptions {
        config_path: args.config,
        neighbour_timeout: Duration::from_secs_f64(args.neighbour_timeout),
    };
    match runtime()?.block_on(daemon::run(opts)) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(err) if err.downcast_ref::<ConfigError>().is_some() => {
            eprintln!("error: {err:#}");
            Ok(ExitCode::from(EXIT_INVALID))
        }
        Err(err) => Err(err),
    }
}
