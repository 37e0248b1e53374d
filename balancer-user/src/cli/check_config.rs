use std::path::PathBuf;
use std::process::ExitCode;

use balancer::base::config::Config;

use super::EXIT_INVALID;

/// Validate a config file without touching the system, and summarise it. Exits 0 when the
/// config is valid and 2 when it is not, naming the offending key and value.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  balancer check-config /etc/balancer/balancer.toml && echo ok")]
pub struct CheckConfigArgs {
    /// Path of the TOML config file.
    file: PathBuf,
}

pub fn run(args: CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let config = match Config::load(&args.file) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("{}: invalid: {err}", args.file.display());
            return Ok(ExitCode::from(EXIT_INVALID));
        }
    };
    let backends: usize = config.vips.iter().map(|v| v.backends.len()).sum();
    println!(
        "{}: valid: interface {} ({} mode), {} VIPs, {} backends",
        args.file.display(),
        config.interface,
        config.attach_mode,
        config.vips.len(),
        backends
    );
    for line in balancer::base::config::service::describe(&config.vips) {
        println!("  {line}");
    }
    for vip in &config.vips {
        println!(
            "  {:<20} {}/{} {} table {} backends {}",
            vip.name,
            std::net::SocketAddr::new(vip.address, vip.port),
            vip.protocol,
            vip.forwarding,
            vip.table_size,
            vip.backends
                .iter()
                .map(|b| format!("{}(w{})", b.address, b.weight))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
