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
