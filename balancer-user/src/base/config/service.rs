//! Services: one `[[vip]]` block that lists several ports (`ports`), both protocols
//! (`protocols`) or several addresses (`addresses`, e.g. an IPv4 and an IPv6 one) with one
//! backend list. It is expanded into one VIP per (address, protocol, port), which share every
//! other setting and remember the service they came from; the written config file folds them
//! back into one block while they still agree.
//!
//! A member's name is the service's with a suffix for each list of more than one value:
//! `-PORT`, `-PROTOCOL`, and `-v4`/`-v6` for one IPv4 and one IPv6 address (`-ADDRESS`
//! otherwise). `web` on ports 80 and 443 over TCP and UDP is `web-80-tcp`, `web-80-udp`,
//! `web-443-tcp` and `web-443-udp`.

use std::collections::HashSet;
use std::net::IpAddr;

use super::error::{ConfigError, invalid};
use super::raw::RawVip;
use super::vip::{VipConfig, valid_name, validate_vip};

/// Whether a raw block lists several endpoints (any of `addresses`, `ports`, `protocols`).
pub fn is_service(raw: &RawVip) -> bool {
    !raw.addresses.is_empty() || !raw.ports.is_empty() || !raw.protocols.is_empty()
}

/// One list of a service: the plural key, or the singular one, never both; no repeats.
fn values<T: Clone + PartialEq + std::fmt::Debug>(
    single: Option<T>,
    plural: &[T],
    keys: (&str, &str),
    label: &str,
) -> Result<Vec<Option<T>>, ConfigError> {
    let (one, many) = keys;
    if single.is_some() && !plural.is_empty() {
        return Err(invalid(
            format!("{label}.{many}"),
            format!("{plural:?}"),
            format!("set {one} or {many}, not both"),
        ));
    }
    for (i, v) in plural.iter().enumerate() {
        if plural[..i].contains(v) {
            return Err(invalid(
                format!("{label}.{many}"),
                format!("{plural:?}"),
                format!("{v:?} is listed twice"),
            ));
        }
    }
    Ok(if plural.is_empty() {
        vec![single]
    } else {
        plural.iter().cloned().map(Some).collect()
    })
}

/// The suffix naming an address among the service's `addresses`.
fn address_suffix(address: &str, all: &[Option<String>]) -> String {
    let family = |a: &str| a.parse::<IpAddr>().map(|ip| ip.is_ipv4()).ok();
    let families: Vec<Option<bool>> = all.iter().map(|a| family(a.as_deref()?)).collect();
    match (all.len(), family(address)) {
        (2, Some(v4)) if families.contains(&Some(true)) && families.contains(&Some(false)) => {
            (if v4 { "v4" } else { "v6" }).to_string()
        }
        _ => address.to_string(),
    }
}

/// Expands a raw `[[vip]]` block into the raw VIPs it stands for: itself when it lists one
/// endpoint, else one per (address, protocol, port) in that order, each named as the module
/// says and marked with the service's name. `label` names the block in errors (`vip[2]`).
pub fn expand(raw: RawVip, label: &str) -> Result<Vec<RawVip>, ConfigError> {
    if !is_service(&raw) {
        return Ok(vec![raw]);
    }
    let addresses = values(
        raw.address.clone(),
        &raw.addresses,
        ("address", "addresses"),
        label,
    )?;
    let ports = values(raw.port, &raw.ports, ("port", "ports"), label)?;
    let protocols = values(
        raw.protocol.clone(),
        &raw.protocols,
        ("protocol", "protocols"),
        label,
    )?;
    let Some(service) = raw.name.clone() else {
        return Err(invalid(
            format!("{label}.name"),
            "(none)",
            "a service (several addresses, ports or protocols) needs a name: its VIPs are named after it",
        ));
    };
    let mut members = Vec::with_capacity(addresses.len() * ports.len() * protocols.len());
    for address in &addresses {
        for protocol in &protocols {
            for port in &ports {
                let mut name = service.clone();
                if ports.len() > 1 {
                    name.push_str(&format!("-{}", port.unwrap_or_default()));
                }
                if protocols.len() > 1 {
                    name.push_str(&format!("-{}", protocol.as_deref().unwrap_or_default()));
                }
                if addresses.len() > 1 {
                    let a = address.as_deref().unwrap_or_default();
                    name.push_str(&format!("-{}", address_suffix(a, &addresses)));
                }
                if !valid_name(&name) {
                    return Err(invalid(
                        format!("{label}.name"),
                        format!("{service:?}"),
                        format!(
                            "its VIP {name:?} is not a valid name (1-64 letters, digits, '-', '_', '.' or ':')"
                        ),
                    ));
                }
                members.push(RawVip {
                    name: Some(name),
                    address: address.clone(),
                    port: *port,
                    protocol: protocol.clone(),
                    addresses: Vec::new(),
                    ports: Vec::new(),
                    protocols: Vec::new(),
                    service: Some(service.clone()),
                    ..raw.clone()
                });
            }
        }
    }
    Ok(members)
}

/// The VIPs in their file form, each service folded back into one block where its members
/// still agree on everything but their endpoints (and health ports that follow them); a
/// service whose members were changed apart (say, a backend drained in one of them) is
/// written as its members, each a VIP of its own.
pub fn fold(vips: &[VipConfig]) -> Vec<RawVip> {
    let mut out = Vec::new();
    for group in groups(vips) {
        match group {
            Group::Plain(vip) => out.push(vip.to_raw()),
            Group::Service(service, members) => match folded(service, &members) {
                Some(block) => out.push(block),
                None => out.extend(members.iter().map(|m| RawVip {
                    service: None,
                    ..m.to_raw()
                })),
            },
        }
    }
    out
}

/// A VIP of its own, or a service and its members.
enum Group<'a> {
    Plain(&'a VipConfig),
    Service(&'a str, Vec<&'a VipConfig>),
}

/// The VIPs grouped by service, in the order of each group's first VIP.
fn groups(vips: &[VipConfig]) -> Vec<Group<'_>> {
    let mut out = Vec::new();
    let mut done: HashSet<&str> = HashSet::new();
    for vip in vips {
        match vip.service.as_deref() {
            None => out.push(Group::Plain(vip)),
            Some(service) if done.insert(service) => out.push(Group::Service(
                service,
                vips.iter()
                    .filter(|v| v.service.as_deref() == Some(service))
                    .collect(),
            )),
            Some(_) => {}
        }
    }
    out
}

/// The one block that expands to exactly `members`, if there is one.
fn folded(service: &str, members: &[&VipConfig]) -> Option<RawVip> {
    fn distinct<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
        let mut out: Vec<T> = Vec::new();
        for item in items {
            if !out.contains(&item) {
                out.push(item);
            }
        }
        out
    }
    let first = members.first()?;
    let addresses = distinct(members.iter().map(|m| m.address.to_string()));
    let ports = distinct(members.iter().map(|m| i64::from(m.port)));
    let protocols = distinct(members.iter().map(|m| m.protocol.to_string()));
    let mut block = first.to_raw();
    block.name = Some(service.to_string());
    block.service = None;
    (block.address, block.addresses) = one_or_many(addresses);
    (block.port, block.ports) = one_or_many(ports);
    (block.protocol, block.protocols) = one_or_many(protocols);
    if let Some(health) = block.health.as_mut() {
        // The health port follows each member's own port unless all check one port.
        let own = members.iter().all(|m| m.health.port == m.port);
        let shared = members.iter().all(|m| m.health.port == first.health.port);
        health.port = match (own, shared) {
            (true, _) => None,
            (false, true) => Some(first.health.port.into()),
            (false, false) => return None,
        };
    }
    let expanded = expand(block.clone(), "service").ok()?;
    if expanded.len() != members.len() {
        return None;
    }
    let plain = |raw: RawVip| RawVip {
        service: None,
        ..raw
    };
    for (raw, member) in expanded.into_iter().zip(members) {
        if plain(validate_vip(raw, "service").ok()?.to_raw()) != plain(member.to_raw()) {
            return None;
        }
    }
    Some(block)
}

/// A list of one value as the singular key, of several as the plural one.
pub fn one_or_many<T>(mut items: Vec<T>) -> (Option<T>, Vec<T>) {
    if items.len() == 1 {
        (items.pop(), Vec::new())
    } else {
        (None, items)
    }
}

/// What each service block expands to, for `check-config`: "service web expands to 2 VIPs:
/// web-80, web-443".
pub fn describe(vips: &[VipConfig]) -> Vec<String> {
    groups(vips)
        .into_iter()
        .filter_map(|group| match group {
            Group::Service(service, members) => Some(format!(
                "service {service} expands to {} VIPs: {}",
                members.len(),
                members
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Group::Plain(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::base::config::Config;
    use crate::base::net::Protocol;

    const SERVICE: &str = r#"
interface = "eth0"

[[vip]]
name = "api"
addresses = ["10.100.0.1", "2001:db8::1"]
ports = [80, 443]
protocols = ["tcp", "udp"]
health = { check = "tcp" }

  [[vip.backend]]
  address = "10.0.0.11"
  weight = 2

  [[vip.backend]]
  address = "10.0.0.12"

[[vip]]
name = "dns"
address = "10.100.0.2"
port = 53
protocol = "udp"

  [[vip.backend]]
  address = "10.0.0.11"
"#;

    fn names(c: &Config) -> Vec<&str> {
        c.vips.iter().map(|v| v.name.as_str()).collect()
    }

    #[test]
    fn a_service_expands_to_one_vip_per_endpoint() {
        let c = Config::parse(SERVICE).unwrap();
        assert_eq!(
            names(&c),
            [
                "api-80-tcp-v4",
                "api-443-tcp-v4",
                "api-80-udp-v4",
                "api-443-udp-v4",
                "api-80-tcp-v6",
                "api-443-tcp-v6",
                "api-80-udp-v6",
                "api-443-udp-v6",
                "dns",
            ]
        );
        let v6_udp_443 = &c.vips[7];
        assert_eq!(
            v6_udp_443.address,
            "2001:db8::1".parse::<std::net::IpAddr>().unwrap()
        );
        assert_eq!((v6_udp_443.port, v6_udp_443.protocol), (443, Protocol::Udp));
        // Each member checks its own port; all share the backends and settings.
        assert_eq!(v6_udp_443.health.port, 443);
        assert_eq!(c.vips[0].health.port, 80);
        for vip in &c.vips[..8] {
            assert_eq!(vip.service.as_deref(), Some("api"));
            assert_eq!(vip.backends, c.vips[0].backends);
        }
        assert_eq!(c.vips[8].service, None);
        assert_eq!(
            super::describe(&c.vips),
            [
                "service api expands to 8 VIPs: api-80-tcp-v4, api-443-tcp-v4, api-80-udp-v4, \
              api-443-udp-v4, api-80-tcp-v6, api-443-tcp-v6, api-80-udp-v6, api-443-udp-v6"
            ]
        );
        // Only the lists of more than one value name a member.
        let c = Config::parse(
            "interface = \"eth0\"\n[[vip]]\nname = \"web\"\naddress = \"10.100.0.1\"\n\
             ports = [80, 8080]\n",
        )
        .unwrap();
        assert_eq!(names(&c), ["web-80", "web-8080"]);
        let c = Config::parse(
            "interface = \"eth0\"\n[[vip]]\nname = \"two\"\naddresses = [\"10.100.0.1\", \
             \"10.100.0.2\"]\nport = 80\n",
        )
        .unwrap();
        assert_eq!(names(&c), ["two-10.100.0.1", "two-10.100.0.2"]);
    }

    #[test]
    fn the_file_keeps_a_service_as_one_block_while_its_members_agree() {
        let c = Config::parse(SERVICE).unwrap();
        let text = c.to_toml();
        assert_eq!(text.matches("[[vip]]").count(), 2, "{text}");
        assert!(text.contains("ports = [80, 443]"), "{text}");
        assert!(!text.contains("service"), "{text}");
        let again = Config::parse(&text).unwrap();
        assert_eq!(again.vips, c.vips);

        // A health port of its own is kept; so is one shared by every member.
        let shared = SERVICE.replace("{ check = \"tcp\" }", "{ check = \"tcp\", port = 9000 }");
        let c = Config::parse(&shared).unwrap();
        assert!(c.vips[..8].iter().all(|v| v.health.port == 9000));
        let again = Config::parse(&c.to_toml()).unwrap();
        assert_eq!(again.vips, c.vips);
        assert_eq!(c.to_toml().matches("[[vip]]").count(), 2);

        // Changed apart (a backend drained in one member only), the members are written one
        // by one, and read back the same.
        let mut c = Config::parse(SERVICE).unwrap();
        c.vips[1].backends[0].drained = true;
        let text = c.to_toml();
        assert_eq!(text.matches("[[vip]]").count(), 9, "{text}");
        let again = Config::parse(&text).unwrap();
        assert_eq!(names(&again), names(&c));
        assert!(again.vips[1].backends[0].drained && !again.vips[0].backends[0].drained);
        // The same change in every member keeps the block.
        let mut c = Config::parse(SERVICE).unwrap();
        for vip in &mut c.vips[..8] {
            vip.backends[0].drained = true;
        }
        let text = c.to_toml();
        assert_eq!(text.matches("[[vip]]").count(), 2, "{text}");
        assert_eq!(Config::parse(&text).unwrap().vips, c.vips);
    }

    #[test]
    fn service_errors_name_the_key() {
        let err = |text: &str| Config::parse(text).unwrap_err().to_string();
        let base = "interface = \"eth0\"\n[[vip]]\n";
        assert!(
            err(&format!(
                "{base}name = \"a\"\naddress = \"10.0.0.1\"\nport = 80\nports = [81]\n"
            ))
            .contains("vip[0].ports = [81]: set port or ports, not both")
        );
        assert!(
            err(&format!(
                "{base}name = \"a\"\naddress = \"10.0.0.1\"\nports = [80, 80]\n"
            ))
            .contains("80 is listed twice")
        );
        assert!(
            err(&format!("{base}address = \"10.0.0.1\"\nports = [80, 81]\n"))
                .contains("vip[0].name = (none): a service")
        );
        assert!(
            err(&format!(
                "{base}name = \"a\"\naddress = \"10.0.0.1\"\nports = [80, 0]\n"
            ))
            .contains("vip[0].port = 0")
        );
        assert!(
            err(&format!(
                "{base}name = \"a\"\naddress = \"10.0.0.1\"\nport = 80\nprotocols = [\"tcp\", \"sctp\"]\n"
            ))
            .contains("vip[0].protocol = \"sctp\"")
        );
        assert!(
            err(&format!(
                "{base}name = \"a\"\naddress = \"10.0.0.1\"\nport = 80\nservice = \"x\"\n"
            ))
            .contains("vip[0].service = \"x\": is set by the daemon")
        );
        // Two members on one endpoint, or a member on another VIP's.
        assert!(
            err(&format!(
                "{base}name = \"a\"\naddresses = [\"10.0.0.1\"]\nports = [80, 81]\n\
                 [[vip]]\nname = \"b\"\naddress = \"10.0.0.1\"\nport = 81\n"
            ))
            .contains("the same address, port and protocol")
        );
        assert!(
            err(&format!(
                "{base}name = \"{}\"\naddress = \"10.0.0.1\"\nports = [80, 81]\n",
                "n".repeat(62)
            ))
            .contains("is not a valid name")
        );
    }
}
