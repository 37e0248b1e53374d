//! `balancer`: the daemon and its command-line interface.

mod cli;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(&args.log);
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(err) => {
            tracing::error!("{err:#}");
            eprintln!("error: {err:#}");
            ExitCode::from(cli::EXIT_FAILURE)
        }
    }
}
