//! What the daemon learns from the host's network stack: an interface's index, MAC, MTU and
//! addresses, and each backend's next-hop MAC from the routing and neighbour tables (rtnetlink),
//! asking the kernel to resolve a neighbour it does not know yet.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::net::MacAddr;

/// A network interface.
#[derive(Clone, Debug)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    pub mac: MacAddr,
    pub mtu: u32,
    /// Addresses with their prefix lengths.
    pub addresses: Vec<(IpAddr, u8)>,
}

impl Interface {
    /// Looks an interface up by name.
    pub fn by_name(name: &str) -> io::Result<Interface> {
        let c_name =
            CString::new(name).map_err(|_| io::Error::other("interface name contains NUL"))?;
        // SAFETY: `c_name` is a valid C string.
        let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
        if index == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no network interface named {name:?}"),
            ));
        }
        let sys = |file: &str| std::fs::read_to_string(format!("/sys/class/net/{name}/{file}"));
        let mac = sys("address")?
            .trim()
            .parse::<MacAddr>()
            .map_err(|e| io::Error::other(format!("MAC of {name}: {e}")))?;
        let mtu = sys("mtu")?
            .trim()
            .parse::<u32>()
            .map_err(|e| io::Error::other(format!("MTU of {name}: {e}")))?;
        Ok(Interface {
            name: name.to_string(),
            index,
            mac,
            mtu,
            addresses: addresses_of(name)?,
        })
    }

    /// The first IPv4 address (not link-local), if any.
    pub fn first_v4(&self) -> Option<Ipv4Addr> {
        self.addresses.iter().find_map(|(a, _)| match a {
            IpAddr::V4(v4) if !v4.is_link_local() => Some(*v4),
            _ => None,
        })
    }

    /// The first global IPv6 address (not link-local), if any.
    pub fn first_v6(&self) -> Option<Ipv6Addr> {
        self.addresses.iter().find_map(|(a, _)| match a {
            IpAddr::V6(v6) if !v6.is_unicast_link_local() => Some(*v6),
            _ => None,
        })
    }
}

fn addresses_of(name: &str) -> io::Result<Vec<(IpAddr, u8)>> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list getifaddrs returned; entries stay valid until freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        // SAFETY: ifa_name is a valid C string.
        let ifname = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if ifname.to_bytes() != name.as_bytes() || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: addresses are sockaddr_in / sockaddr_in6 according to sa_family.
        unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    let len = if ifa.ifa_netmask.is_null() {
                        32
                    } else {
                        let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                        u32::from_be(m.sin_addr.s_addr).count_ones() as u8
                    };
                    out.push((IpAddr::V4(addr), len));
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    let addr = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                    let len = if ifa.ifa_netmask.is_null() {
                        128
                    } else {
                        let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in6);
                        m.sin6_addr
                            .s6_addr
                            .iter()
                            .map(|b| b.count_ones() as u8)
                            .sum()
                    };
                    out.push((IpAddr::V6(addr), len));
                }
                _ => {}
            }
        }
    }
    // SAFETY: `head` came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Why a next-hop MAC could not be found.
#[derive(Debug, thiserror::Error)]
pub enum NeighbourError {
    #[error("netlink: {0}")]
    Netlink(#[from] io::Error),
    #[error("no route to backend {0}")]
    NoRoute(IpAddr),
    #[error(
        "backend {backend} is reached through interface index {oif}, not {interface} (index {index}); give its next-hop MAC in the config"
    )]
    WrongInterface {
        backend: IpAddr,
        oif: u32,
        interface: String,
        index: u32,
    },
    #[error(
        "neighbour {next_hop} (next hop of backend {backend}) did not resolve on {interface} within {waited:?}; is it up? (or give its MAC in the config)"
    )]
    Unresolved {
        backend: IpAddr,
        next_hop: IpAddr,
        interface: String,
        waited: Duration,
    },
}

/// How the daemon learns the next-hop MAC of a backend its config gives none for: from the
/// host's routing and neighbour tables ([`KernelNextHops`]), or by a fixed rule where there is
/// no kernel to ask (tests, [`DerivedNextHops`]).
pub trait NextHops: Send {
    fn resolve(
        &self,
        iface: &Interface,
        addresses: &[IpAddr],
        timeout: Duration,
    ) -> Result<HashMap<IpAddr, MacAddr>, NeighbourError>;
}

/// [`resolve_next_hops`] on the host's tables.
pub struct KernelNextHops;

impl NextHops for KernelNextHops {
    fn resolve(
        &self,
        iface: &Interface,
        addresses: &[IpAddr],
        timeout: Duration,
    ) -> Result<HashMap<IpAddr, MacAddr>, NeighbourError> {
        resolve_next_hops(iface, addresses, timeout)
    }
}

/// Every backend is its own next hop, its MAC `02:00` + the last four bytes of its address:
/// for a daemon on the in-memory data plane, which sends no frames.
pub struct DerivedNextHops;

impl NextHops for DerivedNextHops {
    fn resolve(
        &self,
        _iface: &Interface,
        addresses: &[IpAddr],
        _timeout: Duration,
    ) -> Result<HashMap<IpAddr, MacAddr>, NeighbourError> {
        Ok(addresses
            .iter()
            .map(|a| {
                let last: [u8; 4] = match a {
                    IpAddr::V4(v4) => v4.octets(),
                    IpAddr::V6(v6) => {
                        let o = v6.octets();
                        [o[12], o[13], o[14], o[15]]
                    }
                };
                (
                    *a,
                    MacAddr([0x02, 0x00, last[0], last[1], last[2], last[3]]),
                )
            })
            .collect())
    }
}

/// Finds the next-hop MAC of each address on `iface`: the address's own MAC when it is on the
/// link, otherwise its gateway's. Unknown neighbours are probed (one UDP datagram to the
/// discard port makes the kernel resolve them) until `timeout`.
pub fn resolve_next_hops(
    iface: &Interface,
    addresses: &[IpAddr],
    timeout: Duration,
) -> Result<HashMap<IpAddr, MacAddr>, NeighbourError> {
    let mut next_hops = HashMap::new();
    for &addr in addresses {
        let route = netlink::route_to(addr)?.ok_or(NeighbourError::NoRoute(addr))?;
        if route.oif != iface.index {
            return Err(NeighbourError::WrongInterface {
                backend: addr,
                oif: route.oif,
                interface: iface.name.clone(),
                index: iface.index,
            });
        }
        next_hops.insert(addr, route.gateway.unwrap_or(addr));
    }
    let started = Instant::now();
    let mut probed = false;
    loop {
        let table = netlink::neighbours(iface.index)?;
        let missing: Vec<IpAddr> = next_hops
            .values()
            .filter(|hop| !table.contains_key(hop))
            .copied()
            .collect();
        if missing.is_empty() {
            return Ok(next_hops
                .into_iter()
                .map(|(addr, hop)| (addr, table[&hop]))
                .collect());
        }
        if started.elapsed() >= timeout {
            let hop = missing[0];
            let backend = next_hops
                .iter()
                .find(|(_, h)| **h == hop)
                .map(|(a, _)| *a)
                .unwrap_or(hop);
            return Err(NeighbourError::Unresolved {
                backend,
                next_hop: hop,
                interface: iface.name.clone(),
                waited: started.elapsed(),
            });
        }
        if !probed || started.elapsed() > timeout / 2 {
            for hop in &missing {
                probe(*hop);
            }
            probed = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes the kernel resolve `addr` by sending it one empty datagram on the discard port.
fn probe(addr: IpAddr) {
    let bind: SocketAddr = match addr {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    if let Ok(sock) = UdpSocket::bind(bind) {
        let _ = sock.send_to(&[], (addr, 9));
    }
}

mod netlink {
    //! Minimal rtnetlink requests: one route lookup, one neighbour dump.

    use std::collections::HashMap;
    use std::io;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use crate::net::MacAddr;

    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_DUMP: u16 = 0x300;
    const RTM_NEWROUTE: u16 = 24;
    const RTM_GETROUTE: u16 = 26;
    const RTM_NEWNEIGH: u16 = 28;
    const RTM_GETNEIGH: u16 = 30;
    const RTA_DST: u16 = 1;
    const RTA_OIF: u16 = 4;
    const RTA_GATEWAY: u16 = 5;
    const NDA_DST: u16 = 1;
    const NDA_LLADDR: u16 = 2;
    /// NUD states with a usable link-layer address.
    const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

    pub struct Route {
        pub oif: u32,
        pub gateway: Option<IpAddr>,
    }

    struct Socket(std::os::fd::OwnedFd);

    impl Socket {
        fn open() -> io::Result<Socket> {
            use std::os::fd::FromRawFd;
            // SAFETY: plain socket(2) call.
            let fd = unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a new descriptor owned by nobody else.
            Ok(Socket(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
        }

        fn fd(&self) -> i32 {
            use std::os::fd::AsRawFd;
            self.0.as_raw_fd()
        }

        /// Sends one request and collects the replies' (type, payload) until done.
        fn request(
            &self,
            msg_type: u16,
            flags: u16,
            payload: &[u8],
        ) -> io::Result<Vec<(u16, Vec<u8>)>> {
            let len = 16 + payload.len();
            let mut msg = Vec::with_capacity(len);
            msg.extend_from_slice(&(len as u32).to_ne_bytes());
            msg.extend_from_slice(&msg_type.to_ne_bytes());
            msg.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
            msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
            msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
            msg.extend_from_slice(payload);
            // SAFETY: sending an initialised buffer on our socket.
            if unsafe { libc::send(self.fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
                return Err(io::Error::last_os_error());
            }
            let dump = flags & NLM_F_DUMP != 0;
            let mut out = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                // SAFETY: receiving into our buffer.
                let n = unsafe { libc::recv(self.fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                let mut rest = &buf[..n as usize];
                while rest.len() >= 16 {
                    let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
                    let ty = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
                    if len < 16 || len > rest.len() {
                        return Err(io::Error::other("truncated netlink message"));
                    }
                    let body = &rest[16..len];
                    match ty {
                        NLMSG_DONE => return Ok(out),
                        NLMSG_ERROR => {
                            let code = i32::from_ne_bytes(body[0..4].try_into().unwrap());
                            if code != 0 {
                                return Err(io::Error::from_raw_os_error(-code));
                            }
                            return Ok(out);
                        }
                        _ => out.push((ty, body.to_vec())),
                    }
                    rest = &rest[len.next_multiple_of(4).min(rest.len())..];
                }
                if !dump && !out.is_empty() {
                    return Ok(out);
                }
            }
        }
    }

    fn attributes(mut data: &[u8]) -> Vec<(u16, &[u8])> {
        let mut out = Vec::new();
        while data.len() >= 4 {
            let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
            let ty = u16::from_ne_bytes([data[2], data[3]]) & 0x3fff;
            if len < 4 || len > data.len() {
                break;
            }
            out.push((ty, &data[4..len]));
            data = &data[len.next_multiple_of(4).min(data.len())..];
        }
        out
    }

    fn ip_from(bytes: &[u8]) -> Option<IpAddr> {
        match bytes.len() {
            4 => Some(IpAddr::V4(Ipv4Addr::new(
                bytes[0], bytes[1], bytes[2], bytes[3],
            ))),
            16 => Some(IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(bytes).ok()?,
            ))),
            _ => None,
        }
    }

    /// `ip route get ADDR`: the output interface and gateway, if a route exists.
    pub fn route_to(addr: IpAddr) -> io::Result<Option<Route>> {
        let (family, bits, bytes): (u8, u8, Vec<u8>) = match addr {
            IpAddr::V4(a) => (libc::AF_INET as u8, 32, a.octets().to_vec()),
            IpAddr::V6(a) => (libc::AF_INET6 as u8, 128, a.octets().to_vec()),
        };
        let mut payload = vec![family, bits, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let attr_len = 4 + bytes.len();
        payload.extend_from_slice(&(attr_len as u16).to_ne_bytes());
        payload.extend_from_slice(&RTA_DST.to_ne_bytes());
        payload.extend_from_slice(&bytes);
        let replies = match Socket::open()?.request(RTM_GETROUTE, 0, &payload) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        for (ty, body) in replies {
            if ty != RTM_NEWROUTE || body.len() < 12 {
                continue;
            }
            let mut route = Route {
                oif: 0,
                gateway: None,
            };
            for (attr, value) in attributes(&body[12..]) {
                match attr {
                    RTA_OIF if value.len() == 4 => {
                        route.oif = u32::from_ne_bytes(value.try_into().unwrap());
                    }
                    RTA_GATEWAY => route.gateway = ip_from(value),
                    _ => {}
                }
            }
            return Ok(Some(route));
        }
        Ok(None)
    }

    /// The usable neighbour entries of an interface: address -> MAC.
    pub fn neighbours(ifindex: u32) -> io::Result<HashMap<IpAddr, MacAddr>> {
        let mut payload = vec![0u8; 12];
        payload[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        let mut out = HashMap::new();
        for (ty, body) in Socket::open()?.request(RTM_GETNEIGH, NLM_F_DUMP, &payload)? {
            if ty != RTM_NEWNEIGH || body.len() < 12 {
                continue;
            }
            let index = i32::from_ne_bytes(body[4..8].try_into().unwrap());
            let state = u16::from_ne_bytes([body[8], body[9]]);
            if index as u32 != ifindex || state & NUD_USABLE == 0 {
                continue;
            }
            let mut dst = None;
            let mut mac = None;
            for (attr, value) in attributes(&body[12..]) {
                match attr {
                    NDA_DST => dst = ip_from(value),
                    NDA_LLADDR if value.len() == 6 => {
                        mac = Some(MacAddr(value.try_into().unwrap()));
                    }
                    _ => {}
                }
            }
            if let (Some(dst), Some(mac)) = (dst, mac) {
                out.insert(dst, mac);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found() {
        let lo = Interface::by_name("lo").expect("every Linux host has lo");
        assert!(lo.index > 0);
        assert!(lo.mtu > 0);
    }

    #[test]
    fn a_missing_interface_is_a_clear_error() {
        let err = Interface::by_name("nosuchif0").unwrap_err();
        assert!(err.to_string().contains("nosuchif0"), "{err}");
    }

    #[test]
    fn routes_are_looked_up() {
        // 127.0.0.1 always routes through lo without a gateway.
        let route = netlink::route_to("127.0.0.1".parse().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(route.oif, Interface::by_name("lo").unwrap().index);
        assert!(route.gateway.is_none());
    }
}
