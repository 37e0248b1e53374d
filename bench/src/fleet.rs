//! `cargo xtask bench fleet`: how fast a weight change on the fleet's leader is live on every
//! follower's table. The fleet of the fleet tests (router, BIRD, three balancers, one etcd
//! member with TLS, client certificates and a password unless `--plain`); one backend's
//! weight set through the leader's API `changes` times, each time to a value that moves its
//! table; after each, every follower's API is read until its table has the leader's new
//! fingerprint. Reported, p50 / p99 / max: from the leader's answer (its own table is live
//! then) and from the request's start, by that polling; and from the daemons' own log stamps
//! (no polling): the leader's answer to its publication and to every follower's table live.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use balancer::state::wire::{ChangeResult, Table, WeightBody};

use super::Figures;
use crate::load::stats::percentile;
use balancer_tests::fleet::{EtcdSecurity, Fleet, backend_addr};

/// Its page: a weight change's way through the fleet (`docs/benchmarks/fleet.md`).
pub const PAGE: super::page::Page = super::page::Page {
    name: "fleet",
    title: "Fleet: a weight change from the leader to every follower",
    about: "Three balancers on one etcd member (with TLS, client certificates and a password: \
            `tls_`; then plain: `plain_`), BIRD announcing them to a router; one backend's \
            weight set through the leader's API 100 times, each to a value that moves its \
            table, and every follower's API read until its table has the new weight. Times in \
            ms from the leader's API answer (or, from the logs, from the leader's publication).",
    columns: &[
        ("_p50_ms", "p50 ms"),
        ("_p99_ms", "p99 ms"),
        ("_max_ms", "max ms"),
    ],
    flat: &[],
};

const VIP: &str = "http4";

pub struct Options {
    pub changes: usize,
    pub balancers: usize,
    /// Each is measured in turn on a fresh fleet.
    pub security: Vec<EtcdSecurity>,
}

fn fingerprint(f: &Fleet, lb: usize) -> Result<String> {
    let table: Table = f
        .api(lb)
        .get(&format!("/v1/vips/{VIP}/table"))
        .map_err(|e| anyhow::anyhow!("table of lb{}: {e}", lb + 1))?;
    Ok(table.fingerprint)
}

pub fn run(opts: &Options) -> Result<Figures> {
    if opts.balancers < 2 {
        bail!("a fleet benchmark needs at least two balancers");
    }
    let mut figures = Figures::new();
    for security in &opts.security {
        let (tag, prefix) = match security {
            EtcdSecurity::Plain => ("bfleetp", "plain"),
            EtcdSecurity::MutualTlsAndPassword => ("bfleet", "tls"),
        };
        for (k, v) in run_one(opts, *security, tag)? {
            figures.insert(format!("{prefix}_{k}"), v);
        }
    }
    println!(
        "target: p99 <= 50 ms after the leader's answer (the logs' row: the API rows add polling)"
    );
    Ok(figures)
}

fn run_one(opts: &Options, security: EtcdSecurity, tag: &str) -> Result<Figures> {
    let f = Fleet::build_with(tag, opts.balancers, 3, security).context("building the fleet")?;
    let leader = f.wait_for_leader(Duration::from_secs(15))?;
    let Timed {
        mut from_answer,
        mut from_request,
        answered_at,
    } = time_changes(&f, leader, opts)?;
    let epochs = from_logs(&f, leader, opts.changes)?;
    if epochs.len() != answered_at.len() {
        bail!(
            "the logs show {} of the {} publications",
            epochs.len(),
            answered_at.len()
        );
    }
    let series = |pick: &dyn Fn(&EpochTimes, f64) -> f64| -> Vec<f64> {
        epochs
            .iter()
            .zip(&answered_at)
            .map(|(e, a)| pick(e, *a) * 1e3)
            .collect()
    };
    let mut answer_to_published = series(&|e, a| e.published - a);
    let mut answer_to_live = series(&|e, a| e.live - a);
    let mut published_to_applied = series(&|e, _| e.applied - e.published);
    let mut published_to_live = series(&|e, _| e.live - e.published);
    let mut figures = Figures::new();
    println!(
        "\nfleet: {} balancers, etcd {}, {} weight changes on the leader (lb{})",
        opts.balancers,
        match security {
            EtcdSecurity::Plain => "plain",
            EtcdSecurity::MutualTlsAndPassword => "TLS + client certificates + password",
        },
        opts.changes,
        leader + 1
    );
    println!(
        "{:<52} {:>8} {:>8} {:>8}",
        "live on every follower's table, ms", "p50", "p99", "max"
    );
    for (name, samples) in [
        ("after the leader's answer", &mut from_answer),
        ("after the request was sent", &mut from_request),
        (
            "(logs) leader's answer -> tables live everywhere",
            &mut answer_to_live,
        ),
        (
            "(logs) leader's answer -> leader published",
            &mut answer_to_published,
        ),
        (
            "(logs) leader published -> last follower applied",
            &mut published_to_applied,
        ),
        (
            "(logs) leader published -> tables live everywhere",
            &mut published_to_live,
        ),
    ] {
        let (p50, p99, max) = (
            percentile(samples, 50.0),
            percentile(samples, 99.0),
            samples.iter().copied().fold(0.0, f64::max),
        );
        println!("{name:<52} {p50:>8.1} {p99:>8.1} {max:>8.1}");
        let key: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        figures.insert(format!("{key}_p50_ms"), p50);
        figures.insert(format!("{key}_p99_ms"), p99);
        figures.insert(format!("{key}_max_ms"), max);
    }
    figures.insert("changes".into(), opts.changes as f64);
    figures.insert("balancers".into(), opts.balancers as f64);
    Ok(figures)
}

/// Each change's delay until every follower's table is the leader's, in ms: from the
/// leader's answer and from the request; and the wall clock at each answer, to set beside the
/// logs' stamps (one machine, one clock).
struct Timed {
    from_answer: Vec<f64>,
    from_request: Vec<f64>,
    answered_at: Vec<f64>,
}

/// Sets a backend's weight on the leader `opts.changes` times, each time waiting until every
/// follower's table is the leader's.
fn time_changes(f: &Fleet, leader: usize, opts: &Options) -> Result<Timed> {
    let followers: Vec<usize> = (0..opts.balancers).filter(|i| *i != leader).collect();
    let path = format!("/v1/vips/{VIP}/backends/{}/weight", backend_addr(0));
    // Weights that each move the table from the one before (they differ by at least 10%).
    let weights = [100u32, 150, 200, 300, 120, 250];
    let (mut from_answer, mut from_request) = (Vec::new(), Vec::new());
    let mut answered_at = Vec::new();
    let mut last = fingerprint(f, leader)?;
    for k in 0..opts.changes {
        let weight = weights[(k + 1) % weights.len()];
        let started = Instant::now();
        let _: ChangeResult = f
            .api(leader)
            .call(
                "PUT",
                &path,
                Some(&WeightBody {
                    weight: weight as i64,
                }),
            )
            .map_err(|e| anyhow::anyhow!("setting the weight on lb{}: {e}", leader + 1))?;
        let answered = Instant::now();
        answered_at.push(wall_seconds_of_day());
        let want = fingerprint(f, leader)?;
        if want == last {
            bail!("weight {weight} did not change the leader's table");
        }
        let mut pending = followers.clone();
        while !pending.is_empty() {
            if answered.elapsed() > Duration::from_secs(10) {
                bail!(
                    "change {k}: lb{:?} not on the leader's table {want} after 10 s",
                    pending.iter().map(|i| i + 1).collect::<Vec<_>>()
                );
            }
            let mut still = Vec::new();
            for lb in pending {
                if fingerprint(f, lb)? != want {
                    still.push(lb);
                }
            }
            pending = still;
            if !pending.is_empty() {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let done = Instant::now();
        from_answer.push(done.duration_since(answered).as_secs_f64() * 1e3);
        from_request.push(done.duration_since(started).as_secs_f64() * 1e3);
        last = want;
    }
    Ok(Timed {
        from_answer,
        from_request,
        answered_at,
    })
}

/// One published epoch as the logs tell it, in seconds of the day.
struct EpochTimes {
    /// The leader's "published the state".
    published: f64,
    /// The last follower's "applied the published state".
    applied: f64,
    /// When the last follower's new table went live (its apply's `tables_live_ms`, before the
    /// kernel's wait for readers of the old table).
    live: f64,
}

/// From the log lines' own timestamps (RFC 3339, microseconds) of the agents' "published the
/// state epoch=E" (leader) and "applied the published state epoch=E" (followers): the last
/// `changes` epochs the leader published, oldest first. Set beside the wall clock of the
/// leader's API answers, these leave out the measurement's API polling (and the follower's
/// API, which waits while an apply holds the daemon); they include the leader's publication,
/// the etcd transaction, the watch and the follower's table publish.
fn from_logs(f: &Fleet, leader: usize, changes: usize) -> Result<Vec<EpochTimes>> {
    let read = |lb: usize| -> Result<String> {
        let path = f.rack.log_dir.join(format!("balancer-lb{}.log", lb + 1));
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let field = |l: &str, name: &str| -> Option<f64> {
        l.split(&format!("{name}="))
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    // Per epoch: (log time, log time - applied_ms + tables_live_ms), seconds of the day.
    let times = |text: &str, needle: &str| -> BTreeMap<u64, (f64, f64)> {
        text.lines()
            .filter(|l| l.contains(needle))
            .filter_map(|l| {
                let t = seconds_of_day(l.split_whitespace().next()?)?;
                let epoch = field(l, "epoch")? as u64;
                let live = match (field(l, "applied_ms"), field(l, "tables_live_ms")) {
                    (Some(a), Some(live)) => t - a / 1e3 + live / 1e3,
                    _ => t,
                };
                Some((epoch, (t, live)))
            })
            .collect()
    };
    let published = times(&read(leader)?, "published the state");
    let mut last: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for lb in (0..f.lbs.len()).filter(|i| *i != leader) {
        for (epoch, (t, live)) in times(&read(lb)?, "applied the published state") {
            let e = last.entry(epoch).or_insert((t, live));
            *e = (e.0.max(t), e.1.max(live));
        }
    }
    // The last `changes` epochs the leader published (the first one is its election's).
    let mut epochs: Vec<EpochTimes> = published
        .iter()
        .rev()
        .take(changes)
        .filter_map(|(epoch, (p, _))| {
            last.get(epoch).map(|(t, l)| EpochTimes {
                published: *p,
                applied: *t,
                live: *l,
            })
        })
        .collect();
    epochs.reverse();
    Ok(epochs)
}

/// Seconds since midnight (UTC) now, as the logs' stamps count them.
fn wall_seconds_of_day() -> f64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    since.as_secs_f64() % 86_400.0
}

/// Seconds since midnight of an RFC 3339 UTC stamp like 2026-12-01T23:17:16.712762Z.
fn seconds_of_day(stamp: &str) -> Option<f64> {
    let time = stamp.split('T').nth(1)?.trim_end_matches('Z');
    let mut parts = time.split(':');
    let (h, m, s): (f64, f64, f64) = (
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    );
    Some(h * 3600.0 + m * 60.0 + s)
}
