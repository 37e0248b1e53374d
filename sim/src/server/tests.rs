//! Tests of `server`.

use super::*;
use balancer_tests::openai::stream_completion;
use balancer_tests::traffic::http_get_status;
use std::time::Duration;

/// A server on a loopback port of its own runtime thread.
fn start(profile: Profile) -> SocketAddr {
    spawn_local("gpu1", "m", profile).expect("the simulated server listens")
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Value {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    serde_json::from_str(reply.split_once("\r\n\r\n").unwrap().1).unwrap()
}

#[test]
fn streams_tokenizes_and_reports_as_vllm_does() {
    let addr = start(Profile::large());
    let prompt = "w ".repeat(600);
    let body = json!({"model": "m", "prompt": prompt, "max_tokens": 5, "stream": true,
                      "stream_options": {"include_usage": true}});
    let c = stream_completion(
        addr,
        "/v1/completions",
        &body,
        Duration::from_secs(10),
        |_| {},
    )
    .unwrap();
    c.check_intact(5).unwrap();
    assert_eq!(c.text, " tok1 tok2 tok3 tok4 tok5");
    assert_eq!(
        c.text_chunks, 5,
        "a chunk per token, the last with its finish reason"
    );
    assert_eq!(c.prompt_tokens, Some(600));
    assert_eq!(
        c.headers
            .iter()
            .find(|(k, _)| k == "x-served-by")
            .map(|(_, v)| v.as_str()),
        Some("gpu1")
    );
    // The same prompt again: its 37 full blocks (592 tokens) are cached.
    stream_completion(
        addr,
        "/v1/completions",
        &body,
        Duration::from_secs(10),
        |_| {},
    )
    .unwrap()
    .check_intact(5)
    .unwrap();
    let t = post(addr, "/tokenize", &json!({"model": "m", "prompt": "a b c"}));
    assert_eq!(t["count"], 3);
    assert_eq!(t["tokens"].as_array().unwrap().len(), 3);
    let (status, load) = http_get_status(addr, "/get_load", Duration::from_secs(2)).unwrap();
    assert_eq!(status, 200);
    let load: Value = serde_json::from_str(&load).unwrap();
    assert_eq!(load[0]["num_reqs"], 0);
    let (_, page) = http_get_status(addr, "/metrics", Duration::from_secs(2)).unwrap();
    let s = balancer::steering::telemetry::signals::extract(
        &balancer::steering::telemetry::page::parse(&page).unwrap(),
    );
    assert_eq!(
        (s.running, s.waiting, s.kv_usage),
        (Some(0.0), Some(0.0), Some(0.0))
    );
    assert_eq!(s.kv_capacity_tokens, Some(65_536.0));
    assert_eq!(s.prefix_cache_counts, Some((592.0, 1200.0)));
    assert_eq!(s.tokens_total, Some(1200.0 + 10.0));
    assert_eq!(s.ttft_sum_count.map(|(_, n)| n), Some(2.0));
    let (prefill, finished) = s.prefill_sum_count.expect("prefill histogram");
    assert_eq!(finished, 2.0);
    assert!(prefill > 0.0 && prefill < s.ttft_sum_count.unwrap().0 + 1e-9);
    assert_eq!(
        s.prompt_sum_count,
        Some((1200.0, 2.0)),
        "two prompts of 600"
    );
    assert_eq!(s.models, vec!["m".to_string()]);
    // Asked for the samples the balancer reads (prometheus_client's `name[]` filter, as
    // vLLM serves it): a small page with the same signals.
    let query = balancer::steering::telemetry::signals::vllm_query();
    let (_, cut) =
        http_get_status(addr, &format!("/metrics{query}"), Duration::from_secs(2)).unwrap();
    assert!(
        cut.len() * 4 < page.len(),
        "{} of {} bytes",
        cut.len(),
        page.len()
    );
    assert!(
        !cut.contains("inter_token_latency")
            && cut.contains("# TYPE vllm:num_requests_running gauge")
    );
    let cut = balancer::steering::telemetry::signals::extract(
        &balancer::steering::telemetry::page::parse(&cut).unwrap(),
    );
    assert_eq!(cut, s);
    // Errors as vLLM words them.
    let e = post(
        addr,
        "/v1/completions",
        &json!({"model": "x", "prompt": "a"}),
    );
    assert!(
        e["message"].as_str().unwrap().contains("does not exist"),
        "{e}"
    );
}
