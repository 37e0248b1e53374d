//! The link a NAT frame leaves on. With one link (no `[nat] interface`) a frame goes back out
//! where it came in (`XDP_TX`), from the address it was sent to. With two, a client's packet
//! leaves on the backends' link and a reply on the clients' link: by `bpf_redirect`, from that
//! link's own MAC, when it came in on the other one; by `XDP_TX` when it came in there already.

use aya_ebpf::{
    bindings::{xdp_action::XDP_TX, xdp_md},
    helpers::generated::bpf_redirect,
};
use balancer_ebpf::headers::EthHdr;

use crate::maps::{NAT_LINK_STATS, NAT_LINKS};

/// Where a NAT frame goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A client's packet (or an ICMP error about a reply) going to a backend.
    Backends,
    /// A reply (or an ICMP error about a client's packet) going to a client.
    Clients,
}

/// Addresses the frame (`eth`) to `to` and sends it out on `side`'s link: the XDP action.
#[inline(always)]
pub fn send(ctx: *mut xdp_md, eth: &mut EthHdr, to: [u8; 6], side: Side) -> u32 {
    if let Some(links) = NAT_LINKS.get(0)
        && links.backend_ifindex != 0
    {
        let (ifindex, mac) = match side {
            Side::Backends => (links.backend_ifindex, links.backend_mac),
            Side::Clients => (links.client_ifindex, links.client_mac),
        };
        // SAFETY: `ctx` is the program's context.
        let ingress = unsafe { (*ctx).ingress_ifindex };
        if ingress != ifindex {
            eth.src = mac;
            eth.dst = to;
            count(side);
            // SAFETY: a helper call with plain arguments.
            return unsafe { bpf_redirect(ifindex, 0) } as u32;
        }
    }
    eth.src = eth.dst;
    eth.dst = to;
    XDP_TX
}

#[inline(always)]
fn count(side: Side) {
    if let Some(stats) = NAT_LINK_STATS.get_ptr_mut(0) {
        // SAFETY: this CPU's entry.
        let stats = unsafe { &mut *stats };
        match side {
            Side::Backends => stats.to_backends += 1,
            Side::Clients => stats.to_clients += 1,
        }
    }
}
