//! Backends that lie or misbehave, as `balancer report --once --scrape` meets them: each hostile
//! page is an error naming its problem and a non-zero exit, never a panic; an ordinary page
//! beside them still reads. (The daemon reads pages through the same code: see
//! `telemetry::scrape` and the hostile pages of its tests.)

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// How a page server answers each request.
#[derive(Clone)]
enum Answer {
    /// A 200 with this body.
    Page(Vec<u8>),
    /// A 200 with this gzip-compressed body.
    Gzip(Vec<u8>),
    /// A 200 sent one byte every 100 ms, for ever.
    Trickle,
    /// A chunked 200 that never ends.
    Endless,
}

/// Serves `answer` on a loopback port (one thread per connection, for the test's life).
fn serve(answer: Answer) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let answer = answer.clone();
            std::thread::spawn(move || {
                let _ = answer_one(stream, &answer);
            });
        }
    });
    addr
}

fn answer_one(mut s: TcpStream, answer: &Answer) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
    }
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n";
    match answer {
        Answer::Page(body) => {
            s.write_all(format!("{head}content-length: {}\r\n\r\n", body.len()).as_bytes())?;
            s.write_all(body)
        }
        Answer::Gzip(body) => {
            s.write_all(
                format!(
                    "{head}content-encoding: gzip\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )?;
            s.write_all(body)
        }
        Answer::Trickle => {
            s.write_all(format!("{head}content-length: 100000\r\n\r\n").as_bytes())?;
            loop {
                s.write_all(b"#")?;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Answer::Endless => {
            s.write_all(format!("{head}transfer-encoding: chunked\r\n\r\n").as_bytes())?;
            let line = "vllm:num_requests_running 1\n".repeat(2000);
            let chunk = format!("{:x}\r\n{line}\r\n", line.len());
            loop {
                s.write_all(chunk.as_bytes())?;
            }
        }
    }
}

/// `balancer report --once --no-gpu --scrape http://ADDR/metrics`: (exit code, stdout,
/// stderr, how long it took).
fn report_once(addr: SocketAddr) -> (i32, String, String, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_balancer"))
        .args(["report", "--once", "--no-gpu", "--timeout-ms", "1000"])
        .arg("--scrape")
        .arg(format!("http://{addr}/metrics"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

/// `len` bytes of spaces, gzip-compressed (about a thousandth of that).
fn gzip_bomb(len: usize) -> Answer {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let block = vec![b' '; 1 << 20];
    for _ in 0..len / block.len() {
        gz.write_all(&block).unwrap();
    }
    Answer::Gzip(gz.finish().unwrap())
}

fn page(text: &str) -> Answer {
    Answer::Page(text.as_bytes().to_vec())
}

/// Every hostile page of the suite, and what its error must say.
fn hostile_pages() -> Vec<(&'static str, Answer, String)> {
    let histogram_twice = [
        "vllm:num_requests_running{model_name=\"a\"} 1",
        "vllm:num_requests_waiting{model_name=\"a\"} 0",
        "vllm:time_to_first_token_seconds_sum{model_name=\"a\"} 1e308",
        "vllm:time_to_first_token_seconds_sum{model_name=\"b\"} 1e308",
        "vllm:time_to_first_token_seconds_count{model_name=\"a\"} 1e308",
        "vllm:time_to_first_token_seconds_count{model_name=\"b\"} 1e308",
        "vllm:request_prompt_tokens_sum{model_name=\"a\"} 1e308",
        "vllm:request_prompt_tokens_sum{model_name=\"b\"} 1e308",
        "vllm:request_prompt_tokens_count{model_name=\"a\"} 1e308",
        "vllm:request_prompt_tokens_count{model_name=\"b\"} 1e308",
    ]
    .join("\n");
    let many_models: String = (0..40_000)
        .map(|i| format!("vllm:num_requests_running{{model_name=\"model-{i}\"}} 0\n"))
        .collect();
    let many_labels: String = format!(
        "vllm:num_requests_running{{{}}} 1\n",
        (0..100)
            .map(|i| format!("l{i}=\"v\""))
            .collect::<Vec<_>>()
            .join(",")
    );
    vec![
        (
            "histogram sums that overflow",
            page(&histogram_twice),
            "ttft_sum_count = inf: must be a finite number".into(),
        ),
        (
            "NaN",
            page("vllm:num_requests_running NaN\n"),
            "running = NaN".into(),
        ),
        (
            "an infinity",
            page("vllm:num_requests_waiting +Inf\n"),
            "waiting = inf".into(),
        ),
        (
            "a negative count",
            page("vllm:num_requests_running -4\n"),
            "running = -4".into(),
        ),
        (
            "KV use of 1e9",
            page("vllm:kv_cache_usage_perc 1e9\n"),
            "kv_usage = 1000000000".into(),
        ),
        (
            "a capacity past any GPU's",
            page("vllm:cache_config_info{num_gpu_blocks=\"1e300\",block_size=\"16\"} 1\n"),
            "kv_capacity_tokens = 16000000000000000000000".into(),
        ),
        (
            "tens of thousands of models",
            page(&many_models),
            "models: 40000 names, at most 256".into(),
        ),
        (
            "a sample with a hundred labels",
            page(&many_labels),
            "more than 64 labels".into(),
        ),
        (
            "garbage",
            Answer::Page(b"\x00\x01 <html>not metrics</html>\n".to_vec()),
            "does not start with a metric name".into(),
        ),
        (
            "bytes that are not UTF-8",
            Answer::Page(vec![0xff, 0xfe, b'\n']),
            "is not UTF-8".into(),
        ),
        (
            "a page that trickles a byte at a time",
            Answer::Trickle,
            "no complete answer within 1000 ms".into(),
        ),
        (
            "an endless page",
            Answer::Endless,
            format!("larger than {} bytes", 4 << 20),
        ),
        (
            "a gzip bomb",
            gzip_bomb(64 << 20),
            format!("larger than {} bytes", 4 << 20),
        ),
    ]
}

#[test]
fn every_hostile_page_is_an_error_naming_its_problem_and_never_a_panic() {
    for (what, answer, want) in hostile_pages() {
        let addr = serve(answer);
        let (code, out, err, took) = report_once(addr);
        assert_eq!(
            code, 1,
            "{what}: exit {code}, stdout {out:?}, stderr {err:?}"
        );
        assert!(err.contains(&want), "{what}: wanted {want:?} in {err:?}");
        assert!(
            !err.contains("panicked"),
            "{what}: the reporter panicked: {err}"
        );
        assert!(out.is_empty(), "{what}: printed a report {out:?}");
        assert!(took < Duration::from_secs(20), "{what}: took {took:?}");
    }
    // An ordinary page served the same way reads.
    let addr = serve(page(
        "vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 1\n",
    ));
    let (code, out, err, _) = report_once(addr);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["signals"]["running"], 3.0, "{out}");
    assert_eq!(report["signals"]["models"][0], "m", "{out}");
}
