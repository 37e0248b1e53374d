//! The calibration's report: the real server's and the simulator's timelines side by side, what
//! agrees and what differs, and the plot.

use super::*;

pub(super) fn report(
    out_dir: &Path,
    version: &str,
    (step1, step4, prefill): (f64, f64, f64),
    counts: &[u64],
    real: &Timeline,
    sim: &Timeline,
) -> Result<Figures> {
    for (t, name) in [(real, "real"), (sim, "sim")] {
        if t.readings.len() < 10 {
            bail!(
                "only {} readings of the {name} server's page",
                t.readings.len()
            );
        }
    }
    let mut f = Figures::new();
    let mut rows: Vec<(String, String, String)> = Vec::new();
    for row in comparison() {
        let (a, b) = ((row.of)(real), (row.of)(sim));
        f.insert(format!("real_{}", row.key), a);
        f.insert(format!("sim_{}", row.key), b);
        let digits = row.digits;
        rows.push((row.what, format!("{a:.digits$}"), format!("{b:.digits$}")));
    }
    std::fs::create_dir_all(out_dir)?;
    let svg = out_dir.join("calibration.svg");
    plot(&svg, real, sim)?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# The simulator against the real vLLM\n\n`cargo xtask bench calibrate`: vLLM {version} (CPU build, the tiny model; KV cache 32 blocks of 128 tokens, \
         4 requests at most) and `sim-llm` given the same cache, batch, a 2,048-token step budget and the real server's measured times \
         (a step of {:.1} ms with 1 request and {:.1} ms with 4; prefill {prefill:.0} tokens/s). The burst: 8 concurrent streamed requests of \
         {:?} prompt tokens (the real tokenizer's count; the simulator got as many words) and 600 output tokens each, then a {}-token \
         prompt twice in a row, then 8 concurrent requests of {:?} prompt tokens and 16 output tokens (prefills that share steps); each page read every 50 ms.\n\n| | real vLLM | simulator |\n| --- | ---: | ---: |",
        step1 * 1e3,
        step4 * 1e3,
        &counts[..8],
        counts[8],
        &counts[9..]
    );
    for (what, a, b) in &rows {
        let _ = writeln!(md, "| {what} | {a} | {b} |");
    }
    let _ = writeln!(
        md,
        "\n![running, waiting and KV use over the burst](calibration.svg)\n"
    );
    md.push_str(NOTES);
    let path = out_dir.join("calibration.md");
    std::fs::write(&path, &md)?;
    println!("{md}\nwrote {}", path.display());
    Ok(f)
}

/// One figure of the comparison, read from each server's timeline.
struct Compared {
    what: String,
    key: String,
    of: Box<dyn Fn(&Timeline) -> f64>,
    digits: usize,
}

fn compared(
    what: &str,
    key: &str,
    digits: usize,
    of: impl Fn(&Timeline) -> f64 + 'static,
) -> Compared {
    Compared {
        what: what.to_string(),
        key: key.to_string(),
        of: Box::new(of),
        digits,
    }
}

/// The figures the report compares, in its order.
fn comparison() -> Vec<Compared> {
    let mut rows = vec![
        compared("burst: first request to last token, s", "burst_s", 1, |t| {
            t.burst
        }),
        compared("peak requests running", "peak_running", 0, |t| {
            peak(&t.readings, |x| x.running)
        }),
        compared("peak requests waiting", "peak_waiting", 0, |t| {
            peak(&t.readings, |x| x.waiting)
        }),
        compared("peak KV use", "peak_kv", 3, |t| peak(&t.readings, |x| x.kv)),
        compared("pages read while requests ran", "busy_readings", 0, |t| {
            busy(&t.readings).len() as f64
        }),
        compared(
            "share of them after which generation_tokens_total had moved",
            "gen_moved_share",
            2,
            |t| moved_share(&t.readings, |x| x.generation_tokens),
        ),
        compared(
            "share after which prompt_tokens_total had moved",
            "prompt_moved_share",
            2,
            |t| moved_share(&t.readings, |x| x.prompt_tokens),
        ),
        compared(
            "share after which KV use had changed",
            "kv_moved_share",
            2,
            |t| moved_share(&t.readings, |x| x.kv),
        ),
        compared(
            "s until generation_tokens_total first moved",
            "gen_first_s",
            2,
            |t| first_move(&t.readings, |x| x.generation_tokens).unwrap_or(f64::NAN),
        ),
        compared("preemptions", "preemptions", 0, |t| {
            growth(&t.readings, |x| x.preemptions)
        }),
        compared(
            "prompt tokens counted over the bursts and the repeats",
            "prompt_tokens",
            0,
            |t| growth(&t.readings, |x| x.prompt_tokens),
        ),
        compared("generation tokens counted", "generation_tokens", 0, |t| {
            growth(&t.readings, |x| x.generation_tokens)
        }),
    ];
    for (long, during) in [(false, "all readings"), (true, "the long prompts' burst")] {
        let key = if long { "long" } else { "all" };
        let span = move |t: &Timeline| long.then_some(t.long_burst);
        rows.push(compared(
            &format!("requests without a first token, by the client, mean over {during} in flight"),
            &format!("unanswered_{key}"),
            2,
            move |t| busy_mean(t, span(t), |x| x.unanswered),
        ));
        rows.push(compared(
            &format!(
                "  mean error of the balancer's count from the page (running + waiting - first tokens + finished), {during}"
            ),
            &format!("prefilling_error_{key}"),
            2,
            move |t| busy_mean(t, span(t), |x| (x.prefilling - x.unanswered).abs()),
        ));
        rows.push(compared(
            &format!("  mean error of `waiting` alone, {during}"),
            &format!("waiting_error_{key}"),
            2,
            move |t| busy_mean(t, span(t), |x| (x.waiting - x.unanswered).abs()),
        ));
    }
    rows.push(compared(
        "cached tokens of the repeated prompt",
        "repeat_hits",
        0,
        |t| t.repeat_hits,
    ));
    rows
}

/// What the comparison shows and why the differences do not bias a comparison of routers
/// (kept next to the code that measures it).
pub(super) const NOTES: &str = "## What agrees, what differs, and why it does not bias the comparison\n\n\
- **Gauges and counters move per engine step in both**: running, waiting and KV use change between two readings 50 ms apart \
while requests run, and `generation_tokens_total` rises during a request, not at its end; `prompt_tokens_total` and \
`prefix_cache_queries_total` count a request once, when it is first scheduled (not again after a preemption). A policy that \
reads them sees the same kind of signal from either.\n\
- **KV use grows block by block** as requests generate (vLLM allocates blocks as tokens arrive; the simulator does the same), \
so a server fills during a burst rather than at admission, and a full cache queues and preempts in both. vLLM counts use over \
the usable blocks (one block of the pool is its null block: 31 of 32 here), so its figure is a little higher for the same \
tokens; policies compare servers with the same rule, so a common offset does not change a choice.\n\
- **Prefix hits come in whole blocks** in both (128-token blocks here, 16 on the simulated GPUs, as vLLM on GPUs): a repeated \
prompt finds its leading full blocks, at least its last token is computed again.\n\
- **Admission between steps**: a request that arrives while a step runs waits for its end in both; the simulator's first step of a burst is a prefill, so the burst's later arrivals show as waiting for a moment (a higher peak of `waiting`) before the batch fills; the real engine admits them over its first few short steps. It is a transient of tens of milliseconds.\n\
- **Timing**: the simulator's steps follow `base + per-request x batch + prefill tokens / rate` with the times measured on the \
real server; the real server's steps vary more (Python, two cores shared with the client and the simulator), and it shares \
one core between its API server and its engine, so its `/metrics` can lag by hundreds of milliseconds under load (the poller's \
readings thin out during the burst). The routing benchmark's simulated GPUs are faster and steadier than this CPU server; \
that is the point of simulating them, and every contender — the balancer and the L7 routers — meets the same servers.\n\
- **Requests without a first token** (what the composite policy counts ahead of a new request): the count the balancer \
derives from the page — requests in flight less those past their first token (`time_to_first_token_seconds_count` less \
`request_prompt_tokens_count`, which vLLM observes as a request finishes) — agrees with the client's own count in both, but \
for requests in transit (sent, not yet on the page: all of the real server's error above; the policy counts those from the \
data plane's new flows). The CPU build prefills hundreds of tokens in milliseconds, so no reading 50 ms apart caught a request \
running in its prefill on either server and the count equals `waiting` here; on GPUs serving long prompts a chunked prefill \
runs over several steps, which the simulated GPUs of the routing benchmark show.\n\
- **Left out** by the simulator: sampling and detokenization costs, speculative decoding, LoRA, CUDA graphs, KV offloading, \
the prefill/decode interference of attention kernels beyond the per-request step cost. None is visible to a router except \
through the signals above.\n";

pub(super) fn plot(path: &Path, real: &Timeline, sim: &Timeline) -> Result<()> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
    let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let halves = root.split_evenly((2, 1));
    for (area, (t, name)) in halves.iter().zip([(real, "real vLLM"), (sim, "simulator")]) {
        let t0 = t.readings.first().map_or(0.0, |r| r.t);
        let end = t.readings.last().map_or(1.0, |r| r.t - t0).max(0.1);
        let mut c = ChartBuilder::on(area)
            .caption(
                format!("{name}: running, waiting, without a first token; KV use x 10"),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(40)
            .build_cartesian_2d(0.0..end, 0.0..10.5)
            .map_err(|e| err(&e))?;
        c.configure_mesh().x_desc("s").draw().map_err(|e| err(&e))?;
        for (label, color, f) in [
            (
                "running",
                RED,
                (|r: &Reading| r.running) as fn(&Reading) -> f64,
            ),
            ("waiting", BLUE, |r: &Reading| r.waiting),
            ("KV use x 10", GREEN, |r: &Reading| r.kv * 10.0),
            ("no first token (page)", MAGENTA, |r: &Reading| r.prefilling),
            ("no first token (client)", BLACK, |r: &Reading| r.unanswered),
        ] {
            c.draw_series(LineSeries::new(
                t.readings.iter().map(|r| (r.t - t0, f(r))),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
