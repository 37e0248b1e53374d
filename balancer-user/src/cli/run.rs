use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use balancer::base::config::ConfigError;
use balancer::serve::daemon::{self, RunOptions};

use super::{EXIT_INVALID, runtime};

/// Run the balancer daemon: load the XDP program (or adopt the one a previous daemon left
/// pinned), publish the VIPs of the config, and serve the control API, metrics and health
/// checks. SIGHUP re-reads the config. SIGINT/SIGTERM stop the daemon and leave the pinned
/// program forwarding; a restarted daemon adopts it (nothing is lost). `balancer stop
/// --detach` removes it.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  sudo balancer run --config /etc/balancer/balancer.toml\n  \
                        sudo balancer run --config /etc/balancer/balancer.toml --replace   # upgrade the program in place"
)]
pub struct RunArgs {
    /// Path of the TOML config file.
    #[arg(long, short)]
    config: PathBuf,
    /// Seconds to wait for each backend's next-hop MAC to resolve.
    #[arg(long, default_value_t = 3.0)]
    neighbour_timeout: f64,
    /// Swap this binary's XDP program into the pinned link atomically, keeping the maps and
    /// the connection table (upgrade without dropping a packet).
    #[arg(long)]
    replace: bool,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if !(0.0..=600.0).contains(&args.neighbour_timeout) {
        anyhow::bail!("--neighbour-timeout must be between 0 and 600 seconds");
    }
    daemon::abort_on_panic();
    daemon::raise_descriptor_limit();
    let opts = RunOptions {
        config_path: args.config,
        neighbour_timeout: Duration::from_secs_f64(args.neighbour_timeout),
        replace: args.replace,
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
