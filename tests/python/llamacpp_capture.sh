#!/usr/bin/env bash
# Capture real llama.cpp `llama-server` /metrics pages as parser fixtures.
#
# What it does, from scratch (each step is skipped when its output is already
# in the cache dir, so a re-run only repeats the server part):
#   1. downloads the llama-cpp-python sdist from PyPI (it vendors llama.cpp's
#      source; GitHub is not reachable here) and builds only the
#      `llama-server` target with cmake (CPU, AVX2, static, no curl/OpenSSL,
#      no web-UI download);
#   2. builds the tiny random-weight Llama with build_tiny_model.py and
#      converts it to GGUF with llama.cpp's converter (llamacpp_convert.py);
#   3. starts `llama-server --metrics` on 127.0.0.1 only, checks /health,
#      /v1/models and a streaming /v1/completions, records /metrics headers;
#   4. saves /metrics in five states: idle (fresh), busy (fewer requests than
#      slots, all running), queueing (more requests than slots:
#      requests_deferred > 0), after (idle again, counters moved), plus
#      busy-later (the same busy requests >= 20 decode steps on: what moves
#      per step and what only when a request ends).
# The server is killed on exit (trap), every loop is bounded.
#
# Usage: tests/python/llamacpp_capture.sh CACHE_DIR OUT_DIR
# Environment:
#   PYTHON     interpreter with torch, transformers, tokenizers, safetensors,
#              numpy, pyyaml, tqdm, requests (required for step 2 only;
#              e.g. /root/.cache/balancer-exp/vllm/bin/python)
#   LLAMACPP_PY_VERSION  llama-cpp-python sdist version (default 0.3.36)
#   LLAMACPP_BUILD_NUMBER llama.cpp build number to stamp into the binary
#              (the sdist's vendored clone is shallow, so cmake would count 1;
#              default 11312 = release b11312, commit 0c1e57098 that 0.3.36
#              vendors; other versions default to 0 = unknown)
#   PORT (8081)  NP slots (4)  CTX total context (2048)  JOBS (2)
#   MAX_TOKENS per load request (400; must fit CTX/NP with the prompt)
# Needs: cmake, g++, curl, pip (any python3 with pip, for the download).
set -euo pipefail

if [[ $# -ne 2 ]]; then
    sed -n '2,33p' "$0" >&2
    exit 2
fi
CACHE=$(mkdir -p "$1" && cd "$1" && pwd)
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
PYVER=${LLAMACPP_PY_VERSION:-0.3.36}
PORT=${PORT:-8081}
NP=${NP:-4}
CTX=${CTX:-2048}
JOBS=${JOBS:-2}
MAX_TOKENS=${MAX_TOKENS:-400}
HOST=127.0.0.1
BASE="http://$HOST:$PORT"
log() { printf '[llamacpp_capture %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for tool in cmake g++ curl; do
    command -v "$tool" >/dev/null || die "$tool not found (Debian: apt-get install -y cmake g++ curl)"
done

# ---------------------------------------------------------------- 1. build
SDIST="$CACHE/llama_cpp_python-$PYVER.tar.gz"
SRCROOT="$CACHE/llama_cpp_python-$PYVER"
LLAMA="$SRCROOT/vendor/llama.cpp"
BUILD="$CACHE/build-$PYVER"
SERVER="$BUILD/bin/llama-server"

if [[ ! -f "$SDIST" ]]; then
    log "downloading llama-cpp-python==$PYVER sdist"
    python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$PYVER" -d "$CACHE"
fi
if [[ ! -f "$LLAMA/CMakeLists.txt" ]]; then
    log "unpacking $SDIST"
    tar -xzf "$SDIST" -C "$CACHE"
fi
# The vendored commit, from the sdist's CHANGELOG ("update llama.cpp to ggml-org/llama.cpp@<sha>")
COMMIT=$(awk -v v="## [$PYVER]" '$0==v{f=1;next} f&&/^## \[/{exit} f&&match($0,/llama\.cpp@[0-9a-f]+/){print substr($0,RSTART+10,7);exit}' "$SRCROOT/CHANGELOG.md")
COMMIT=${COMMIT:-unknown}
if [[ -n ${LLAMACPP_BUILD_NUMBER:-} ]]; then
    BUILDNO=$LLAMACPP_BUILD_NUMBER
elif [[ $PYVER == 0.3.36 ]]; then
    BUILDNO=11312
else
    BUILDNO=0
fi

if [[ ! -x "$SERVER" ]]; then
    log "building llama-server (llama.cpp $COMMIT, b$BUILDNO) with -j$JOBS; takes minutes"
    start=$(date +%s)
    # GGML_NATIVE=OFF turns every x86 extension off unless named, so name them:
    # AVX2/FMA/F16C/BMI2 is what this project's machines have (no AVX-512).
    # LLAMA_USE_PREBUILT_UI=OFF: otherwise the build tries to download the web UI from Hugging Face.
    cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_NUMBER="$BUILDNO" -DLLAMA_BUILD_COMMIT="$COMMIT" \
        -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON \
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON >"$CACHE/cmake-configure.log" 2>&1 \
        || die "cmake configure failed, see $CACHE/cmake-configure.log"
    cmake --build "$BUILD" --config Release --target llama-server -j"$JOBS" >"$CACHE/cmake-build.log" 2>&1 \
        || die "build failed, see $CACHE/cmake-build.log"
    log "built in $(( $(date +%s) - start )) s"
fi
VERSION_TEXT=$("$SERVER" --version 2>&1)
# "version: 0.5.0-dev (build 11312, commit 0c1e570)" -> tag b11312
TAG=$(sed -n 's/^version: .*(build \([0-9]*\), commit \([0-9a-z]*\)).*/b\1/p' <<<"$VERSION_TEXT")
TAG=${TAG:-unknown}
PREFIX="$OUT/llamacpp-$TAG"
{
    echo "llama-cpp-python sdist: $PYVER"
    echo "$VERSION_TEXT"
    echo "binary: $SERVER ($(stat -c %s "$SERVER") bytes)"
} >"$PREFIX-version.txt"
log "llama-server: $(head -1 <<<"$VERSION_TEXT") -> fixtures $PREFIX-*.prom"

# ---------------------------------------------------------------- 2. model
MODEL="$CACHE/model/tiny-f32.gguf"
if [[ ! -f "$MODEL" ]]; then
    [[ -n ${PYTHON:-} ]] || die "PYTHON must name an interpreter with torch+transformers to build the model"
    log "building the tiny model and converting it to GGUF"
    "$PYTHON" "$HERE/build_tiny_model.py" "$CACHE/model/hf" >"$CACHE/model-build.log" 2>&1 \
        || die "build_tiny_model.py failed, see $CACHE/model-build.log"
    "$PYTHON" "$HERE/llamacpp_convert.py" "$LLAMA" "$CACHE/model/hf" "$MODEL.tmp" --outtype f32 \
        >"$CACHE/model-convert.log" 2>&1 || die "conversion failed, see $CACHE/model-convert.log"
    mv "$MODEL.tmp" "$MODEL"
fi

# ---------------------------------------------------------------- 3. server
rm -f "$PREFIX"-{idle,busy,busy-later,queueing,after}.prom   # no stale pages from an earlier run
if curl -s -m 1 -o /dev/null "$BASE/health"; then
    die "something already answers on $BASE; choose another PORT"
fi
SERVER_PID=
LOAD_PIDS=()
cleanup() {
    local p
    for p in "${LOAD_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [[ -n $SERVER_PID ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "starting llama-server on $BASE (-c $CTX -np $NP)"
"$SERVER" -m "$MODEL" --host "$HOST" --port "$PORT" --metrics -c "$CTX" -np "$NP" \
    --no-webui >"$PREFIX-server.log" 2>&1 &
SERVER_PID=$!
for i in $(seq 120); do
    code=$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$BASE/health" || true)
    if [[ $code == 200 ]]; then break; fi
    kill -0 "$SERVER_PID" 2>/dev/null || die "llama-server exited, see $PREFIX-server.log"
    if [[ $i == 120 ]]; then die "no healthy /health after 60 s"; fi
    sleep 0.5
done
log "healthy: $(curl -s "$BASE/health")"

scrape() { curl -sf -m 5 "$BASE/metrics"; }
metric() { awk -v n="llamacpp:$1" '$1==n{print $2}' "$2"; }

# idle: the very first page (all counters zero)
scrape >"$PREFIX-idle.prom"
curl -s -m 5 -D "$PREFIX-metrics-headers.txt" -o /dev/null "$BASE/metrics"
curl -s -m 5 "$BASE/v1/models" >"$PREFIX-models.json"
curl -s -m 30 -N "$BASE/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Hello stream","max_tokens":8,"stream":true,"ignore_eos":true}' >"$PREFIX-stream.txt"
grep -q '^data: \[DONE\]' "$PREFIX-stream.txt" || die "streaming /v1/completions gave no [DONE]"
log "streaming ok: $(grep -c '^data: {' "$PREFIX-stream.txt") chunks; content-type: $(grep -i '^content-type' "$PREFIX-metrics-headers.txt" | tr -d '\r')"

# N concurrent non-streaming completions of MAX_TOKENS each, distinct prompts
# (identical prompts would be served from the prompt cache).
start_load() {
    local n=$1 tag=$2 i
    LOAD_PIDS=()
    for i in $(seq "$n"); do
        curl -s -m 120 -o /dev/null "$BASE/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\":\"$tag request $i of $n: tell me a long story\",\"max_tokens\":$MAX_TOKENS,\"ignore_eos\":true}" &
        LOAD_PIDS+=($!)
    done
}
wait_load() { local p; for p in "${LOAD_PIDS[@]}"; do wait "$p" || true; done; LOAD_PIDS=(); }

# poll /metrics (bounded) until requests_processing == WANT_P and requests_deferred
# satisfies WANT_D ("0" or ">0"); save that page as STATE
capture_when() {
    local state=$1 want_p=$2 want_d=$3 page="$OUT/.page.$$" i
    for i in $(seq 400); do
        scrape >"$page" || true
        if awk -v wp="$want_p" -v wd="$want_d" '
            $1=="llamacpp:requests_processing"{p=$2} $1=="llamacpp:requests_deferred"{d=$2}
            END{ if (p=="" || p+0 != wp+0) exit 1; exit !(wd=="0" ? d+0==0 : d+0>0) }' "$page"; then
            mv "$page" "$PREFIX-$state.prom"
            log "$state: requests_processing=$(metric requests_processing "$PREFIX-$state.prom") requests_deferred=$(metric requests_deferred "$PREFIX-$state.prom") after $i scrapes"
            return 0
        fi
        sleep 0.01
    done
    rm -f "$page"
    return 1
}

# busy: fewer requests than slots -> all running, nothing deferred
busy_n=$(( NP > 1 ? NP - 1 : 1 ))
for attempt in 1 2 3; do
    start_load "$busy_n" "busy$attempt"
    ok=0; capture_when busy "$busy_n" 0 && ok=1
    # a second page from the same requests: shows what moves per decode step
    # (n_decode_total, prompt_tokens_total) and what only moves when a request ends
    # (tokens_predicted_total, tokens_predicted_seconds_total)
    if [[ $ok == 1 ]]; then
        d0=$(metric n_decode_total "$PREFIX-busy.prom")
        for i in $(seq 200); do
            sleep 0.01
            scrape >"$OUT/.page.$$" || true
            [[ $(metric requests_processing "$OUT/.page.$$") == "$busy_n" ]] || break
            if awk -v d0="$d0" '$1=="llamacpp:n_decode_total"{exit !($2 >= d0 + 20)}' "$OUT/.page.$$"; then
                mv "$OUT/.page.$$" "$PREFIX-busy-later.prom"
                break
            fi
        done
        rm -f "$OUT/.page.$$"
        [[ -f "$PREFIX-busy-later.prom" ]] || log "busy-later: requests ended too soon (raise MAX_TOKENS)"
    fi
    wait_load
    if [[ $ok == 1 ]]; then break; fi
    if [[ $attempt == 3 ]]; then die "never saw requests_processing=$busy_n (raise MAX_TOKENS)"; fi
done

# queueing: more requests than slots -> requests_deferred > 0
for attempt in 1 2 3; do
    start_load $(( NP * 2 + 2 )) "queue$attempt"
    ok=0; capture_when queueing "$NP" ">0" && ok=1
    wait_load
    if [[ $ok == 1 ]]; then break; fi
    if [[ $attempt == 3 ]]; then die "never saw requests_processing=$NP with requests_deferred>0"; fi
done

# after: idle again; wait (bounded) until nothing is processing
for i in $(seq 100); do
    scrape >"$PREFIX-after.prom"
    if [[ $(metric requests_processing "$PREFIX-after.prom") == 0 ]]; then break; fi
    sleep 0.1
done

log "done; pages:"
for f in "$PREFIX"-*.prom; do
    log "  $f: $(grep -c '^llamacpp:' "$f") series"
done
