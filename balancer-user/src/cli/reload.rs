use std::path::PathBuf;
use std::process::ExitCode;

use balancer::base::config::Config;
use balancer::dataplane::pinning::Pins;
use balancer::state::wire::{ChangeResult, StopBody};

use super::EXIT_INVALID;
use super::change::report;
use super::client_args::ClientArgs;

/// Have the daemon re-read its config file and apply the difference (a bad file is refused and
/// the running config stays).
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  sudoedit /etc/balancer/balancer.toml && balancer reload")]
pub struct ReloadArgs {}

pub fn reload(opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    let client = opts.client()?;
    Ok(report(
        opts,
        client.call::<(), ChangeResult>("POST", "/v1/reload", None),
    ))
}

/// Stop the daemon. By default the pinned XDP program keeps forwarding (a restarted daemon
/// adopts it); with --detach the program is detached and the pinned maps and state removed.
/// If no daemon answers, --detach with --config removes the pinned state directly.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  balancer stop\n  balancer stop --detach\n  \
                        balancer stop --detach --config /etc/balancer/balancer.toml   # also when the daemon is gone"
)]
pub struct StopArgs {
    /// Detach the program and remove the pinned state.
    #[arg(long)]
    detach: bool,
    /// The daemon's config (to find its pinned state when it is not running).
    #[arg(long, short)]
    config: Option<PathBuf>,
}

pub fn stop(args: StopArgs, opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    let client = opts.client()?;
    let result = client.call::<_, ChangeResult>(
        "POST",
        "/v1/stop",
        Some(&StopBody {
            detach: args.detach,
        }),
    );
    match (&result, args.detach, &args.config) {
        (Err(balancer::serve::api::client::ClientError::Connect { .. }), true, Some(path)) => {
            let config = match Config::load(path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(ExitCode::from(EXIT_INVALID));
                }
            };
            balancer::serve::daemon::detach_pinned(
                &Pins::new(&config.pin_dir),
                &config.state_file,
            )?;
            println!(
                "no daemon answered; removed the pinned state in {} (program detached)",
                config.pin_dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        _ => Ok(report(opts, result)),
    }
}
