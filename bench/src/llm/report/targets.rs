//! The report's targets section: each target's figures at every load and whether it is met.

use super::*;

/// The targets, computed from the medians.
pub(super) fn targets(
    s: &ShapeResult,
    _res: &Results,
    names: &[String],
    loads: &[f64],
    g: &ByPoint<'_>,
    md: &mut String,
    f: &mut Figures,
) {
    let m = Medians {
        g,
        shape: s.shape.name(),
    };
    let _ = writeln!(md, "\n### Targets\n");
    over_round_robin(&m, names, loads, md, f);
    over_routers(&m, names, md, f);
    if s.shape.multi_turn() {
        affinity_over_load_only(&m, names, md, f);
    }
    if let Some(layout) = s.shape.tenants() {
        tenant_affinity(&m, layout.prefix_v4, md, f);
    }
}

/// A shape's medians by contender, load and metric.
struct Medians<'a> {
    g: &'a ByPoint<'a>,
    shape: &'a str,
}

impl Medians<'_> {
    fn med(&self, n: &str, l: f64, metric: &str) -> Option<f64> {
        stat(self.g.get(&(n.to_string(), load_key(l)))?, metric).map(|x| x.0)
    }

    /// At the knee.
    fn at(&self, n: &str, metric: &str) -> Option<f64> {
        self.med(n, 1.0, metric)
    }
}

/// The best balancer policy over 50-100% of the knee against round robin: p99 TTFT at most
/// half, goodput and throughput no lower, at every load.
fn over_round_robin(
    m: &Medians,
    names: &[String],
    loads: &[f64],
    md: &mut String,
    f: &mut Figures,
) {
    let shape = m.shape;
    let mid: Vec<f64> = loads
        .iter()
        .copied()
        .filter(|l| (0.5 - 1e-9..=1.0 + 1e-9).contains(l))
        .collect();
    // The best L4 policy: the lowest geometric mean of p99 TTFT over 50-100% of the knee.
    let score = |n: &str| -> Option<f64> {
        let v: Option<Vec<f64>> = mid.iter().map(|l| m.med(n, *l, "ttft_p99_s")).collect();
        let v = v?;
        (!v.is_empty())
            .then(|| (v.iter().map(|x| x.max(1e-6).ln()).sum::<f64>() / v.len() as f64).exp())
    };
    let best_ours = names
        .iter()
        .filter(|n| is_load_aware_ours(n))
        .filter_map(|n| Some((n.clone(), score(n)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((best, _)) = &best_ours
        && names.iter().any(|n| n == "round-robin")
    {
        let mut ok = true;
        let _ = writeln!(
            md,
            "- Best balancer policy (over 50–100% of the knee): `{best}`. p99 TTFT / round robin's, goodput and throughput / round robin's, per load:"
        );
        for l in &mid {
            let (Some(a), Some(b)) = (
                m.med(best, *l, "ttft_p99_s"),
                m.med("round-robin", *l, "ttft_p99_s"),
            ) else {
                continue;
            };
            let gp = m
                .med(best, *l, "goodput_rps")
                .zip(m.med("round-robin", *l, "goodput_rps"));
            let tp =
                m.med(best, *l, "throughput_rps")
                    .zip(m.med("round-robin", *l, "throughput_rps"));
            let ratio = a / b;
            let gr = gp.map(|(x, y)| x / y.max(1e-9));
            let tr = tp.map(|(x, y)| x / y.max(1e-9));
            ok &= ratio <= 0.5 && gr.is_none_or(|r| r >= 0.98) && tr.is_none_or(|r| r >= 0.98);
            let _ = writeln!(
                md,
                "  - {:.0}%: p99 {ratio:.2}x, goodput {}, throughput {}",
                l * 100.0,
                gr.map_or("–".into(), |r| format!("{r:.2}x")),
                tr.map_or("–".into(), |r| format!("{r:.2}x"))
            );
            f.insert(
                format!("{shape}/target/best_over_rr_p99/{}", load_key(*l)),
                ratio,
            );
        }
        let _ = writeln!(
            md,
            "  - target (p99 <= 0.5x, goodput and throughput no lower, at every load): **{}**",
            if ok { "met" } else { "missed" }
        );
        f.insert(
            format!("{shape}/target/best_over_rr_met"),
            f64::from(u8::from(ok)),
        );
    }
}

/// The best balancer policy against the best L7 router policy at the knee: p99 TTFT and CPU
/// per request.
fn over_routers(m: &Medians, names: &[String], md: &mut String, f: &mut Figures) {
    let shape = m.shape;
    let best_router = names
        .iter()
        .filter(|n| n.contains(':'))
        .filter_map(|n| Some((n.clone(), m.at(n, "ttft_p99_s")?)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let best_ours_knee = names
        .iter()
        .filter(|n| is_load_aware_ours(n))
        .filter_map(|n| Some((n.clone(), m.at(n, "ttft_p99_s")?)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let (Some((r, rp)), Some((b, bp))) = (&best_router, &best_ours_knee) {
        let ratio = bp / rp;
        let cpu = m
            .at(b, "cpu_s_per_1k_requests")
            .zip(m.at(r, "cpu_s_per_1k_requests"));
        let cpu_ratio = cpu.map(|(x, y)| x / y.max(1e-12));
        let _ = writeln!(
            md,
            "- At the knee, best balancer policy `{b}` against the best router policy `{r}`: p99 TTFT {bp:.2} s vs {rp:.2} s = **{ratio:.2}x** (target <= 1.2x); CPU per request {} (target <= 1/20 = 0.05x)",
            cpu_ratio.map_or("–".into(), |c| format!("**{c:.3}x**"))
        );
        f.insert(format!("{shape}/target/ours_over_best_router_p99"), ratio);
        if let Some(c) = cpu_ratio {
            f.insert(format!("{shape}/target/ours_over_best_router_cpu"), c);
        }
    }
}

/// Multi-turn: each session-affinity policy against the load-only composite at the knee.
fn affinity_over_load_only(m: &Medians, names: &[String], md: &mut String, f: &mut Figures) {
    let shape = m.shape;
    for (policy, what) in [
        ("affinity", "source hash"),
        ("persistence", "session persistence"),
        (
            "persistence-unbounded",
            "session persistence without a load bound",
        ),
    ] {
        let (Some(a), Some(c)) = (
            m.at(policy, "ttft_mean_s"),
            m.at("composite", "ttft_mean_s"),
        ) else {
            continue;
        };
        let p99 = m
            .at(policy, "ttft_p99_s")
            .zip(m.at("composite", "ttft_p99_s"));
        let per_contender = |metric: &str| {
            names
                .iter()
                .filter_map(|n| Some(format!("`{n}` {:.0}%", m.at(n, metric)? * 100.0)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        // Why returning clients' flows went elsewhere (the daemon's persistence counters).
        let refused = match (
            m.at(policy, "returning_over_bound"),
            m.at(policy, "returning_sent_elsewhere"),
        ) {
            (Some(b), Some(v)) => format!(
                "; of returning clients' new flows, sent elsewhere by the bound {:.0}% and by the policy's verdict {:.0}%",
                b * 100.0,
                v * 100.0
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            md,
            "- Session affinity by {what} (`{policy}`) against load only (`composite`) at the knee: mean TTFT {:.2} s vs {c:.2} s = **{:.2}x lower** (target >= 1.5x), p99 {}; prefix-cache hit rates: {}; later turns served by another server than the turn before: {} (after a turn on a large GPU: {}; on a small one: {}){refused}",
            a,
            c / a,
            p99.map_or("–".into(), |(x, y)| format!("{x:.2} s vs {y:.2} s")),
            per_contender("prefix_hit_rate"),
            per_contender("turns_moved"),
            per_contender("turns_moved_from_large"),
            per_contender("turns_moved_from_small"),
        );
        f.insert(
            format!("{shape}/target/composite_over_{policy}_mean_ttft"),
            c / a,
        );
    }
}

/// Tenant shapes: tenant affinity against per-address affinity and load only at the knee.
fn tenant_affinity(m: &Medians, prefix_v4: u8, md: &mut String, f: &mut Figures) {
    let shape = m.shape;
    {
        let tenant = crate::llm::contenders::tenant_affinity(prefix_v4);
        if let Some(t) = m.at(&tenant, "ttft_mean_s") {
            let against = |other: &str| {
                m.at(other, "ttft_mean_s").map(|o| {
                    let p99 = m.at(&tenant, "ttft_p99_s").zip(m.at(other, "ttft_p99_s"));
                    format!(
                        "`{other}` {o:.2} s ({:.2}x; p99 {})",
                        o / t,
                        p99.map_or("–".into(), |(x, y)| format!("{x:.2} s vs {y:.2} s"))
                    )
                })
            };
            let _ = writeln!(
                md,
                "- Tenant affinity (`{tenant}`) at the knee: mean TTFT {t:.2} s against {}; prefix-cache hit rate {}",
                ["affinity", "composite"]
                    .iter()
                    .filter_map(|o| against(o))
                    .collect::<Vec<_>>()
                    .join(", "),
                m.at(&tenant, "prefix_hit_rate")
                    .map_or("–".into(), |h| format!("{:.0}%", h * 100.0))
            );
            if let Some(c) = m.at("composite", "ttft_mean_s") {
                f.insert(
                    format!("{shape}/target/composite_over_tenant_affinity_mean_ttft"),
                    c / t,
                );
            }
        }
    }
}
