//! Tests of `netinfo`.

use super::*;

#[test]
fn each_backend_is_resolved_on_its_link() {
    /// Answers with the index of the interface it was asked on.
    struct ByLink;
    impl NextHops for ByLink {
        fn resolve(
            &self,
            iface: &Interface,
            addresses: &[IpAddr],
            _timeout: Duration,
        ) -> Result<HashMap<IpAddr, MacAddr>, NeighbourError> {
            let index = iface.index as u8;
            Ok(addresses
                .iter()
                .map(|a| (*a, MacAddr([2, 0, 0, 0, 0, index])))
                .collect())
        }
    }
    let link = |name: &str, index: u32| Interface {
        name: name.into(),
        index,
        mac: MacAddr([2, 0, 0, 0, 1, index as u8]),
        mtu: 1500,
        addresses: vec![],
    };
    let (dsr, nat): (IpAddr, IpAddr) = ("10.0.0.11".parse().unwrap(), "10.1.0.11".parse().unwrap());
    let wanted = [(dsr, false), (nat, true)];
    let one = Links::one(link("eth0", 2));
    let macs = one.resolve(&ByLink, &wanted, Duration::ZERO).unwrap();
    assert_eq!((macs[&dsr].0[5], macs[&nat].0[5]), (2, 2));
    assert_eq!(one.nat_links(), NatLinks::default(), "one link: all zero");
    let two = Links {
        clients: link("eth0", 2),
        nat_backends: Some(link("eth1", 3)),
    };
    let macs = two.resolve(&ByLink, &wanted, Duration::ZERO).unwrap();
    assert_eq!((macs[&dsr].0[5], macs[&nat].0[5]), (2, 3));
    assert_eq!(
        two.nat_links(),
        NatLinks {
            client_ifindex: 2,
            backend_ifindex: 3,
            client_mac: [2, 0, 0, 0, 1, 2],
            backend_mac: [2, 0, 0, 0, 1, 3],
        }
    );
}

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
fn the_neighbour_dump_matches_ip_neigh() {
    // Every interface's usable entries, as iproute2 reads them.
    let out = std::process::Command::new("ip")
        .args(["-j", "neigh", "show", "nud", "all"])
        .output()
        .expect("ip (iproute2) runs");
    let entries: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let usable = ["REACHABLE", "STALE", "DELAY", "PROBE", "NOARP", "PERMANENT"];
    let mut devices: Vec<String> = entries
        .iter()
        .filter_map(|e| e["dev"].as_str().map(str::to_string))
        .collect();
    devices.push("lo".into());
    devices.sort();
    devices.dedup();
    for dev in devices {
        let index = Interface::by_name(&dev).unwrap().index;
        let ours = netlink::neighbours(index).unwrap();
        let theirs: HashMap<IpAddr, MacAddr> = entries
            .iter()
            .filter(|e| e["dev"] == dev.as_str())
            .filter(|e| {
                (e["state"].as_array())
                    .is_some_and(|s| s.iter().any(|s| usable.contains(&s.as_str().unwrap_or(""))))
            })
            .filter_map(|e| {
                let dst = e["dst"].as_str()?.parse().ok()?;
                let mac: MacAddr = e["lladdr"].as_str()?.parse().ok()?;
                Some((dst, mac))
            })
            .collect();
        assert_eq!(ours, theirs, "{dev}");
    }
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
