//! Addresses as the data plane stores them.
//!
//! An address is four 32-bit words holding the packet's bytes in packet (network) order: the
//! XDP program copies them straight out of the header without byte swapping. An IPv4 address
//! occupies word 0 and leaves words 1..3 zero; the family is carried beside it.

/// Address family tag stored in map keys and values.
pub const FAMILY_V4: u8 = 4;
/// Address family tag stored in map keys and values.
pub const FAMILY_V6: u8 = 6;

/// Four words of address bytes in network order (see the module docs).
pub type RawAddr = [u32; 4];

/// The first `len` bits of an address (the rest zero): its network of that prefix length. The
/// words hold network-order bytes, so each word's mask is swapped to them. For IPv4 (word 0
/// only) a length of 32 or more keeps the whole address.
#[inline(always)]
pub fn prefix_of(raw: &RawAddr, len: u32) -> RawAddr {
    let mut out = [0u32; 4];
    let mut i = 0;
    while i < 4 {
        let start = 32 * i as u32;
        let mask = if len >= start + 32 {
            u32::MAX
        } else if len <= start {
            0
        } else {
            u32::MAX << (32 - (len - start))
        };
        out[i] = raw[i] & mask.to_be();
        i += 1;
    }
    out
}

/// Converts an address to the data plane's representation and family tag.
#[cfg(feature = "std")]
pub fn raw_from_ip(ip: std::net::IpAddr) -> (RawAddr, u8) {
    match ip {
        std::net::IpAddr::V4(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], FAMILY_V4),
        std::net::IpAddr::V6(v6) => {
            let o = v6.octets();
            let mut words = [0u32; 4];
            for (i, word) in words.iter_mut().enumerate() {
                *word = u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]]);
            }
            (words, FAMILY_V6)
        }
    }
}

/// Converts the data plane's representation back to an address; `None` for an unknown family.
#[cfg(feature = "std")]
pub fn ip_from_raw(raw: &RawAddr, family: u8) -> Option<std::net::IpAddr> {
    match family {
        FAMILY_V4 => Some(std::net::Ipv4Addr::from(raw[0].to_ne_bytes()).into()),
        FAMILY_V6 => {
            let mut o = [0u8; 16];
            for (i, word) in raw.iter().enumerate() {
                o[4 * i..4 * i + 4].copy_from_slice(&word.to_ne_bytes());
            }
            Some(std::net::Ipv6Addr::from(o).into())
        }
        _ => None,
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn prefixes_keep_the_network_bits() {
        let cases = [
            ("10.1.2.3", 24, "10.1.2.0"),
            ("10.1.2.3", 32, "10.1.2.3"),
            ("10.1.2.3", 20, "10.1.0.0"),
            ("10.1.255.3", 20, "10.1.240.0"),
            ("10.1.2.3", 0, "0.0.0.0"),
            ("2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::"),
            ("2001:db8:1:2:3:4:5:6", 48, "2001:db8:1::"),
            ("2001:db8:1:2:3:4:5:6", 56, "2001:db8:1::"),
            ("2001:db8:1:2ff:3:4:5:6", 56, "2001:db8:1:200::"),
            ("2001:db8:1:2:3:4:5:6", 128, "2001:db8:1:2:3:4:5:6"),
            ("2001:db8:1:2:3:4:5:6", 100, "2001:db8:1:2:3:4:0:0"),
        ];
        for (addr, len, net) in cases {
            let (raw, family) = raw_from_ip(addr.parse().unwrap());
            let got = ip_from_raw(&prefix_of(&raw, len), family).unwrap();
            assert_eq!(got, net.parse::<IpAddr>().unwrap(), "{addr}/{len}");
        }
    }

    #[test]
    fn round_trips_both_families() {
        for text in [
            "10.1.2.3",
            "0.0.0.0",
            "2001:db8::1",
            "::ffff:1.2.3.4",
            "fe80::1:2:3:4",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            let (raw, family) = raw_from_ip(ip);
            assert_eq!(ip_from_raw(&raw, family), Some(ip), "round trip of {text}");
        }
    }

    #[test]
    fn ipv4_bytes_sit_in_packet_order_in_word_zero() {
        let (raw, family) = raw_from_ip("1.2.3.4".parse().unwrap());
        assert_eq!(family, FAMILY_V4);
        assert_eq!(raw[0].to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!(&raw[1..], &[0, 0, 0]);
    }
}
