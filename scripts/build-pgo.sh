#!/usr/bin/env bash
# scripts/build-pgo.sh — a profile-guided (PGO) release build of pair-node:
# an instrumented build serves a training load (TRAIN, below), LLVM
# merges the counts, and a second build lays
# the code out by them (hot paths together, cold code apart), which cuts
# the instruction-cache misses the request path takes
# (docs/benchmarks/proxy.md, "Eleventh round").
#
# Two training loads (TRAIN):
#   bench (default) a node in front of a fast engine, the work a node's
#         proxy does in production whatever engine is behind it: the
#         benchmark engine of scripts/bench/engine.sh answering chat
#         completions through the OpenAI face, whole (the face benchmark's
#         own request, c=32 and c=1) and streamed (SSE, c=8), and listings.
#   demo  `pair-node demo --nodes 2` on free loopback ports, its emulated
#         engines answering: streamed and whole chats on both faces,
#         Ollama generate, listings, requests that go to the other node
#         over mTLS. Never the benchmark's request, so what it gains there
#         is no fit to the benchmark (docs/benchmarks/proxy.md compares
#         the two); its emulators' own code is no node's production work.
#
# The optimised binary then serves the same load for about a second a
# part, and the script fails if any request fails. This is the release
# build (README); `cargo xtask ci` runs it with TRAIN_SECONDS=2.
#
# Usage: scripts/build-pgo.sh         prints the optimised binary's path
# Env:   PGO_DIR=<work dir> (default target/pgo)  TRAIN=demo|bench
#        TRAIN_SECONDS=8
# Needs: llvm-profdata of rustc's LLVM major version (apt: llvm-NN,
#        installed if missing), nginx, wrk, curl.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/engine.sh
source "$ROOT/scripts/bench/engine.sh"
DIR=${PGO_DIR:-$ROOT/target/pgo}
SECONDS_EACH=${TRAIN_SECONDS:-8}
log() { printf '[pgo %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
PROFDATA=$(command -v "llvm-profdata-$llvm" || true)
if [ -z "$PROFDATA" ]; then
    log "installing llvm-$llvm (llvm-profdata for rustc's LLVM $llvm)"
    apt_install "llvm-$llvm"
    PROFDATA=$(command -v "llvm-profdata-$llvm")
fi
for t in nginx wrk curl; do
    command -v "$t" >/dev/null || { log "needs $t"; exit 64; }
done

RAW=$DIR/raw
rm -rf "$RAW"
mkdir -p "$RAW"
log "instrumented build"
(cd "$ROOT" && CARGO_TARGET_DIR=$DIR/gen RUSTFLAGS="-Cprofile-generate=$RAW" \
    cargo build --release -p pair-node)

WORK=$(mktemp -d /tmp/pair-pgo.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
load() { # CONNECTIONS SECONDS URL [BODY]: wrk POSTs BODY (post.lua's chat if none)
    BENCH_BODY=${4:-} wrk -t"${WRK_THREADS:-1}" -c"$1" -d"$2s" -s "$ROOT/scripts/bench/post.lua" "$3" |
        grep RESULT | tee -a "$WORK/results" >&2
}
# train BIN SECONDS: BIN serves the TRAIN load, each part for about
# SECONDS, on free loopback ports, and exits cleanly (which is when an
# instrumented build writes its counts); fails if any request failed.
train() {
    local bin=$1 each=$2 P_ENGINE P_OLLAMA P_OPENAI P_CLUSTER node
    read -r P_ENGINE P_OLLAMA P_OPENAI P_CLUSTER <<<"$(free_ports 4)"
    local OLLAMA=http://127.0.0.1:$P_OLLAMA OPENAI=http://127.0.0.1:$P_OPENAI
    : >"$WORK/results"
    case ${TRAIN:-bench} in
    demo)
        "$bin" demo --nodes 2 --ollama-face "127.0.0.1:$P_OLLAMA" \
            --openai-face "127.0.0.1:$P_OPENAI" >"$WORK/node.log" 2>&1 &
        node=$!
        PIDS+=("$node")
        for _ in $(seq 100); do
            curl -sf "$OPENAI/v1/models" | grep -q llama3.2 && break
            sleep 0.2
        done
        # Each model answers once first (the nodes' inventories take a
        # moment to reach the snapshot, and a cold model loads): a load of
        # quick refusals would teach the wrong path.
        local model code
        for model in llama3.2:3b qwen2.5:7b; do
            for _ in $(seq 100); do
                code=$(curl -s -m 60 -o /dev/null -w '%{http_code}' "$OLLAMA/api/generate" \
                    -d "{\"model\":\"$model\",\"prompt\":\"hi\",\"stream\":false,\"options\":{\"num_predict\":1}}" || true)
                [ "$code" = 200 ] && break
                sleep 0.3
            done
            [ "$code" = 200 ] || { log "the demo cluster never served $model"; return 1; }
        done
        log "load (demo cluster): chats, streamed and whole, on both faces; generate; listings"
        local chat='{"model":"llama3.2:3b","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16'
        load 16 "$each" "$OPENAI/v1/chat/completions" "$chat}"
        load 16 "$each" "$OPENAI/v1/chat/completions" "$chat,\"stream\":true}"
        load 16 "$each" "$OLLAMA/api/chat" \
            '{"model":"llama3.2:3b","messages":[{"role":"user","content":"Say hello."}],"options":{"num_predict":16}}'
        load 8 "$((each / 2 + 1))" "$OLLAMA/api/generate" \
            '{"model":"qwen2.5:7b","prompt":"Say hello.","stream":false,"options":{"num_predict":16}}'
        ;;
    bench)
        start_bench_engine "$P_ENGINE" "$WORK" 2
        PIDS+=("$ENGINE_PID")
        bench_node_args "$WORK" pgo "$P_ENGINE" "$P_OLLAMA" "$P_OPENAI" "$P_CLUSTER"
        "$bin" "${BENCH_NODE_ARGS[@]}" >"$WORK/node.log" 2>&1 &
        node=$!
        PIDS+=("$node")
        wait_chat "$P_OPENAI"
        log "load (benchmark engine): chat completions, whole at c=32 and c=1, streamed; listings"
        WRK_THREADS=2 load 32 "$each" "$OPENAI/v1/chat/completions"
        load 1 "$((each / 2 + 1))" "$OPENAI/v1/chat/completions"
        BENCH_MODE=stream load 8 "$((each / 2 + 1))" "$OPENAI/v1/chat/completions" \
            '{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"stream":true}'
        ;;
    *)
        log "TRAIN is demo or bench"
        return 64
        ;;
    esac
    local url
    for url in "$OPENAI/v1/models" "$OLLAMA/api/tags"; do
        # wrk without a script counts failures in these two lines only.
        wrk -t1 -c4 -d2s "$url" | grep -E 'Non-2xx|Socket errors' | sed "s|^|$url: |" |
            tee -a "$WORK/results" >&2 || true
    done
    # A load of refusals would teach the error path (and, for the
    # optimised build, means it does not work).
    if grep -v ' errors=0$' "$WORK/results" >&2; then
        log "requests failed (above)"
        return 1
    fi
    kill -INT "$node"
    wait "$node" || true
    if [ "${TRAIN:-bench}" = bench ]; then
        kill "$ENGINE_PID" 2>/dev/null || true
        wait "$ENGINE_PID" 2>/dev/null || true
    fi
}
log "training the instrumented build"
train "$DIR/gen/release/pair-node" "$SECONDS_EACH"
"$PROFDATA" merge -o "$DIR/merged.profdata" "$RAW"
# Named by its content: cargo rebuilds when RUSTFLAGS change, not when a
# file they name does.
sum=$(sha256sum "$DIR/merged.profdata" | cut -c1-16)
find "$DIR" -maxdepth 1 -name 'merged-*.profdata' ! -name "merged-$sum.profdata" -delete
mv "$DIR/merged.profdata" "$DIR/merged-$sum.profdata"

log "optimised build ($DIR/merged-$sum.profdata)"
(cd "$ROOT" && CARGO_TARGET_DIR=$DIR/use RUSTFLAGS="-Cprofile-use=$DIR/merged-$sum.profdata" \
    cargo build --release -p pair-node)
# The release binary itself, under the same load, briefly: it must serve
# every request.
log "checking the optimised build under the same load"
train "$DIR/use/release/pair-node" 1
echo "$DIR/use/release/pair-node"
