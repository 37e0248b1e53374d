//! The figures of every round: each peer's rates, latencies and CPU, with their spread and the
//! ratios to the peers.

use super::*;

pub(super) fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)])
}

/// Median and spread (max − min) of one figure over the rounds.
pub(super) fn stat(rounds: &[Round], f: impl Fn(&Round) -> Option<f64>) -> Option<(f64, f64)> {
    let v: Vec<f64> = rounds.iter().filter_map(&f).collect();
    if v.is_empty() {
        return None;
    }
    let (lo, hi) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    Some((median(&v), hi - lo))
}

pub(super) fn report(opts: &Options, results: &BTreeMap<&'static str, Vec<Round>>) -> Figures {
    let mut figures = Figures::new();
    peer_table(opts, results, &mut figures);
    baseline_ratios(opts, results, &mut figures);
    fair_ratios(results, &mut figures);
    saturation_note(opts, results);
    figures.insert("rounds".into(), opts.rounds as f64);
    figures.insert("pinned".into(), if opts.pin { 1.0 } else { 0.0 });
    figures.insert("seconds_per_phase".into(), opts.seconds);
    figures
}

type Getter = fn(&Round) -> Option<f64>;

/// Each peer's figures over the rounds, printed as a table (median ± spread).
fn peer_table(opts: &Options, results: &BTreeMap<&'static str, Vec<Round>>, figures: &mut Figures) {
    let columns: [(&str, &str, Getter); 12] = [
        ("conn_per_s", "conn/s", |r| Some(r.conn.rate)),
        ("keepalive_rps", "keep-alive req/s", |r| {
            Some(r.keepalive.rate)
        }),
        ("udp_pps", "UDP pps", |r| r.udp.as_ref().map(|u| u.rate)),
        ("conn_p50_us", "conn p50 µs", |r| Some(r.conn.p50_us)),
        ("conn_p99_us", "conn p99 µs", |r| Some(r.conn.p99_us)),
        ("keepalive_p50_us", "k-a p50 µs", |r| {
            Some(r.keepalive.p50_us)
        }),
        ("keepalive_p99_us", "k-a p99 µs", |r| {
            Some(r.keepalive.p99_us)
        }),
        ("host_cpu_ns_per_packet", "host CPU ns/pkt", |r| {
            Some(r.conn.host_ns_per_packet)
        }),
        ("own_cpu_ns_per_packet", "own ns/pkt", |r| {
            r.conn.own_ns_per_packet
        }),
        ("wrk_conn_per_s", "wrk conn/s", |r| Some(r.wrk.rate)),
        ("wrk_conn_p99_us", "wrk p99 µs", |r| Some(r.wrk.p99_us)),
        ("trafgen_udp_pps", "trafgen pps", |r| {
            r.trafgen.as_ref().map(|t| t.rate)
        }),
    ];
    println!();
    print!("{:<38}", "peer (median of rounds ± spread)");
    for (_, head, _) in &columns {
        print!(" {head:>18}");
    }
    println!();
    for peer in &opts.peers {
        let Some(rounds) = results.get(peer.key()) else {
            continue;
        };
        print!("{:<38}", peer.label());
        for (key, _, get) in &columns {
            match stat(rounds, get) {
                Some((m, spread)) => {
                    print!(" {:>18}", format!("{m:.0} ±{spread:.0}"));
                    figures.insert(format!("{key}_{}", peer.key()), m);
                }
                None => print!(" {:>18}", "n/a"),
            }
        }
        println!();
        if let Some(u) = stat(rounds, |r| r.udp.as_ref().and_then(|u| u.own_ns_per_packet)) {
            figures.insert(format!("udp_own_cpu_ns_per_packet_{}", peer.key()), u.0);
        }
        if let Some(u) = stat(rounds, |r| r.udp.as_ref().map(|u| u.host_ns_per_packet)) {
            figures.insert(format!("udp_host_cpu_ns_per_packet_{}", peer.key()), u.0);
        }
        let errors: u64 = rounds
            .iter()
            .map(|r| {
                r.conn.errors
                    + r.keepalive.errors
                    + r.udp.as_ref().map_or(0, |u| u.errors)
                    + r.wrk.errors
            })
            .sum();
        figures.insert(format!("errors_{}", peer.key()), errors as f64);
        if let Some(t) = stat(rounds, |r| {
            r.trafgen.as_ref().map(|t| {
                let sent = t.rate * opts.seconds + t.errors as f64;
                t.rate * opts.seconds / sent.max(1.0)
            })
        }) {
            figures.insert(format!("trafgen_delivered_fraction_{}", peer.key()), t.0);
        }
        if let Some(t) = stat(rounds, |r| {
            r.trafgen.as_ref().and_then(|t| t.own_ns_per_packet)
        }) {
            figures.insert(format!("trafgen_own_cpu_ns_per_packet_{}", peer.key()), t.0);
        }
        if let Some(b) = stat(rounds, |r| Some(r.conn.busy)) {
            figures.insert(format!("host_busy_fraction_{}", peer.key()), b.0);
        }
    }
}

/// Ratios to the baseline (higher is better for rates; for p99, baseline / peer so that
/// higher is better there too).
fn baseline_ratios(
    opts: &Options,
    results: &BTreeMap<&'static str, Vec<Round>>,
    figures: &mut Figures,
) {
    let base = results.get(Peer::Baseline.key());
    let base_of = |f: &dyn Fn(&Round) -> Option<f64>| base.and_then(|b| stat(b, f)).map(|s| s.0);
    println!();
    println!(
        "ratios to the baseline (rates: peer / baseline; p99: baseline / peer; ≥ 0.95 is indistinguishable):"
    );
    for peer in opts.peers.iter().filter(|p| **p != Peer::Baseline) {
        // (the router row shows what the extra hop alone costs)
        let Some(rounds) = results.get(peer.key()) else {
            continue;
        };
        let mut line = format!("  {:<38}", peer.label());
        for (key, name, get, inverse) in [
            (
                "conn_per_s",
                "conn/s",
                (|r: &Round| Some(r.conn.rate)) as Getter,
                false,
            ),
            (
                "keepalive_rps",
                "keep-alive",
                |r| Some(r.keepalive.rate),
                false,
            ),
            ("udp_pps", "UDP", |r| r.udp.as_ref().map(|u| u.rate), false),
            ("conn_p99", "conn p99", |r| Some(r.conn.p99_us), true),
            ("wrk_conn_per_s", "wrk conn/s", |r| Some(r.wrk.rate), false),
            (
                "trafgen_udp_pps",
                "trafgen",
                |r| r.trafgen.as_ref().map(|t| t.rate),
                false,
            ),
        ] {
            match (stat(rounds, get), base_of(&get)) {
                (Some((m, _)), Some(b)) if m > 0.0 && b > 0.0 => {
                    let ratio = if inverse { b / m } else { m / b };
                    line.push_str(&format!(" {name} {ratio:.2}×"));
                    figures.insert(format!("{key}_ratio_{}_to_baseline", peer.key()), ratio);
                }
                _ => line.push_str(&format!(" {name} n/a")),
            }
        }
        println!("{line}");
    }
}

/// Each of our modes beside its fair peer: the geometric mean of the per-round ratios (the
/// peers of a round ran back to back, so a round pairs them) with its bootstrap 95% interval,
/// and what the interval says.
fn fair_ratios(results: &BTreeMap<&'static str, Vec<Round>>, figures: &mut Figures) {
    println!();
    println!("ours / the fair peer, per round paired (geometric mean, bootstrap 95% interval):");
    for (ours, theirs) in [
        (Peer::XdpNative, Peer::Nftables),
        (Peer::XdpNative, Peer::Haproxy),
        (Peer::XdpNat, Peer::Nftables),
        (Peer::XdpSnat, Peer::NftablesSnat),
        (Peer::XdpSnatSkb, Peer::NftablesSnat),
    ] {
        let (Some(a), Some(b)) = (results.get(ours.key()), results.get(theirs.key())) else {
            continue;
        };
        for (key, name, get) in FAIR_FIGURES {
            let ratios = paired_ratios(a, b, get);
            if ratios.is_empty() {
                continue;
            }
            let (r, (lo, hi)) = crate::geomean_with_95(&ratios, 4000);
            let says = if ratios.len() < 2 {
                "one round: no interval"
            } else if lo > 1.0 {
                "ahead"
            } else if hi < 1.0 {
                "behind"
            } else {
                "no difference we can see"
            };
            println!(
                "  {} / {}: {name} {r:.3}× ({lo:.3}..{hi:.3}, {} rounds): {says}",
                ours.key(),
                theirs.key(),
                ratios.len()
            );
            let stem = format!("{key}_ratio_{}_to_{}", ours.key(), theirs.key());
            figures.insert(stem.clone(), r);
            if ratios.len() >= 2 {
                figures.insert(format!("{stem}_lo95"), lo);
                figures.insert(format!("{stem}_hi95"), hi);
            }
        }
    }
}

/// The rates compared between each of our modes and its fair peer.
const FAIR_FIGURES: [(&str, &str, Getter); 4] = [
    ("conn_per_s", "conn/s", |r| Some(r.conn.rate)),
    ("udp_pps", "UDP pps", |r| r.udp.as_ref().map(|u| u.rate)),
    ("wrk_conn_per_s", "wrk conn/s", |r| Some(r.wrk.rate)),
    ("trafgen_udp_pps", "trafgen pps", |r| {
        r.trafgen.as_ref().map(|t| t.rate)
    }),
];

/// `get(a) / get(b)` of each round both have the figure in (positive).
pub(super) fn paired_ratios(a: &[Round], b: &[Round], get: Getter) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter_map(|(x, y)| match (get(x), get(y)) {
            (Some(x), Some(y)) if x > 0.0 && y > 0.0 => Some(x / y),
            _ => None,
        })
        .collect()
}

/// What saturated, and what "own ns/pkt" counts.
fn saturation_note(opts: &Options, results: &BTreeMap<&'static str, Vec<Round>>) {
    println!();
    let busy = results
        .values()
        .flatten()
        .map(|r| r.conn.busy)
        .fold(0.0, f64::max);
    println!(
        "what saturates: the host was up to {:.0}% busy during the connection phase; the generator, \
         the backends' servers and all forwarding share {} CPU(s), so near 100% the machine, not the \
         balancer, is the limit.{}",
        busy * 100.0,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        if opts.pin {
            " Pinned: the generator ran on the last CPU; XDP on veth still runs in the sender's softirq, i.e. on the generator's CPU."
        } else {
            ""
        }
    );
    println!(
        "own ns/pkt: the XDP program's run time per run (BPF stats, on only in a {SAMPLE_SECONDS} s run \
         of each phase after the measured one; it runs once per packet it sees) or HAProxy's \
         process CPU per client packet; nftables' cost is in softirqs and only shows \
         in host CPU ns/pkt (compare with the baseline)."
    );
}
