#!/usr/bin/env bash
# scripts/bench/instructions.sh — instructions per proxied request: pair-node
# (one event loop) under valgrind's callgrind, wrk -t1 -c4 for $DUR seconds
# through its OpenAI face to the benchmark engine (nginx, fixed answer).
# Total instructions (start-up included) over requests, and the face
# connection tasks' own instructions per request (the steadier figure: the
# total's start-up share depends on how many requests the run got
# through); both steadier than wall time on a noisy box. The profile is
# kept for callgrind_annotate. `nginx` in place of a binary measures nginx
# as the reverse proxy instead (proxy.sh's configuration, one worker, no
# master process), for the same figures side by side.
# Usage: scripts/bench/instructions.sh [PAIR_NODE|nginx] (default target/release/pair-node)
# Env:   DUR=20  OUT=<callgrind output file> (default /tmp/pair-callgrind.out)
#        CACHE=1 (simulate the caches too: instruction and data L1 misses
#        per request, start-up included)
# Needs: valgrind, nginx, wrk, curl, python3.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/bench/engine.sh"
NODE=${1:-$ROOT/target/release/pair-node}
DUR=${DUR:-20}
OUT=${OUT:-/tmp/pair-callgrind.out}
WORK=$(mktemp -d /tmp/pair-instr.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null; rm -rf "$WORK"' EXIT
read -r P_ENGINE P_OLLAMA P_OPENAI P_CLUSTER <<<"$(free_ports 4)"
start_bench_engine "$P_ENGINE" "$WORK"
PIDS+=("$ENGINE_PID")
VG=(valgrind --tool=callgrind --callgrind-out-file="$OUT")
[ -n "${CACHE:-}" ] && VG+=(--cache-sim=yes)
if [ "$NODE" = nginx ]; then
    nginx_proxy_config "$WORK" 1 "$P_ENGINE" "$P_OPENAI" |
        sed 's/^master_process on;/master_process off;/' >"$WORK/proxy.conf"
    "${VG[@]}" "${NGINX:-nginx}" -c "$WORK/proxy.conf" -p "$WORK" -e "$WORK/proxy-error.log" \
        >"$WORK/node.log" 2>&1 &
else
    bench_node_args "$WORK" instr "$P_ENGINE" "$P_OLLAMA" "$P_OPENAI" "$P_CLUSTER"
    "${VG[@]}" "$NODE" "${BENCH_NODE_ARGS[@]}" --threads 1 >"$WORK/node.log" 2>&1 &
fi
NODE_PID=$!
PIDS+=("$NODE_PID")
wait_chat "$P_OPENAI"
result=$(wrk -t1 -c4 -d"${DUR}s" -s "$ROOT/scripts/bench/post.lua" \
    "http://127.0.0.1:$P_OPENAI/v1/chat/completions" | grep RESULT)
kill -INT "$NODE_PID"
wait "$NODE_PID" 2>/dev/null || true
requests=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$result")
total=$(callgrind_annotate "$OUT" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
# The face connection tasks alone (everything a request costs on its event
# loop, start-up and the job writer's thread left out), which does not
# depend on how many requests the run got through: the largest inclusive
# count of the task's outermost future.
face=$(callgrind_annotate --inclusive=yes "$OUT" 2>/dev/null |
    awk '/pair_proxy::face::log_end/ {gsub(",", "", $1); if ($1 + 0 > m) m = $1 + 0} END {print m + 0}')
misses=""
if [ -n "${CACHE:-}" ]; then
    # Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw: the L1 misses per request.
    misses=$(callgrind_annotate "$OUT" 2>/dev/null | awk -v n="$requests" '/PROGRAM TOTALS/ {
        for (i = 1; i <= 17; i += 2) { v[i] = $i; gsub(",", "", v[i]) }
        printf "i1_misses=%d d1_read_misses=%d d1_write_misses=%d ", v[7] / n, v[9] / n, v[11] / n }')
fi
tasks=""
[ "$NODE" = nginx ] || tasks="face_tasks_per_request=$((face / requests)) "
echo "requests=$requests instructions=$total per_request=$((total / requests))" \
    "$tasks${misses}profile=$OUT"
