//! Configuration errors: each names the key, the value and why it is wrong.

use std::fmt;
use std::path::PathBuf;

/// A configuration error. `Invalid` names the key (as a path such as
/// `vip[0].backend[2].weight`), the offending value, and why it is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The reason is in the message (shown alone by `check-config` and the API), so it is not
    /// also a `source` that a chain of causes would print a second time.
    #[error("cannot read config file {path}: {reason}")]
    Read {
        path: PathBuf,
        reason: std::io::Error,
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
