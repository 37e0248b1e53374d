//! How the CLI reaches the daemon, and how API answers become output and exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use balancer::base::config::DEFAULT_API_SOCKET;
use balancer::serve::api::client::{Client, ClientError, ClientTls, Endpoint};

use super::{EXIT_CONFLICT, EXIT_FAILURE, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_UNAUTHORIZED};

/// Options of the commands that talk to the daemon, accepted before or after the subcommand
/// (`run` takes its socket from its config, `decap` and `check-config` talk to no daemon).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Daemon client options (ignored by run, decap and check-config)")]
pub struct ClientArgs {
    /// The daemon's control socket.
    #[arg(long, global = true, env = "BALANCER_SOCKET", default_value = DEFAULT_API_SOCKET)]
    pub socket: PathBuf,
    /// Talk to the daemon's TCP listener (host:port) instead of the socket; needs --token-file.
    #[arg(long, global = true)]
    pub connect: Option<String>,
    /// File holding the bearer token for --connect.
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    /// Use TLS to the --connect listener (its certificate checked against the system's roots,
    /// or --ca; the name checked is the host of --connect). Ignored for the socket.
    #[arg(long, global = true)]
    pub tls: bool,
    /// The CA (PEM) of the daemon's certificate; implies --tls.
    #[arg(long, global = true)]
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM) for a listener that wants one (api.client_ca); with --key.
    #[arg(long, global = true)]
    pub cert: Option<PathBuf>,
    /// The key (PEM) of --cert.
    #[arg(long, global = true)]
    pub key: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

impl ClientArgs {
    pub fn client(&self) -> anyhow::Result<Client> {
        // Checked here rather than by clap, whose `requires` does not see a global option
        // given after the subcommand.
        Ok(Client::new(match (&self.connect, &self.token_file) {
            (Some(addr), Some(file)) => Endpoint::Tcp {
                addr: addr.clone(),
                token: balancer::serve::api::server::read_token(file)?,
                tls: self.tls_settings(),
            },
            (Some(_), None) => anyhow::bail!(self.check().unwrap_err()),
            _ => Endpoint::Unix(self.socket.clone()),
        }))
    }

    /// TLS to the TCP listener, when asked for.
    fn tls_settings(&self) -> Option<ClientTls> {
        (self.tls || self.ca.is_some() || self.cert.is_some()).then(|| ClientTls {
            ca: self.ca.clone(),
            identity: self.cert.clone().zip(self.key.clone()),
        })
    }

    /// Refuses options that do not go together (`--connect` without `--token-file`, `--cert`
    /// without `--key`).
    pub fn check(&self) -> Result<(), String> {
        if let (Some(addr), None) = (&self.connect, &self.token_file) {
            return Err(format!(
                "--connect {addr} needs --token-file (the API's bearer token)"
            ));
        }
        match (&self.cert, &self.key) {
            (Some(_), None) => Err("--cert needs --key (the certificate's key)".into()),
            (None, Some(_)) => Err("--key needs --cert (the certificate it belongs to)".into()),
            _ => Ok(()),
        }
    }
}

/// The exit code for a failed request, after printing the error.
pub fn fail(err: &ClientError) -> ExitCode {
    eprintln!("error: {err}");
    ExitCode::from(match err.status() {
        Some(400 | 413 | 422) => EXIT_INVALID,
        Some(404) => EXIT_NOT_FOUND,
        Some(409) => EXIT_CONFLICT,
        Some(401) => EXIT_UNAUTHORIZED,
        _ => EXIT_FAILURE,
    })
}

/// Prints a value as pretty JSON.
pub fn print_json<T: serde::Serialize>(value: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// Formats a rate with SI prefixes.
pub fn si(value: f64) -> String {
    let (v, unit) = if value >= 1e9 {
        (value / 1e9, "G")
    } else if value >= 1e6 {
        (value / 1e6, "M")
    } else if value >= 1e3 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    format!("{v:.1}{unit}")
}
