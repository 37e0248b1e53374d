//! Packet-exact tests of the XDP program through BPF_PROG_TEST_RUN (needs root): fixtures of
//! {input frame, expected action, expected output bytes}, with maps filled by the daemon's code.

use std::net::IpAddr;

use balancer_tests::packet::*;

const CONFIG: &str = r#"
interface = "eth0"
[conntrack]
max_flows = 4096
flood_threshold = 0
[encap]
source_v4 = "172.16.0.0/16"
source_v6 = "fd00:e::/96"

[[vip]]
name = "l2dsr4"
address = "10.111.1.1"
port = 80
  [[vip.backend]]
  address = "10.111.0.11"
  [[vip.backend]]
  address = "10.111.0.12"
  [[vip.backend]]
  address = "10.111.0.13"

[[vip]]
name = "ipip4"
address = "10.111.1.2"
port = 80
forwarding = "ipip"
  [[vip.backend]]
  address = "10.111.0.11"
  [[vip.backend]]
  address = "10.111.0.12"

[[vip]]
name = "gue4"
address = "10.111.1.3"
port = 80
forwarding = "gue"
gue_port = 6080
  [[vip.backend]]
  address = "10.111.0.11"
  [[vip.backend]]
  address = "10.111.0.12"

[[vip]]
name = "l2dsr6"
address = "fd00:111:1::1"
port = 80
  [[vip.backend]]
  address = "fd00:111::11"
  [[vip.backend]]
  address = "fd00:111::12"

[[vip]]
name = "ipip6"
address = "fd00:111:1::2"
port = 80
forwarding = "ipip"
  [[vip.backend]]
  address = "fd00:111::11"
  [[vip.backend]]
  address = "fd00:111::12"

[[vip]]
name = "gue6"
address = "fd00:111:1::3"
port = 443
protocol = "udp"
forwarding = "gue"
gue_port = 6081
  [[vip.backend]]
  address = "fd00:111::11"

[[vip]]
name = "dns4"
address = "10.111.1.1"
port = 53
protocol = "udp"
forwarding = "ipip"
  [[vip.backend]]
  address = "10.111.0.13"

[[vip]]
name = "empty"
address = "10.111.1.9"
port = 80
"#;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn harness() -> Harness {
    Harness::new(CONFIG)
        .expect("loading the balancer needs root and BPF: run through cargo xtask test")
}

#[test]
#[ignore = "needs root (BPF_PROG_TEST_RUN); run by cargo xtask test"]
fn l2_dsr_rewrites_only_the_macs() {
    let mut h = harness();
    for (client, vip, name) in [
        ("10.9.0.1", "10.111.1.1", "l2dsr4"),
        ("2001:db8::5", "fd00:111:1::1", "l2dsr6"),
    ] {
        for sport in [1000u16, 40000, 65535] {
            let frame = tcp_frame(ip(client), sport, ip(vip), 80, true, b"hello");
            let backend = h.table_backend(name, ip(client), sport).unwrap();
            let (action, out) = h.run(&frame).unwrap();
            assert_eq!(action_name(action), "XDP_TX", "{name} sport {sport}");
            assert_eq!(out, expect_l2dsr(&frame, backend), "{name} sport {sport}");
        }
    }
}
