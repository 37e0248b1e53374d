//! Where a shape's knee lies (the highest load at which the best load-aware policy keeps p99 TTFT
//! within the line), and the latency each contender adds on an idle pool.

use super::*;

/// The knee of a shape: the highest rate at which the best of composite and least-conn keeps
/// p99 TTFT within `knee_ttft` with nothing failed, bracketed by doubling or halving from 2
/// requests/s, then 3 bisections.
pub(super) fn find_knee(
    rack: &mut LlmRack,
    shape: Shape,
    trace: &[TraceRequest],
    opts: &Options,
) -> Result<(f64, Vec<Run>)> {
    let mut probes = Vec::new();
    let passes = |rack: &mut LlmRack, rate: f64, probes: &mut Vec<Run>| -> Result<bool> {
        let mut ok = false;
        for name in ["composite", "least-conn"] {
            let r = measured_run(
                rack,
                Point {
                    shape,
                    contender: name,
                    rate,
                    load: 0.0,
                    rep: 0,
                },
                trace,
                opts,
            )?;
            ok |= r.summary.failed == 0 && r.summary.ttft_p99 <= opts.knee_ttft;
            probes.push(r);
            if ok {
                break;
            }
        }
        Ok(ok)
    };
    // Bracket the knee by doubling (or halving) from 2 requests/s.
    let (mut good, mut bad);
    let mut rate = 2.0;
    if passes(rack, rate, &mut probes)? {
        loop {
            good = rate;
            rate *= 2.0;
            if rate > 64.0 {
                bail!("{}: no knee below 64 requests/s", shape.name());
            }
            if !passes(rack, rate, &mut probes)? {
                bad = rate;
                break;
            }
        }
    } else {
        loop {
            bad = rate;
            rate /= 2.0;
            if rate < 0.1 {
                bail!(
                    "{}: even 0.1 requests/s miss a p99 TTFT of {} s",
                    shape.name(),
                    opts.knee_ttft
                );
            }
            if passes(rack, rate, &mut probes)? {
                good = rate;
                break;
            }
        }
    }
    for _ in 0..3 {
        let mid = (good + bad) / 2.0;
        if passes(rack, mid, &mut probes)? {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Ok((good, probes))
}

/// 30 one-token requests, one at a time, to `addr` from the client: their outcomes.
pub(super) fn idle_probe(rack: &LlmRack, addr: SocketAddr) -> Result<Vec<Outcome>> {
    let target = Target {
        addr,
        model: MODEL.into(),
    };
    let work: Vec<workload::Conversation> = (0..30)
        .map(|i| workload::Conversation {
            id: i,
            start: i as f64 * 0.25,
            source: workload::client_addresses(1)[0],
            turns: vec![workload::Turn {
                message: format!("idle probe {i}"),
                output_tokens: 1,
                think: 0.0,
            }],
        })
        .collect();
    let outcomes = rack.topo.client.run_in(move || {
        client::run(
            &target,
            &work,
            ClientOptions {
                timeout: Duration::from_secs(10),
                keep_alive: false,
                bind_sources: true,
                give_up: None,
            },
        )
    })?;
    if let Some(e) = outcomes.iter().find_map(|o| o.error.clone()) {
        bail!("an idle probe to {addr} failed: {e}");
    }
    Ok(outcomes)
}

/// The TTFT each contender adds on an idle pool: each request's TTFT against the median TTFT
/// of the same server reached directly (servers of two sizes answer in different times).
pub(super) fn idle_latency(
    rack: &mut LlmRack,
    names: &[String],
    opts: &Options,
) -> Result<(f64, BTreeMap<String, f64>)> {
    rack.start_sims()?;
    let mut direct: BTreeMap<String, f64> = BTreeMap::new();
    for i in 0..rack.gpus.len() {
        let o = idle_probe(rack, SocketAddr::new(backend4(i).into(), LLM_PORT))?;
        let t: Vec<f64> = o.iter().filter_map(|o| o.ttft).collect();
        let name = o
            .iter()
            .find_map(|o| o.backend.clone())
            .context("no x-served-by")?;
        direct.insert(name, crate::load::stats::median(&t));
    }
    let mut added = BTreeMap::new();
    // One balancer policy stands for all (the data path is the same); each router policy on
    // its own (some ask every server before they route).
    for name in names {
        let c = Contender::parse(name, opts.scrape_ms)?;
        let key = match &c {
            Contender::Balancer { .. } => "balancer".to_string(),
            Contender::Router { .. } => c.name(),
        };
        if added.contains_key(&key) {
            continue;
        }
        rack.start_sims()?;
        let addr = rack.prepare(&c)?;
        let outcomes = idle_probe(rack, addr)?;
        rack.router = None;
        let extra: Vec<f64> = outcomes
            .iter()
            .filter_map(|o| Some(o.ttft? - direct.get(o.backend.as_ref()?)?))
            .collect();
        added.insert(key, crate::load::stats::median(&extra));
    }
    let base = crate::load::stats::median(&direct.values().copied().collect::<Vec<_>>());
    Ok((base, added))
}
