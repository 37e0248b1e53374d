//! Config parsing and validation, from whole files down to single keys.

use balancer_common::maps::{DEFAULT_TABLE_SIZE, SourcePrefix};

use crate::base::config::{PolicyKind, StaleMode};
use crate::base::net::{MacAddr, Protocol};

use super::*;

const GOOD: &str = r#"
interface = "eth0"
attach_mode = "skb"

[conntrack]
max_flows = 65536
udp_idle_timeout_secs = 10
flood_threshold = 0

[encap]
source_v4 = "172.16.0.0/16"
mtu = 1500

[[vip]]
name = "web"
address = "10.100.0.1"
port = 80
forwarding = "ipip"

  [[vip.backend]]
  address = "10.0.0.11"
  weight = 2

  [[vip.backend]]
  address = "10.0.0.12"
  mac = "02:00:00:00:00:12"

[[vip]]
address = "2001:db8::1"
port = 53
protocol = "udp"
table_size = 655373
"#;

#[test]
fn parses_a_full_config() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.interface, "eth0");
    assert_eq!(c.attach_mode, AttachMode::Skb);
    assert_eq!(c.conntrack.max_flows, 65_536);
    assert_eq!(c.conntrack.udp_idle_timeout, Duration::from_secs(10));
    assert_eq!(c.encap.source_v4, Some("172.16.0.0/16".parse().unwrap()));
    assert_eq!(c.vips.len(), 2);
    let web = c.vip("web").unwrap();
    assert_eq!(web.forwarding, Forwarding::Ipip);
    assert_eq!(web.table_size, DEFAULT_TABLE_SIZE);
    assert_eq!(web.backends[0].weight, 2);
    assert_eq!(web.backends[1].weight, 1);
    assert_eq!(web.backends[1].mac, Some(MacAddr([2, 0, 0, 0, 0, 0x12])));
    let dns = &c.vips[1];
    assert_eq!(dns.name, "udp-2001:db8::1-53");
    assert_eq!(dns.protocol, Protocol::Udp);
    assert_eq!(dns.table_size, 655_373);
    assert!(dns.backends.is_empty());
}

#[test]
fn defaults_apply() {
    let c = Config::parse("interface = \"lo0\"").unwrap();
    assert_eq!(c.attach_mode, AttachMode::Native);
    assert_eq!(c.conntrack.max_flows, DEFAULT_MAX_FLOWS);
    assert_eq!(c.conntrack.flood_threshold, DEFAULT_FLOOD_THRESHOLD);
    assert!(c.vips.is_empty());
}

fn error_of(text: &str) -> String {
    Config::parse(text).unwrap_err().to_string()
}

fn with_vip(vip_body: &str) -> String {
    format!("interface = \"eth0\"\n[[vip]]\n{vip_body}\n")
}

#[test]
fn pools_give_vips_the_backends_serving_their_model() {
    let text = "interface = \"eth0\"\n\
        [[pool]]\nname = \"gpus\"\ndiscover = \"models\"\n\
        [[pool.backend]]\naddress = \"10.0.0.1\"\n[[pool.backend]]\naddress = \"10.0.0.2\"\nweight = 3\n\
        [[pool]]\nname = \"all\"\n[[pool.backend]]\naddress = \"10.0.0.9\"\n\
        [[vip]]\nname = \"llama\"\naddress = \"10.1.0.1\"\nport = 80\npool = \"gpus\"\nmodel = \"llama\"\n\
        [[vip.backend]]\naddress = \"10.0.0.5\"\n\
        [[vip]]\nname = \"any\"\naddress = \"10.1.0.2\"\nport = 80\npool = \"all\"\nmodel = \"whatever\"\n";
    let mut c = Config::parse(text).unwrap();
    let addrs = |c: &Config, vip: &str| -> Vec<String> {
        c.vip(vip)
            .unwrap()
            .backends
            .iter()
            .map(|b| b.address.to_string())
            .collect()
    };
    // Nothing discovered yet: only the VIP's own backend; a pool without discovery gives all.
    assert_eq!(addrs(&c, "llama"), vec!["10.0.0.5"]);
    assert_eq!(addrs(&c, "any"), vec!["10.0.0.9"]);
    let mut served = std::collections::HashMap::new();
    served.insert(
        "gpus".to_string(),
        [
            ("10.0.0.1".parse().unwrap(), vec!["mistral".to_string()]),
            (
                "10.0.0.2".parse().unwrap(),
                vec!["llama".to_string(), "mistral".to_string()],
            ),
        ]
        .into_iter()
        .collect(),
    );
    c.place_pool_backends(&served);
    assert_eq!(addrs(&c, "llama"), vec!["10.0.0.5", "10.0.0.2"]);
    assert_eq!(
        c.vip("llama").unwrap().backends[1].weight,
        3,
        "the pool's settings come along"
    );
    // The file form keeps pool members in the pool.
    let raw = c.to_raw();
    assert_eq!(raw.vip[0].backend.len(), 1);
    assert_eq!(raw.pool[0].backend.len(), 2);
    for (bad, want) in [
        (
            text.replace("pool = \"gpus\"", "pool = \"gpu\""),
            "vip[0].pool = \"gpu\": no [[pool]] has this name",
        ),
        (
            text.replace("discover = \"models\"", "discover = \"dns\""),
            "pool[0].discover = \"dns\"",
        ),
        (
            text.replace("pool = \"all\"\n", ""),
            "vip[1].model = \"whatever\": model routing needs a pool",
        ),
    ] {
        let err = Config::parse(&bad).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn schedulers_and_tiers_are_checked() {
    let tier = "interface = \"eth0\"\n[[tier]]\nname = \"premium\"\nprefixes = [\"10.9.0.0/16\"]\ndscp = [46]\n";
    let ok = format!(
        "{tier}[[vip]]\naddress = \"10.0.0.1\"\nport = 80\nscheduler = \"source-hash\"\nmax_load_factor = 1.25\npersistence_secs = 600\n[[vip.backend]]\naddress = \"10.0.0.2\"\ntier = \"premium\"\n"
    );
    let c = Config::parse(&ok).unwrap();
    assert_eq!(c.tiers[0].id, 1);
    assert!(c.tiers[0].spillover);
    assert_eq!(c.vips[0].scheduler, Scheduler::SourceHash);
    assert_eq!(c.vips[0].load_bound_pct, 25);
    assert_eq!(
        c.vips[0].persistence_ticks(),
        559,
        "600 s in 1.07 s ticks, rounded up"
    );
    assert_eq!(c.vips[0].affinity_prefix, SourcePrefix::WHOLE);
    // Round trip through the file form.
    assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    // Tenant affinity: by source hash, or by persistence under any scheduler.
    for scheduling in [
        "scheduler = \"source-hash\"\nmax_load_factor = 1.25",
        "persistence_secs = 300",
    ] {
        let tenant = with_vip(&format!(
            "address = \"10.0.0.1\"\nport = 80\n{scheduling}\naffinity_prefix_v4 = 24\naffinity_prefix_v6 = 64"
        ));
        let c = Config::parse(&tenant).unwrap();
        assert_eq!(
            (c.vips[0].affinity_prefix.v4, c.vips[0].affinity_prefix.v6),
            (24, 64)
        );
        assert!(c.vips[0].affinity_prefix.is_prefix());
        assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    }
    let cases: &[(String, &str)] = &[
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\nscheduler = \"fastest\""),
            "vip[0].scheduler = \"fastest\": expected one of maglev, source-hash",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\nscheduler = \"round-robin\"\nmax_load_factor = 1.5",
            ),
            "vip[0].max_load_factor = 1.5: bounds the load of the hashing schedulers",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\nmax_load_factor = 0.9"),
            "vip[0].max_load_factor = 0.9: must be between 1.01 and 3.55",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\nscheduler = \"source-hash\"\naffinity_prefix_v4 = 33",
            ),
            "vip[0].affinity_prefix_v4 = 33: must be between 1 and 32",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\nscheduler = \"source-hash\"\naffinity_prefix_v6 = 0",
            ),
            "vip[0].affinity_prefix_v6 = 0: must be between 1 and 128",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\naffinity_prefix_v6 = 64"),
            "vip[0].affinity_prefix_v6 = 64: keys the affinity of source-hash and of session persistence",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[[vip.backend]]\naddress = \"10.0.0.2\"\ntier = \"gold\"",
            ),
            "vip[0].backend[0].tier = \"gold\": no [[tier]] has this name",
        ),
        (
            format!("{tier}[[tier]]\nname = \"premium\"\ndscp = [10]\n"),
            "tier[1].name = \"premium\": another tier has this name",
        ),
        (
            format!("{tier}[[tier]]\nname = \"gold\"\nprefixes = [\"10.9.0.0/16\"]\n"),
            "tier[1].prefixes[0] = \"10.9.0.0/16\": another tier has this prefix",
        ),
        (
            "interface = \"eth0\"\n[[tier]]\nname = \"x\"\ndscp = [64]\n".into(),
            "tier[0].dscp[0] = 64: must be between 0 and 63",
        ),
        (
            "interface = \"eth0\"\n[[tier]]\nname = \"x\"\n".into(),
            "tier[0].prefixes = (none): a tier needs client prefixes or DSCP values",
        ),
    ];
    for (text, want) in cases {
        let err = Config::parse(text).unwrap_err().to_string();
        assert!(err.contains(want), "{text}\n=> {err}\nwanted {want}");
    }
}

#[test]
fn admission_control_names_tiers_and_needs_reports() {
    let tiers = "interface = \"eth0\"\n\
        [[tier]]\nname = \"premium\"\nprefixes = [\"10.9.5.0/24\"]\n\
        [[tier]]\nname = \"spare\"\n";
    let vip = |admission: &str, policy: &str, spare_backend: bool| {
        let spare = if spare_backend {
            "[[vip.backend]]\naddress = \"10.0.0.3\"\ntier = \"spare\"\n"
        } else {
            ""
        };
        format!(
            "{tiers}[[vip]]\naddress = \"10.0.0.1\"\nport = 80\ntelemetry = {{ source = \"push\" }}\n\
             policy = {{ kind = \"{policy}\" }}\nadmission = {admission}\n\
             [[vip.backend]]\naddress = \"10.0.0.2\"\n{spare}"
        )
    };
    let c = Config::parse(&vip(
        "{ admit = { premium = 20 }, overflow = \"spare\", refuse = \"drop\" }",
        "composite",
        true,
    ))
    .unwrap();
    let a = c.vips[0].admission.as_ref().unwrap();
    assert_eq!(a.admit.get("premium"), Some(&20));
    assert_eq!(a.overflow.as_deref(), Some("spare"));
    assert_eq!(a.refuse, Refusal::Drop);
    assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    // Defaults: nothing admitted while saturated, refusal by RST.
    let c = Config::parse(&vip("{ overflow = \"spare\" }", "gpu", true)).unwrap();
    assert_eq!(
        c.vips[0].admission,
        Some(AdmissionConfig {
            overflow: Some("spare".into()),
            ..AdmissionConfig::default()
        }),
    );
    assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    let cases: &[(String, &str)] = &[
        (
            vip("{ admit = { gold = 1 } }", "composite", true),
            "vip[0].admission.admit.gold = 1: no [[tier]] has this name",
        ),
        (
            vip("{ admit = { premium = -1 } }", "composite", true),
            "vip[0].admission.admit.premium = -1: must be between 0 and 100000000",
        ),
        (
            vip("{ refuse = \"later\" }", "composite", true),
            "vip[0].admission.refuse = \"later\": expected \"reset\" or \"drop\"",
        ),
        (
            vip("{ overflow = \"spare\" }", "composite", false),
            "vip[0].admission.overflow = \"spare\": none of the VIP's backends is in this tier",
        ),
        (
            vip(
                "{ overflow = \"premium\", admit = { premium = 0 } }",
                "composite",
                true,
            ),
            "vip[0].admission.overflow = \"premium\": this tier is admitted while saturated",
        ),
        (
            vip("{}", "least-conn", true),
            "vip[0].admission = (set): saturation comes from backend reports, which the \"least-conn\" policy does not read",
        ),
        (
            vip("{ surprise = 1 }", "composite", true),
            "unknown field `surprise`",
        ),
        (
            // A tier without clients serves only as an overflow.
            format!("{tiers}[[vip]]\naddress = \"10.0.0.1\"\nport = 80\n"),
            "tier[1].prefixes = (none): a tier needs client prefixes or DSCP values (or to be a VIP's admission overflow)",
        ),
    ];
    for (text, want) in cases {
        let got = error_of(text);
        assert!(got.contains(want), "want {want:?}, got {got:?}");
    }
}

#[test]
fn fair_admission_reads_tenant_shares_and_limits() {
    let tiers = "interface = \"eth0\"\n\
        [[tier]]\nname = \"team-a\"\nprefixes = [\"10.9.1.0/24\"]\nshare = 3\n\
        max_new_flows_per_sec = 500\n\
        [[tier]]\nname = \"team-b\"\ndscp = [10]\n";
    let vip = |admission: &str| {
        format!(
            "{tiers}[[vip]]\naddress = \"10.0.0.1\"\nport = 80\ntelemetry = {{ source = \"push\" }}\n\
             policy = {{ kind = \"composite\" }}\nadmission = {admission}\n\
             [[vip.backend]]\naddress = \"10.0.0.2\"\n"
        )
    };
    let c = Config::parse(&vip("{ fair = true, default_share = 2 }")).unwrap();
    let a = c.vips[0].admission.as_ref().unwrap();
    assert!(a.fair);
    assert_eq!(a.default_share, 2);
    assert_eq!(
        (c.tiers[0].share, c.tiers[0].max_new_flows_per_sec),
        (3, Some(500))
    );
    assert_eq!(
        (c.tiers[1].share, c.tiers[1].max_new_flows_per_sec),
        (1, None)
    );
    assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    // Without default_share the clients of no tier weigh 1.
    let c = Config::parse(&vip("{ fair = true }")).unwrap();
    assert_eq!(c.vips[0].admission.as_ref().unwrap().default_share, 1);
    let with_tier = |line: &str| {
        format!(
            "interface = \"eth0\"\n[[tier]]\nname = \"t\"\nprefixes = [\"10.9.0.0/16\"]\n{line}\n"
        )
    };
    let cases: &[(String, &str)] = &[
        (
            vip("{ fair = true, admit = { team-a = 0 } }"),
            "vip[0].admission.admit = 1 tiers: fair admission admits every tier by its share",
        ),
        (
            vip("{ default_share = 2 }"),
            "vip[0].admission.default_share = 2: the share of the clients of no tier applies to fair admission only",
        ),
        (
            vip("{ fair = true, default_share = 0 }"),
            "vip[0].admission.default_share = 0: must be between 1 and 10000",
        ),
        (
            with_tier("share = 0"),
            "tier[0].share = 0: must be between 1 and 10000",
        ),
        (
            with_tier("max_new_flows_per_sec = -5"),
            "tier[0].max_new_flows_per_sec = -5: must be between 1 and 100000000",
        ),
        (with_tier("share = 1.5"), "share"),
    ];
    for (text, want) in cases {
        let got = error_of(text);
        assert!(got.contains(want), "want {want:?}, got {got:?}");
    }
}

#[test]
fn errors_name_the_key_and_the_value() {
    let cases: &[(String, &str)] = &[
        ("attach_mode = \"x\"".into(), "interface = (missing)"),
        (
            "interface = \"eth0\"\nattach_mode = \"fast\"".into(),
            "attach_mode = \"fast\": expected \"native\" or \"skb\"",
        ),
        (
            with_vip("address = \"10.0.0.300\"\nport = 80"),
            "vip[0].address = \"10.0.0.300\": not an IPv4 or IPv6 address",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 0"),
            "vip[0].port = 0: must be between 1 and 65535",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\nprotocol = \"sctp\""),
            "vip[0].protocol = \"sctp\"",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\ntable_size = 65536"),
            "vip[0].table_size = 65536: must be a prime number",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[[vip.backend]]\naddress = \"10.0.0.2\"\nweight = -1",
            ),
            "vip[0].backend[0].weight = -1: must be between 0 and 65535",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[[vip.backend]]\naddress = \"10.0.0.2\"\n[[vip.backend]]\naddress = \"10.0.0.2\"",
            ),
            "vip[0].backend[1].address = \"10.0.0.2\": this backend is listed twice",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[[vip.backend]]\naddress = \"10.0.0.2\"\nmac = \"02:00:00\"",
            ),
            "vip[0].backend[0].mac = \"02:00:00\"",
        ),
        (
            format!(
                "{}[[vip]]\naddress = \"10.0.0.1\"\nport = 80\n",
                with_vip("address = \"10.0.0.1\"\nport = 80")
            ),
            "vip[1] = 10.0.0.1:80/tcp: the same address, port and protocol",
        ),
        (
            "interface = \"eth0\"\n[encap]\nsource_v6 = \"fd00::/64\"".into(),
            "encap.source_v6 = \"fd00::/64\"",
        ),
        (
            "interface = \"eth0\"\nbogus = 1".into(),
            "unknown field `bogus`",
        ),
        (
            "interface = \"eth0\"\n[conntrack]\nmax_flows = 10".into(),
            "conntrack.max_flows = 10: must be between 1024",
        ),
        (
            "interface = \"eth0\"\n[api]\nlisten = \"0.0.0.0:9180\"".into(),
            "api.listen = \"0.0.0.0:9180\": a TCP listener needs api.token_file",
        ),
        (
            "interface = \"eth0\"\n[api]\ncert = \"/etc/b/api.pem\"\nkey = \"/etc/b/api-key.pem\"".into(),
            "api.cert = (set): TLS applies to the TCP listener: set api.listen too",
        ),
        (
            "interface = \"eth0\"\n[api]\nlisten = \"127.0.0.1:9180\"\ntoken_file = \"/t\"\ncert = \"/etc/b/api.pem\"".into(),
            "api.key = (absent): api.cert needs the key of that certificate",
        ),
        (
            "interface = \"eth0\"\n[api]\nlisten = \"127.0.0.1:9180\"\ntoken_file = \"/t\"\nclient_ca = \"/etc/b/ca.pem\"".into(),
            "api.client_ca = (set): client certificates are checked in TLS",
        ),
        (
            "interface = \"eth0\"\n[api]\nlisten = \"127.0.0.1:9180\"\ntoken_file = \"token\"".into(),
            "api.token_file = \"token\": must be an absolute path",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"http\"\nca = \"/etc/b/ca.pem\""),
            "vip[0].health.ca = (set): applies to check = \"https\" only",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"tcp\"\nca = \"/etc/b/ca.pem\""),
            "path, expect_status and ca apply to check = \"http\" or \"https\" only",
        ),
        (
            "interface = \"eth0\"\n[[pool]]\nname = \"p\"\nbearer_token_file = \"/t\"".into(),
            "pool[0].bearer_token_file = (set): scheme, ca, cert, key and bearer_token_file apply to discover",
        ),
        (
            "interface = \"eth0\"\n[[pool]]\nname = \"p\"\ndiscover = \"models\"\nca = \"/etc/b/ca.pem\"".into(),
            "pool[0].ca = (set): applies to scheme = \"https\" only",
        ),
        (
            "interface = \"eth0\"\n[metrics]\nlisten = \"localhost\"".into(),
            "metrics.listen = \"localhost\": not an address and port",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"icmp\""),
            "vip[0].health.check = \"icmp\"",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"tcp\"\ninterval_ms = 100\ntimeout_ms = 200",
            ),
            "vip[0].health.timeout_ms = 200: must not exceed interval_ms (100)",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\nname = \"a b\""),
            "vip[0].name = \"a b\"",
        ),
        (
            "interface = \"eth0\"\npin_dir = \"relative/dir\"".into(),
            "pin_dir = \"relative/dir\": must be an absolute path",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.policy]\nkind = \"gpu\""),
            "vip[0].policy.kind = \"gpu\": this policy needs backend reports",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.policy]\nkind = \"fastest\""),
            "vip[0].policy.kind = \"fastest\"",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.policy]\nkind = \"composite\"\nfresher_load = true",
            ),
            "vip[0].policy.fresher_load = true: was removed",
        ),
        (
            with_vip("address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\""),
            "vip[0].telemetry.port = (missing)",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\nextra = [\"dcgm\"]",
            ),
            "vip[0].telemetry.extra[0] = \"dcgm\": expected \"port/path\"",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\nscheme = \"ftp\"",
            ),
            "vip[0].telemetry.scheme = \"ftp\": expected \"http\" or \"https\"",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\nca = \"/etc/ca.pem\"",
            ),
            "vip[0].telemetry.ca = (set): applies to scheme = \"https\" only",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\nscheme = \"https\"\ncert = \"/etc/c.pem\"",
            ),
            "vip[0].telemetry.key = (absent)",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"push\"\nbearer_token_file = \"/etc/t\"",
            ),
            "vip[0].telemetry.bearer_token_file = (set): scheme, ca, cert, key and bearer_token_file apply to source = \"scrape\" only",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\nbearer_token_file = \"token\"",
            ),
            "vip[0].telemetry.bearer_token_file = \"token\": must be an absolute path",
        ),
        (
            with_vip(
                "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"push\"\n[vip.policy]\nkind = \"composite\"\nfloor = 1.5",
            ),
            "vip[0].policy.floor = 1.5: must be between 0 and 1",
        ),
    ];
    for (text, want) in cases {
        let got = error_of(text);
        assert!(
            got.contains(want),
            "config:\n{text}\nexpected an error containing {want:?}, got {got:?}"
        );
    }
}

#[test]
fn the_example_config_is_valid() {
    let text = include_str!("../../../../config/balancer.example.toml");
    let c = Config::parse(text).unwrap();
    assert_eq!(
        c.vips[0].health.kind,
        HealthCheckKind::Http {
            path: "/health".into(),
            expect_status: 200,
            tls: None,
        }
    );
    assert_eq!(c.metrics.listen, Some("127.0.0.1:9181".parse().unwrap()));
}

#[test]
fn a_config_survives_its_own_toml() {
    let mut c = Config::parse(GOOD).unwrap();
    c.vips[0].backends[1].drained = true;
    c.vips[0].health = HealthConfig {
        kind: HealthCheckKind::Http {
            path: "/health".into(),
            expect_status: 204,
            tls: Some(crate::base::config::HealthTls {
                ca: Some("/etc/balancer/backends-ca.pem".into()),
            }),
        },
        port: 8080,
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(100),
        rise: 1,
        fall: 2,
    };
    let text = c.to_toml();
    assert_eq!(
        Config::parse(&text).unwrap(),
        c,
        "round trip through:\n{text}"
    );
}

#[test]
fn telemetry_and_policy_settings() {
    let c = Config::parse(&with_vip(
        "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\nextra = [\"9400/metrics\"]\ninterval_ms = 200\n[vip.policy]\nkind = \"composite\"\nqueue_factor = 3\nstale = \"keep\"",
    ))
    .unwrap();
    let v = &c.vips[0];
    assert_eq!(
        v.telemetry.source,
        TelemetrySource::Scrape(vec![(8000, "/metrics".into()), (9400, "/metrics".into())])
    );
    assert_eq!(
        (v.telemetry.interval, v.telemetry.timeout),
        (Duration::from_millis(200), Duration::from_millis(160))
    );
    assert_eq!(v.policy.kind, PolicyKind::Composite);
    assert_eq!(v.policy.factors.queue, 3.0);
    assert_eq!(v.policy.stale, StaleMode::Keep);
    assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
}

/// A report is stale after three of the slowest scrapes by default (at least a second), so
/// slow scrapes do not make every report stale before the next one comes; a set value stands,
/// unless a scraped VIP's reports would go stale between two scrapes.
#[test]
fn stale_after_defaults_to_three_scrapes() {
    let stale_after = |telemetry: &str, policy: &str| {
        Config::parse(&with_vip(&format!(
            "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\n{telemetry}\n[vip.policy]\nkind = \"composite\"\n{policy}"
        )))
        .map(|c| {
            assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
            c.vips[0].policy.stale_after.as_millis()
        })
        .map_err(|e| e.to_string())
    };
    // A fixed interval (requests_per_scrape = 0): three of it.
    let fixed = |ms: u32| {
        format!("source = \"scrape\"\nport = 8000\ninterval_ms = {ms}\nrequests_per_scrape = 0")
    };
    assert_eq!(stale_after(&fixed(2000), ""), Ok(6000));
    assert_eq!(stale_after(&fixed(500), ""), Ok(1500));
    assert_eq!(stale_after(&fixed(100), ""), Ok(1000));
    assert_eq!(stale_after(&fixed(2000), "stale_after_ms = 2500"), Ok(2500));
    // Paced (the default): three of the slowest, max_interval_ms.
    let paced = "source = \"scrape\"\nport = 8000";
    assert_eq!(stale_after(paced, ""), Ok(12000));
    assert_eq!(
        stale_after(&format!("{paced}\nmax_interval_ms = 1000"), ""),
        Ok(3000)
    );
    assert_eq!(stale_after("source = \"push\"", ""), Ok(1000));
    assert_eq!(
        stale_after(paced, "stale_after_ms = 1000"),
        Err("vip[0].policy.stale_after_ms = 1000: must be at least the slowest scrape interval (4000 ms, telemetry.max_interval_ms): a quiet VIP's reports would go stale between two scrapes".into())
    );
    assert_eq!(
        stale_after(&fixed(2000), "stale_after_ms = 1000"),
        Err("vip[0].policy.stale_after_ms = 1000: must be at least the slowest scrape interval (2000 ms, telemetry.interval_ms): a quiet VIP's reports would go stale between two scrapes".into())
    );
    assert_eq!(
        stale_after("source = \"push\"", "stale_after_ms = 300"),
        Ok(300)
    );
}

/// Scrapes are paced by the VIP's requests between interval_ms and max_interval_ms (default
/// the larger of 4 s and interval_ms), 8 requests per backend between scrapes by default;
/// settings out of range are refused by name.
#[test]
fn the_scrapes_pace_between_two_intervals() {
    let pace = |telemetry: &str| {
        Config::parse(&with_vip(&format!(
            "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\nsource = \"scrape\"\nport = 8000\n{telemetry}"
        )))
        .map(|c| {
            assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
            let t = &c.vips[0].telemetry;
            (
                t.interval.as_millis(),
                t.max_interval.as_millis(),
                t.requests_per_scrape,
                t.slowest().as_millis(),
            )
        })
        .map_err(|e| e.to_string())
    };
    assert_eq!(pace(""), Ok((100, 4000, 8, 4000)));
    assert_eq!(pace("interval_ms = 5000"), Ok((5000, 5000, 8, 5000)));
    assert_eq!(
        pace("interval_ms = 200\nmax_interval_ms = 1000\nrequests_per_scrape = 2"),
        Ok((200, 1000, 2, 1000))
    );
    assert_eq!(pace("requests_per_scrape = 0"), Ok((100, 4000, 0, 100)));
    assert_eq!(
        pace("interval_ms = 500\nmax_interval_ms = 200"),
        Err("vip[0].telemetry.max_interval_ms = 200: must not be below interval_ms (500)".into())
    );
    assert_eq!(
        pace("max_interval_ms = 700000"),
        Err("vip[0].telemetry.max_interval_ms = 700000: must be between 10 and 600000".into())
    );
    assert_eq!(
        pace("requests_per_scrape = -1"),
        Err("vip[0].telemetry.requests_per_scrape = -1: must be between 0 and 1000000".into())
    );
}

/// The derived figures' recent window is 200 ms by default, whatever the interval; a set
/// value stands, and one out of range is refused by name.
#[test]
fn the_derived_figures_window_is_set_apart_from_the_interval() {
    let half_life = |telemetry: &str| {
        Config::parse(&with_vip(&format!(
            "address = \"10.0.0.1\"\nport = 80\n[vip.telemetry]\n{telemetry}"
        )))
        .map(|c| {
            assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
            c.vips[0].telemetry.derived_half_life.as_millis()
        })
        .map_err(|e| e.to_string())
    };
    let scrape = "source = \"scrape\"\nport = 8000";
    assert_eq!(half_life(scrape), Ok(200));
    assert_eq!(half_life(&format!("{scrape}\ninterval_ms = 2000")), Ok(200));
    assert_eq!(
        half_life(&format!(
            "{scrape}\ninterval_ms = 2000\nderived_half_life_ms = 4000"
        )),
        Ok(4000)
    );
    assert_eq!(
        half_life(&format!("{scrape}\nderived_half_life_ms = 5")),
        Err("vip[0].telemetry.derived_half_life_ms = 5: must be between 10 and 3600000".into())
    );
}

#[test]
fn api_and_health_settings() {
    let c = Config::parse(
        "interface = \"eth0\"\n[api]\nlisten = \"127.0.0.1:9180\"\ntoken_file = \"/etc/balancer/token\"\n[metrics]\nlisten = \"[::1]:9181\"\n[[vip]]\naddress = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"tcp\"\ninterval_ms = 100",
    )
    .unwrap();
    assert_eq!(c.api.listen, Some("127.0.0.1:9180".parse().unwrap()));
    assert_eq!(c.api.socket, PathBuf::from(DEFAULT_API_SOCKET));
    assert_eq!(c.metrics.listen, Some("[::1]:9181".parse().unwrap()));
    assert_eq!(c.pin_dir, PathBuf::from("/sys/fs/bpf/balancer/eth0"));
    let h = &c.vips[0].health;
    assert_eq!((h.kind.clone(), h.port), (HealthCheckKind::Tcp, 80));
    assert_eq!(
        (h.interval, h.timeout),
        (Duration::from_millis(100), Duration::from_millis(50))
    );
    assert_eq!((h.rise, h.fall), (2, 3));
}

#[test]
fn a_metrics_port_alone_listens_on_loopback() {
    let with = |listen: &str| {
        let mut raw = RawConfig {
            interface: Some("eth0".into()),
            ..RawConfig::default()
        };
        raw.metrics.listen = Some(listen.into());
        Config::from_raw(raw)
    };
    assert_eq!(
        with("9181").unwrap().metrics.listen,
        Some("127.0.0.1:9181".parse().unwrap())
    );
    assert_eq!(
        with("0.0.0.0:9181").unwrap().metrics.listen,
        Some("0.0.0.0:9181".parse().unwrap())
    );
    let e = with("0").unwrap_err().to_string();
    assert!(e.contains("metrics.listen"), "{e}");
}

#[test]
fn tls_settings_survive_their_own_toml() {
    let c = Config::parse(
        "interface = \"eth0\"\n[api]\nlisten = \"127.0.0.1:9180\"\ntoken_file = \"/etc/b/token\"\ncert = \"/etc/b/api.pem\"\nkey = \"/etc/b/api-key.pem\"\nclient_ca = \"/etc/b/ca.pem\"\n[[pool]]\nname = \"p\"\ndiscover = \"models\"\nscheme = \"https\"\nca = \"/etc/b/ca.pem\"\nbearer_token_file = \"/etc/b/pool-token\"\n[[pool.backend]]\naddress = \"10.0.0.5\"\n[[vip]]\naddress = \"10.0.0.1\"\nport = 80\n[vip.health]\ncheck = \"https\"\nca = \"/etc/b/ca.pem\"",
    )
    .unwrap();
    let tls = c.api.tls.clone().expect("API TLS");
    assert_eq!(tls.client_ca, Some(PathBuf::from("/etc/b/ca.pem")));
    assert!(c.pools[0].access.https);
    assert!(matches!(
        &c.vips[0].health.kind,
        HealthCheckKind::Http { tls: Some(t), .. } if t.ca == Some(PathBuf::from("/etc/b/ca.pem"))
    ));
    let text = c.to_toml();
    assert_eq!(
        Config::parse(&text).unwrap(),
        c,
        "round trip through:\n{text}"
    );
}

#[test]
fn nat_vips_keep_their_backends_in_their_family() {
    let c = Config::parse(&with_vip(
        "address = \"10.0.0.1\"\nport = 80\nforwarding = \"nat\"\n[[vip.backend]]\naddress = \"10.0.0.11\"",
    ))
    .unwrap();
    assert_eq!(c.vips[0].forwarding, Forwarding::Nat);
    assert_eq!(Config::parse(&c.to_toml()).unwrap(), c);
    let e = error_of(&with_vip(
        "address = \"10.0.0.1\"\nport = 80\nforwarding = \"nat\"\n[[vip.backend]]\naddress = \"fd00::11\"",
    ));
    assert!(
        e.contains("vip[0].backend[0].address = \"fd00::11\": a nat VIP's backends are of its address family"),
        "{e}"
    );
    // A pool's backends of the other family do not join a nat VIP.
    let c = Config::parse(
        "interface = \"eth0\"\n[[pool]]\nname = \"p\"\n[[pool.backend]]\naddress = \"10.0.0.12\"\n\
         [[pool.backend]]\naddress = \"fd00::12\"\n[[vip]]\naddress = \"10.0.0.1\"\nport = 80\n\
         forwarding = \"nat\"\npool = \"p\"\n[[vip]]\naddress = \"10.0.0.2\"\nport = 80\npool = \"p\"",
    )
    .unwrap();
    let addresses = |v: &VipConfig| -> Vec<String> {
        v.backends.iter().map(|b| b.address.to_string()).collect()
    };
    assert_eq!(addresses(&c.vips[0]), ["10.0.0.12"]);
    assert_eq!(addresses(&c.vips[1]), ["10.0.0.12", "fd00::12"]);
    let e = error_of(&with_vip(
        "address = \"10.0.0.1\"\nport = 80\nforwarding = \"snat\"",
    ));
    assert!(
        e.contains("\"l2-dsr\", \"ipip\", \"gue\" or \"nat\""),
        "{e}"
    );
}
