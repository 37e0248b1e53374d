//! The cost of the backend-side passive latency programs (tc) per packet.

use super::*;

/// The backend side's passive latency programs (`balancer report --passive-latency`, tc):
/// ns per packet with the kernel's `repeat`, the skb test run's own cost included (a tc
/// program's test run allocates an skb; only the program's runs are timed).
pub(super) fn passive_latency_cost(
    rounds: usize,
    repeat: u32,
    figures: &mut Figures,
) -> Result<()> {
    use balancer::dataplane::ebpf::{LATENCY_EGRESS_PROGRAM, LATENCY_INGRESS_PROGRAM};
    use balancer::serve::report::passive::PassiveLatency;
    let mut p = PassiveLatency::load(&[8000])?;
    let (client, server) = (ip("10.9.0.1"), ip("10.111.1.1"));
    let request = tcp_frame(client, 40000, server, 8000, false, &[b'x'; 64]);
    let token = tcp_frame(server, 8000, client, 40000, false, &[b'y'; 64]);
    let other = tcp_frame(client, 40001, server, 22, false, &[b'z'; 64]);
    // (key, program, frame, what); the flow is answering when the token case runs.
    let cases: [(&str, &'static str, &[u8], &str); 3] = [
        (
            "tc_latency_request",
            LATENCY_INGRESS_PROGRAM,
            &request,
            "client data packet of a watched flow (ingress: flow lookup, request time)",
        ),
        (
            "tc_latency_token",
            LATENCY_EGRESS_PROGRAM,
            &token,
            "server data packet of an answer (egress: flow lookup, inter-token histogram)",
        ),
        (
            "tc_latency_unwatched",
            LATENCY_INGRESS_PROGRAM,
            &other,
            "TCP to a port not watched (ingress: port lookup only)",
        ),
    ];
    let mut run = |program: &'static str, frame: &[u8], repeat: u32| -> Result<f64> {
        let r = p
            .classifier(program)?
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..TestRunOptions::default()
            })
            .with_context(|| format!("test run of {program}"))?;
        Ok(r.duration.as_nanos() as f64)
    };
    // A request, then its first answer packet: the flow is answering.
    run(LATENCY_INGRESS_PROGRAM, &request, 1)?;
    run(LATENCY_EGRESS_PROGRAM, &token, 1)?;
    let mut samples: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..rounds {
        // Token first: a repeated request packet keeps the flow waiting for its answer.
        for (key, program, frame, _) in [cases[1], cases[0], cases[2]] {
            samples
                .entry(key)
                .or_default()
                .push(run(program, frame, repeat)?);
        }
    }
    println!(
        "\nPassive latency programs on a backend (tc, BPF_PROG_TEST_RUN with repeat), median [min..max]"
    );
    for (key, _, _, what) in cases {
        let s = &samples[key];
        let med = median(s);
        let min = s.iter().copied().fold(f64::INFINITY, f64::min);
        let max = s.iter().copied().fold(0.0, f64::max);
        println!("{key:<28} {med:>8.1} {min:>8.1}..{max:<8.1}\n    {what}");
        figures.insert(format!("{key}_ns"), med);
    }
    Ok(())
}
