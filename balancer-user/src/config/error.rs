//! Configuration errors: each names the key, the value and why it is wrong.

use std::fmt;
use std::path::PathBuf;

/// A configuration error. `Invalid` names the key (as a path such as
/// `vip[0].backend[2].weight`), the offending value, and why it is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config is not valid TOML or has an unknown key: {0}")]
    Syntax(String),
    #[error("{key} = {value}: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
}

pub(crate) fn invalid(
    key: impl Into<String>,
    value: impl fmt::Display,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}
