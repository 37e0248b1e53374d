//! The `noisy-tenant` shape: fair share between tenants at L4.
//!
//! After the shape's knee (found on its calm workload: four tenants at the same rate), each
//! repetition plays three runs at [`LOAD`] of the knee on the same seed:
//!
//! - `calm:composite-fair`: the tenants at their rate, fair admission;
//! - `noisy:composite-fair`: the same requests plus the noisy tenant's excess (4x its share in
//!   the middle third of the run), fair admission;
//! - `noisy:composite-cutoff`: the same noisy requests, the same policy without fairness.
//!
//! Each run's figures for the noisy period (the requests scheduled in it): the well-behaved
//! tenants' p99 TTFT (a failed request counts as the client's timeout) and goodput, the noisy
//! tenant's goodput; the pool's goodput over the whole run is the run's own. The targets
//! (`verdicts::fair_share`): the well-behaved tenants' p99 in the noisy period with fair
//! admission <= 1.2x the calm run's, and the pool's goodput with fair admission >= 0.95x the
//! run without it.

use super::*;
use crate::load::stats::percentile;

/// The calm load, as a fraction of the shape's knee (unless `--loads` gives one): with the
/// excess, the pool is offered 1.75 times that (1.31x the knee) in the noisy period.
pub const LOAD: f64 = 0.75;
/// The policy with fair admission, and the same without.
pub const CONTENDERS: [&str; 2] = ["composite-fair", "composite-cutoff"];
/// The run without the noisy tenant's excess.
pub const CALM: &str = "calm";
/// The run with it.
pub const NOISY: &str = "noisy";

/// The calm load as a fraction of the knee: [`LOAD`], or the one load `--loads` gives.
pub fn calm_load(opts: &Options) -> f64 {
    match opts.loads.as_slice() {
        [one] => *one,
        _ => LOAD,
    }
}

/// `calm:composite-fair` as ("calm", "composite-fair"); None for another name.
pub fn variant_of(name: &str) -> Option<(&str, &str)> {
    name.split_once(':')
        .filter(|(v, _)| *v == CALM || *v == NOISY)
}

/// A `noisy-tenant` run's figures by tenant, over the requests scheduled in the noisy period.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantFigures {
    /// The well-behaved tenants' p99 TTFT, seconds (a failed request counts as the client's
    /// timeout).
    pub well_ttft_p99: f64,
    /// Their requests within the SLO per second of the period.
    pub well_goodput: f64,
    pub well_failed: usize,
    /// The noisy tenant's requests within the SLO per second of the period.
    pub noisy_goodput: f64,
    pub noisy_failed: usize,
}

/// The noisy period of a `noisy-tenant` workload: the middle third of its arrivals' span (the
/// excess ends inside it, so the calm and the noisy workloads of a seed have the same).
pub fn noisy_period(work: &[workload::Conversation]) -> (f64, f64) {
    let end = work.iter().map(|c| c.start).fold(0.0, f64::max);
    (end / 3.0, 2.0 * end / 3.0)
}

/// The figures of a run of `work` that gave `outcomes`; a failed request's TTFT counts as
/// `failed_ttft` (the client's timeout).
pub fn tenant_figures(
    work: &[workload::Conversation],
    outcomes: &[Outcome],
    slo: Slo,
    failed_ttft: f64,
) -> TenantFigures {
    let (from, to) = noisy_period(work);
    let by_id: BTreeMap<usize, &workload::Conversation> = work.iter().map(|c| (c.id, c)).collect();
    let mut well_ttfts = Vec::new();
    let mut f = TenantFigures::default();
    let (mut well_good, mut noisy_good) = (0usize, 0usize);
    for o in outcomes {
        let Some(c) = by_id.get(&o.conversation) else {
            continue;
        };
        if !(from..to).contains(&c.start) {
            continue;
        }
        let Some(tenant) = workload::noisy_tenant_of(c.source) else {
            continue;
        };
        let good = slo.met(o);
        if tenant == workload::NOISY {
            noisy_good += usize::from(good);
            f.noisy_failed += usize::from(!o.ok());
        } else {
            well_good += usize::from(good);
            f.well_failed += usize::from(!o.ok());
            well_ttfts.push(match (o.ok(), o.ttft) {
                (true, Some(t)) => t,
                _ => failed_ttft,
            });
        }
    }
    let span = (to - from).max(1e-9);
    f.well_ttft_p99 = percentile(&mut well_ttfts, 99.0);
    f.well_goodput = well_good as f64 / span;
    f.noisy_goodput = noisy_good as f64 / span;
    f
}

/// The shape's runs at [`LOAD`] of `knee`: per repetition, the calm run and the noisy runs
/// with and without fair admission, on the same seed.
pub(super) fn runs(rack: &mut LlmRack, knee: f64, opts: &Options) -> Result<Vec<Run>> {
    let load = calm_load(opts);
    let rate = knee * load;
    let shape = Shape::NoisyTenant;
    let mut runs = Vec::new();
    for rep in 0..opts.reps.max(1) {
        let seed = opts.first_seed + rep as u64;
        let calm = workload::build(
            &WorkloadOptions {
                shape,
                requests: requests_at(opts, rate),
                rate,
                seed,
                trace_clients: opts.trace_clients,
                trace_time: opts.trace_time,
                seconds: opts.duration,
            },
            &[],
        )?;
        let (excess, _) = workload::noisy_excess(&calm, rate, seed);
        let mut noisy = calm.clone();
        noisy.extend(excess);
        noisy.sort_by(|a, b| a.start.total_cmp(&b.start));
        for (variant, base, work) in [
            (CALM, CONTENDERS[0], &calm),
            (NOISY, CONTENDERS[0], &noisy),
            (NOISY, CONTENDERS[1], &noisy),
        ] {
            let c = Contender::parse(base, opts.scrape_ms)?;
            let name = format!("{variant}:{base}");
            let run = played_run(
                rack,
                Point {
                    shape,
                    contender: &name,
                    rate,
                    load,
                    rep,
                },
                &c,
                work,
                opts,
                None,
            )?;
            if let Some(t) = &run.tenants {
                println!(
                    "    noisy period: well-behaved p99 TTFT {:.2} s, goodput {:.2}/s ({} failed); noisy tenant goodput {:.2}/s ({} failed)",
                    t.well_ttft_p99, t.well_goodput, t.well_failed, t.noisy_goodput, t.noisy_failed
                );
            }
            if base == CONTENDERS[0] {
                // What admission decided so far (the daemon's counters, since it started).
                let page = rack.metrics_page_in_lb(METRICS_PORT)?;
                println!(
                    "    admission since the daemon started: {}",
                    admission_line(&page)
                );
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

/// The LLM VIP's admission counters and measured capacity on a metrics page, in a line.
fn admission_line(page: &str) -> String {
    let mut parts = Vec::new();
    for line in page.lines() {
        let Some(rest) = line
            .strip_prefix("balancer_admission_flows_total{")
            .or_else(|| line.strip_prefix("balancer_admission_capacity{"))
        else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        if value.trim() == "0" {
            continue;
        }
        let labels: Vec<&str> = labels
            .split(',')
            .filter(|l| !l.starts_with("vip="))
            .map(|l| l.split_once('=').map_or(l, |(_, v)| v.trim_matches('"')))
            .collect();
        let what = if labels.is_empty() {
            "capacity".to_string()
        } else {
            labels.join(" ")
        };
        parts.push(format!("{what} {}", value.trim()));
    }
    if parts.is_empty() {
        "nothing counted (the pool never saturated)".into()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn request(id: usize, start: f64, last_octet: u8) -> workload::Conversation {
        workload::Conversation {
            id,
            start,
            source: IpAddr::V4(Ipv4Addr::new(10, 111, 0, last_octet)),
            turns: Vec::new(),
        }
    }

    fn outcome(id: usize, ttft: Option<f64>) -> Outcome {
        Outcome {
            conversation: id,
            turn: 0,
            sent: 0.0,
            ttft,
            e2e: ttft.map(|t| t + 1.0),
            itl: Some(0.05),
            tokens: 10,
            prompt_words: 10,
            backend: None,
            error: ttft.is_none().then(|| "refused".to_string()),
        }
    }

    #[test]
    fn the_noisy_period_s_requests_count_by_tenant() {
        // Arrivals over 0..30 s: the period is 10..20 s. Tenant 0 is 10.111.0.112/28, the
        // noisy tenant (3) 10.111.0.160/28.
        let work = vec![
            request(0, 0.0, 112),
            request(1, 12.0, 113),
            request(2, 15.0, 114),
            request(3, 16.0, 160),
            request(4, 17.0, 161),
            request(5, 25.0, 115),
            request(6, 30.0, 116),
            request(7, 14.0, 50),
        ];
        let outcomes = vec![
            outcome(0, Some(9.0)),
            outcome(1, Some(0.5)),
            outcome(2, Some(1.5)),
            outcome(3, Some(0.2)),
            outcome(4, None),
            outcome(5, Some(9.0)),
            outcome(6, Some(9.0)),
            outcome(7, Some(9.0)),
        ];
        let f = tenant_figures(&work, &outcomes, Slo::default(), 300.0);
        // In the period, well-behaved: 1 (0.5 s) and 2 (1.5 s); 7 is of no tenant.
        assert_eq!(f.well_ttft_p99, 1.5);
        assert_eq!(f.well_goodput, 2.0 / 10.0);
        assert_eq!(f.well_failed, 0);
        assert_eq!(f.noisy_goodput, 1.0 / 10.0);
        assert_eq!(f.noisy_failed, 1);
        // A failed well-behaved request counts as the timeout.
        let mut failed = outcomes.clone();
        failed[1] = outcome(1, None);
        let f = tenant_figures(&work, &failed, Slo::default(), 300.0);
        assert_eq!(f.well_ttft_p99, 300.0);
        assert_eq!(f.well_failed, 1);
    }

    #[test]
    fn the_admission_line_reads_the_llm_vip_s_counters() {
        let page = "# HELP x\n\
            balancer_admission_capacity{vip=\"llm\"} 12.5\n\
            balancer_admission_flows_total{vip=\"llm\",tier=\"tenant-3\",outcome=\"shed_over_cap\"} 40\n\
            balancer_admission_flows_total{vip=\"llm\",tier=\"tenant-0\",outcome=\"shed_over_cap\"} 0\n\
            balancer_admission_flows_total{vip=\"llm\",tier=\"tenant-0\",outcome=\"admitted\"} 7\n";
        assert_eq!(
            admission_line(page),
            "capacity 12.5, tenant-3 shed_over_cap 40, tenant-0 admitted 7"
        );
        assert_eq!(
            admission_line("balancer_vip_flows{vip=\"llm\"} 3\n"),
            "nothing counted (the pool never saturated)"
        );
    }

    #[test]
    fn variants_name_their_policy() {
        assert_eq!(
            variant_of("noisy:composite-fair"),
            Some(("noisy", "composite-fair"))
        );
        assert_eq!(variant_of("vllm:cache_aware"), None);
        assert!(Contender::describe("calm:composite-fair").ends_with("(calm)"));
    }
}
