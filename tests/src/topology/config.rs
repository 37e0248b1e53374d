//! The rack's balancer config: its usual VIPs over the rack's backends, from the daemon's typed config values.

use super::*;

/// A balancer config for the rack: HTTP, echo (TCP) and UDP VIPs on both families
/// (`http4`, `echo4`, `udp4`, `http6`, ...), each with every backend, forwarded by
/// `forwarding` and attached in `mode`; the rack's pins, state file and socket.
pub fn rack_config(topo: &Topology, forwarding: &str, mode: AttachMode) -> RawConfig {
    let weights = vec![Some(1); topo.backends.len()];
    rack_config_weighted(topo, forwarding, mode, &weights)
}

/// Like [`rack_config`] with backend `i` given weight `weights[i]`, or left out when `None`.
pub fn rack_config_weighted(
    topo: &Topology,
    forwarding: &str,
    mode: AttachMode,
    weights: &[Option<u32>],
) -> RawConfig {
    let mut vips = Vec::new();
    for (address, family) in [(IpAddr::from(VIP4), 4), (IpAddr::from(VIP6), 6)] {
        for (port, protocol, service) in [
            (HTTP_PORT, "tcp", "http"),
            (ECHO_PORT, "tcp", "echo"),
            (UDP_PORT, "udp", "udp"),
        ] {
            let mut v = vip(&format!("{service}{family}"), address, port);
            v.protocol = Some(protocol.into());
            // "snat": NAT with source NAT from the balancer's interface address.
            if forwarding == "snat" {
                v.forwarding = Some("nat".into());
                v.nat_source = vec!["interface".into()];
            } else {
                v.forwarding = Some(forwarding.into());
            }
            v.gue_port = Some(GUE_PORT.into());
            v.backend = weights
                .iter()
                .enumerate()
                .take(topo.backends.len())
                .filter_map(|(i, weight)| {
                    let address: IpAddr = if family == 4 {
                        backend4(i).into()
                    } else {
                        backend6(i).into()
                    };
                    Some(backend(address, Some((*weight)?)))
                })
                .collect();
            vips.push(v);
        }
    }
    // On two links the clients' is eth1 and NAT's backends are on eth0.
    let (interface, nat) = if topo.opts.client_link {
        let nat = RawNat {
            interface: Some("eth0".into()),
            ..RawNat::default()
        };
        ("eth1", nat)
    } else {
        ("eth0", RawNat::default())
    };
    RawConfig {
        interface: Some(interface.into()),
        nat,
        attach_mode: Some(mode.to_string()),
        pin_dir: Some(topo.pin_dir().display().to_string()),
        state_file: Some(topo.rack.log_dir.join("state.json").display().to_string()),
        conntrack: RawConntrack {
            max_flows: Some(65_536),
            ..RawConntrack::default()
        },
        api: RawApi {
            socket: Some(topo.api_socket().display().to_string()),
            ..RawApi::default()
        },
        vip: vips,
        ..RawConfig::default()
    }
}

/// The rack's encapsulation sources: the balancer's own addresses.
pub fn rack_encap() -> RawEncap {
    RawEncap {
        source_v4: Some(LB4.to_string()),
        source_v6: Some(LB6.to_string()),
        mtu: None,
    }
}
