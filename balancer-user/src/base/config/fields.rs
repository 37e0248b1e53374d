//! Readers of single config values (required keys, parsed fields, numbers in a range), each
//! failing with an error that names the key.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use super::error::{ConfigError, invalid};

pub(super) fn required<T>(value: Option<T>, key: &str) -> Result<T, ConfigError> {
    value.ok_or_else(|| invalid(key, "(missing)", "this key is required"))
}

pub(super) fn parse_field<T: FromStr<Err = String>>(
    text: &str,
    key: &str,
) -> Result<T, ConfigError> {
    text.parse()
        .map_err(|reason| invalid(key, format!("{text:?}"), reason))
}

pub(super) fn parse_ip(text: &str, key: &str) -> Result<IpAddr, ConfigError> {
    text.parse()
        .map_err(|_| invalid(key, format!("{text:?}"), "not an IPv4 or IPv6 address"))
}

pub(super) fn parse_socket_addr(text: &str, key: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| {
        invalid(
            key,
            format!("{text:?}"),
            "not an address and port like 127.0.0.1:9180 or [::1]:9180",
        )
    })
}

pub(super) fn int_in<T: TryFrom<i64>>(
    value: i64,
    min: i64,
    max: i64,
    key: &str,
) -> Result<T, ConfigError> {
    if value < min || value > max {
        return Err(invalid(
            key,
            value,
            format!("must be between {min} and {max}"),
        ));
    }
    T::try_from(value).map_err(|_| invalid(key, value, "out of range"))
}

pub(super) fn float_in(value: f64, min: f64, max: f64, key: &str) -> Result<f64, ConfigError> {
    if !value.is_finite() || value < min || value > max {
        return Err(invalid(
            key,
            value,
            format!("must be between {min} and {max}"),
        ));
    }
    Ok(value)
}

/// An absolute path (a certificate, a key, a token file).
pub(super) fn absolute_path(value: String, key: &str) -> Result<std::path::PathBuf, ConfigError> {
    if value.starts_with('/') && !value.contains("..") {
        Ok(value.into())
    } else {
        Err(invalid(
            key,
            format!("{value:?}"),
            "must be an absolute path without '..'",
        ))
    }
}

/// [`absolute_path`] of an optional value.
pub(super) fn optional_path(
    value: Option<String>,
    key: &str,
) -> Result<Option<std::path::PathBuf>, ConfigError> {
    value.map(|v| absolute_path(v, key)).transpose()
}

/// A certificate and its key, both or neither (`cert_key`, `key_key`: their config keys).
pub(super) fn cert_and_key(
    cert: Option<std::path::PathBuf>,
    key: Option<std::path::PathBuf>,
    cert_key: &str,
    key_key: &str,
) -> Result<Option<(std::path::PathBuf, std::path::PathBuf)>, ConfigError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (Some(_), None) => Err(invalid(
            key_key,
            "(absent)",
            format!("{cert_key} needs the key of that certificate"),
        )),
        (None, Some(_)) => Err(invalid(
            cert_key,
            "(absent)",
            format!("{key_key} needs the certificate it belongs to"),
        )),
    }
}

/// Checks that `name` (the value of `key`) can be a network interface's name.
pub(super) fn check_interface_name(name: &str, key: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > 15 || name.contains(['/', ' ']) {
        return Err(invalid(
            key,
            format!("{name:?}"),
            "not a network interface name (1-15 characters, no '/' or spaces)",
        ));
    }
    Ok(())
}
