//! What the daemon learns from the host's network stack: an interface's index, MAC, MTU and
//! addresses, and each backend's next-hop MAC from the routing and neighbour tables (rtnetlink),
//! asking the kernel to resolve a neighbour it does not know yet.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use balancer_common::maps::NatLinks;

use crate::base::net::MacAddr;

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

/// The interfaces the program runs on: the clients' (`interface`) and, when `[nat] interface`
/// names another, the one `nat` VIPs' backends are on and reply on.
#[derive(Clone, Debug)]
pub struct Links {
    pub clients: Interface,
    pub nat_backends: Option<Interface>,
}

impl Links {
    /// One link for everything.
    pub fn one(iface: Interface) -> Links {
        Links {
            clients: iface,
            nat_backends: None,
        }
    }

    /// The interface the backends of a VIP are reached on (`nat`: the VIP forwards by NAT).
    pub fn of_backends(&self, nat: bool) -> &Interface {
        match &self.nat_backends {
            Some(link) if nat => link,
            _ => &self.clients,
        }
    }

    /// What the data plane's `NAT_LINKS` holds: both links, or all zero for one.
    pub fn nat_links(&self) -> NatLinks {
        match &self.nat_backends {
            Some(backends) => NatLinks {
                client_ifindex: self.clients.index,
                backend_ifindex: backends.index,
                client_mac: self.clients.mac.0,
                backend_mac: backends.mac.0,
            },
            None => NatLinks::default(),
        }
    }

    /// The next-hop MACs of `wanted` (address, whether it serves a `nat` VIP), each resolved
    /// on the link it is reached on.
    pub fn resolve(
        &self,
        next_hops: &dyn NextHops,
        wanted: &[(IpAddr, bool)],
        timeout: Duration,
    ) -> Result<HashMap<IpAddr, MacAddr>, NeighbourError> {
        let mut macs = HashMap::new();
        for nat in [false, true] {
            let addresses: Vec<IpAddr> = wanted
                .iter()
                .filter(|(_, n)| *n == nat)
                .map(|(a, _)| *a)
                .collect();
            if !addresses.is_empty() {
                macs.extend(next_hops.resolve(self.of_backends(nat), &addresses, timeout)?);
            }
        }
        Ok(macs)
    }
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
    //! Two rtnetlink requests — one route lookup, one neighbour dump — built and parsed by
    //! the maintained `netlink-packet-route` crate over a `netlink-sys` socket.

    use std::collections::HashMap;
    use std::io;
    use std::net::IpAddr;

    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_route::neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
    };
    use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
    use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

    use crate::base::net::MacAddr;

    pub struct Route {
        pub oif: u32,
        pub gateway: Option<IpAddr>,
    }

    /// Sends one request and collects the answers until the kernel says it is done (a dump)
    /// or has answered (a lookup).
    fn request(message: RouteNetlinkMessage, dump: bool) -> io::Result<Vec<RouteNetlinkMessage>> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        header.sequence_number = 1;
        let mut request = NetlinkMessage::new(header, NetlinkPayload::from(message));
        request.finalize();
        let mut buf = vec![0; request.buffer_len()];
        request.serialize(&mut buf);
        socket.send(&buf, 0)?;
        let mut out = Vec::new();
        let mut answer = vec![0u8; 64 * 1024];
        loop {
            let n = socket.recv(&mut &mut answer[..], 0)?;
            let mut offset = 0;
            while offset < n {
                let message =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer[offset..n])
                        .map_err(|e| {
                            io::Error::other(format!("an rtnetlink answer did not parse: {e}"))
                        })?;
                let len = message.header.length as usize;
                match message.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                    NetlinkPayload::Error(_) => return Ok(out),
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    _ => {}
                }
                if len == 0 {
                    break;
                }
                offset += len.next_multiple_of(4);
            }
            if !dump && !out.is_empty() {
                return Ok(out);
            }
        }
    }

    fn ip_of(address: &RouteAddress) -> Option<IpAddr> {
        match address {
            RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
            RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
            _ => None,
        }
    }

    /// `ip route get ADDR`: the output interface and gateway, if a route exists.
    pub fn route_to(addr: IpAddr) -> io::Result<Option<Route>> {
        let mut message = RouteMessage::default();
        (
            message.header.address_family,
            message.header.destination_prefix_length,
        ) = match addr {
            IpAddr::V4(_) => (AddressFamily::Inet, 32),
            IpAddr::V6(_) => (AddressFamily::Inet6, 128),
        };
        message
            .attributes
            .push(RouteAttribute::Destination(RouteAddress::from(addr)));
        let answers = match request(RouteNetlinkMessage::GetRoute(message), false) {
            Ok(a) => a,
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
        for answer in answers {
            let RouteNetlinkMessage::NewRoute(route) = answer else {
                continue;
            };
            let mut found = Route {
                oif: 0,
                gateway: None,
            };
            for attribute in &route.attributes {
                match attribute {
                    RouteAttribute::Oif(oif) => found.oif = *oif,
                    RouteAttribute::Gateway(g) => found.gateway = ip_of(g),
                    _ => {}
                }
            }
            return Ok(Some(found));
        }
        Ok(None)
    }

    /// Neighbour states with a usable link-layer address.
    fn usable(state: NeighbourState) -> bool {
        matches!(
            state,
            NeighbourState::Reachable
                | NeighbourState::Stale
                | NeighbourState::Delay
                | NeighbourState::Probe
                | NeighbourState::Noarp
                | NeighbourState::Permanent
        )
    }

    /// The usable neighbour entries of an interface: address -> MAC.
    pub fn neighbours(ifindex: u32) -> io::Result<HashMap<IpAddr, MacAddr>> {
        let mut message = NeighbourMessage::default();
        message.header.ifindex = ifindex;
        let mut out = HashMap::new();
        for answer in request(RouteNetlinkMessage::GetNeighbour(message), true)? {
            let RouteNetlinkMessage::NewNeighbour(entry) = answer else {
                continue;
            };
            if entry.header.ifindex != ifindex || !usable(entry.header.state) {
                continue;
            }
            let mut dst = None;
            let mut mac = None;
            for attribute in &entry.attributes {
                match attribute {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                        dst = Some(IpAddr::V4(*a))
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                        dst = Some(IpAddr::V6(*a))
                    }
                    NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => {
                        mac = <[u8; 6]>::try_from(l.as_slice()).ok().map(MacAddr);
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
mod tests;
