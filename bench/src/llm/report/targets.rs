//! The report's targets section: every ratio the benchmark states, with its interval over
//! paired seeds and, for a target, its verdict (`super::super::verdicts`).

use super::*;
use crate::llm::verdicts::{self, Samples};

/// States the shape's ratios into `md` and `f`.
pub(super) fn targets(
    s: &ShapeResult,
    names: &[String],
    g: &ByPoint<'_>,
    md: &mut String,
    f: &mut Figures,
) {
    let stated = verdicts::stated(&samples(&s.runs));
    let _ = writeln!(
        md,
        "\n### Targets\n\nEach ratio: the mean over the repetitions both contenders ran (the same \
         seeds), with a bootstrap 95% interval over those pairs. A target is met when the whole \
         interval keeps its line, missed when none of it does, undecided otherwise.\n"
    );
    for st in &stated {
        let _ = writeln!(md, "- {}: {}", st.what, st.reading());
    }
    if let Some(v) = verdicts::over_round_robin_overall(&stated) {
        let _ = writeln!(
            md,
            "- Against round robin at every load (p99, goodput, throughput): **{}**",
            v.word()
        );
    }
    if stated.is_empty() {
        let _ = writeln!(md, "- (no pair of contenders that a target compares ran)");
    }
    if s.shape.multi_turn() {
        affinity_details(names, g, md);
    }
    verdicts::insert(f, s.shape.name(), &stated);
    let undecided = verdicts::undecided(&stated);
    if undecided > 0 {
        let _ = writeln!(
            md,
            "\n{undecided} target(s) undecided: more repetitions (`--reps auto`) narrow the intervals."
        );
    }
}

/// `runs`' figures by contender, load and repetition.
pub(crate) fn samples(runs: &[Run]) -> Samples {
    Samples::of_runs(
        runs.iter()
            .map(|r| (r.contender.as_str(), r.load, r.rep, metrics(r))),
    )
}

/// Multi-turn, at the knee: where each contender's requests found their prefixes and how
/// often a conversation moved (medians over repetitions).
fn affinity_details(names: &[String], g: &ByPoint<'_>, md: &mut String) {
    let knee = load_key(1.0);
    let at: Vec<_> = names
        .iter()
        .filter_map(|n| Some((n, g.get(&(n.clone(), knee.clone()))?)))
        .collect();
    if at.is_empty() {
        return;
    }
    let per_contender = |metric: &str| {
        at.iter()
            .filter_map(|(n, runs)| Some(format!("`{n}` {:.0}%", stat(runs, metric)?.0 * 100.0)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        md,
        "- At the knee (medians): prefix-cache hit rates {}; later turns served by another server than the turn before {} (after a turn on a large GPU: {}; on a small one: {}); of returning clients' new flows, sent elsewhere by persistence's bound {} and by the policy's verdict {}",
        per_contender("prefix_hit_rate"),
        per_contender("turns_moved"),
        per_contender("turns_moved_from_large"),
        per_contender("turns_moved_from_small"),
        per_contender("returning_over_bound"),
        per_contender("returning_sent_elsewhere"),
    );
}
