//! Network value types of the config and the API: transport protocol, MAC address, address
//! prefix, and the prefix arithmetic the encapsulation's outer source uses.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The (address, port, protocol) of a VIP.
pub type Endpoint = (std::net::IpAddr, u16, Protocol);

/// Transport protocol of a VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            _ => Err("expected \"tcp\" or \"udp\"".into()),
        }
    }
}

/// An Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts
                .next()
                .ok_or("expected six hex bytes like 02:00:00:00:00:01")?;
            if part.len() != 2 {
                return Err("expected six hex bytes like 02:00:00:00:00:01".into());
            }
            *byte =
                u8::from_str_radix(part, 16).map_err(|_| format!("{part:?} is not a hex byte"))?;
        }
        if parts.next().is_some() {
            return Err("expected six hex bytes like 02:00:00:00:00:01".into());
        }
        Ok(MacAddr(out))
    }
}

/// An address prefix such as `172.16.0.0/16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("prefix length {l:?} is not 0..={max}"))?,
        };
        Ok(Prefix { addr, len })
    }
}

impl Prefix {
    /// Whether `ip` lies inside the prefix.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An IPv4 address as the data plane's LPM tries key it: one word of its bytes in network
/// order.
pub fn lpm_word_v4(a: &Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

/// An IPv6 address as the data plane's LPM tries key it: four words of its bytes in network
/// order.
pub fn lpm_words_v6(a: &Ipv6Addr) -> [u32; 4] {
    let o = a.octets();
    let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
    [word(0), word(4), word(8), word(12)]
}

/// The host part of `prefix` as a mask in host order over the last 32 bits (entropy bits).
pub fn entropy_mask(prefix: &Prefix) -> u32 {
    let host_bits = match prefix.addr {
        IpAddr::V4(_) => 32 - u32::from(prefix.len),
        IpAddr::V6(_) => 128 - u32::from(prefix.len),
    };
    if host_bits >= 32 {
        u32::MAX
    } else {
        (1u32 << host_bits) - 1
    }
}

/// The network part of an IPv4 prefix.
pub fn network_v4(prefix: &Prefix) -> Option<Ipv4Addr> {
    match prefix.addr {
        IpAddr::V4(a) => Some(Ipv4Addr::from(u32::from(a) & !entropy_mask(prefix))),
        IpAddr::V6(_) => None,
    }
}

/// The network part of an IPv6 prefix (at most the last 32 bits cleared).
pub fn network_v6(prefix: &Prefix) -> Option<Ipv6Addr> {
    match prefix.addr {
        IpAddr::V6(a) => Some(Ipv6Addr::from(
            u128::from(a) & !u128::from(entropy_mask(prefix)),
        )),
        IpAddr::V4(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_masks() {
        let p: Prefix = "172.16.0.0/16".parse().unwrap();
        assert_eq!(entropy_mask(&p), 0xffff);
        assert_eq!(network_v4(&p), Some(Ipv4Addr::new(172, 16, 0, 0)));
        assert!(p.contains("172.16.9.9".parse().unwrap()));
        assert!(!p.contains("172.17.0.1".parse().unwrap()));
        let fixed: Prefix = "10.0.0.2".parse().unwrap();
        assert_eq!(fixed.len, 32);
        assert_eq!(entropy_mask(&fixed), 0);
        let v6: Prefix = "fd00::5/96".parse().unwrap();
        assert_eq!(entropy_mask(&v6), u32::MAX);
        assert_eq!(network_v6(&v6), Some("fd00::".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Prefix>().is_err());
    }

    #[test]
    fn macs() {
        assert_eq!(
            "02:0a:FF:00:00:01".parse::<MacAddr>().unwrap().to_string(),
            "02:0a:ff:00:00:01"
        );
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:00:00",
            "0g:00:00:00:00:00",
            "2:00:00:00:00:00",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?} parsed");
        }
    }
}
