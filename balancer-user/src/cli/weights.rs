use std::process::ExitCode;

use balancer::state::wire::VipWeights;

use super::EXIT_NOT_FOUND;
use super::client_args::{ClientArgs, fail, print_json};

/// Show what each backend reports and the weight the VIP's policy makes of it, with the
/// reason (saturated, stale, floor, hysteresis hold, ...).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  balancer weights\n  balancer weights llm --json")]
pub struct WeightsArgs {
    /// Only this VIP.
    vip: Option<String>,
}

pub fn run(args: WeightsArgs, opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    let all = match opts.client()?.get::<Vec<VipWeights>>("/v1/weights") {
        Ok(all) => all,
        Err(e) => return Ok(fail(&e)),
    };
    let shown: Vec<VipWeights> = all
        .into_iter()
        .filter(|v| args.vip.as_ref().is_none_or(|name| *name == v.vip))
        .collect();
    if let Some(name) = &args.vip
        && shown.is_empty()
    {
        eprintln!("error: no VIP named {name:?}");
        return Ok(ExitCode::from(EXIT_NOT_FOUND));
    }
    if opts.json {
        print_json(&shown);
        return Ok(ExitCode::SUCCESS);
    }
    for v in &shown {
        let admission = match v.pool_saturated {
            Some(true) => ", admission: pool saturated (admitted tiers only)",
            Some(false) => ", admission: pool open",
            None => "",
        };
        let pace = v
            .scrape_interval_ms
            .map(|ms| format!(", next scrape {:.1} s after the last", ms as f64 / 1000.0))
            .unwrap_or_default();
        println!(
            "VIP {}: policy {}, telemetry {}{pace}{admission}",
            v.vip, v.policy, v.telemetry
        );
        println!(
            "{:<26} {:>6} {:>5} {:>6} {:>5} {:>5} {:>7} {:>9} {:>8} {:>6} {:>6} {:>7}  REASON",
            "BACKEND",
            "WEIGHT",
            "CONF",
            "KV",
            "RUN",
            "WAIT",
            "PREFILL",
            "GPU FREE",
            "TOK/S",
            "PREFIX",
            "FLOWS",
            "AGE"
        );
        for b in &v.backends {
            let s = b.signals.clone().unwrap_or_default();
            let opt =
                |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map(f).unwrap_or_else(|| "-".into());
            let mut reason = b.reason.clone();
            if let Some(e) = &b.last_error
                && b.errors > 0
            {
                reason.push_str(&format!(" (last error: {e})"));
            }
            println!(
                "{:<26} {:>6} {:>5} {:>6} {:>5} {:>5} {:>7} {:>9} {:>8} {:>6} {:>6} {:>7}  {}",
                b.address.to_string(),
                b.weight,
                b.configured_weight,
                opt(s.kv_usage, &|v| format!("{:.1}%", v * 100.0)),
                opt(s.running, &|v| format!("{v:.0}")),
                opt(s.waiting, &|v| format!("{v:.0}")),
                opt(s.prefilling, &|v| format!("{v:.0}")),
                opt(s.gpu_memory_free_bytes(), &|v| format!("{:.1}G", v / 1e9)),
                opt(s.tokens_per_second, &|v| format!("{v:.0}")),
                opt(s.prefix_cache_hit_rate, &|v| format!("{:.0}%", v * 100.0)),
                b.flows,
                b.report_age_ms
                    .map(|a| format!("{a}ms"))
                    .unwrap_or_else(|| "-".into()),
                reason
            );
        }
        println!();
    }
    Ok(ExitCode::SUCCESS)
}
