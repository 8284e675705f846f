#!/usr/bin/env bash
# scripts/bench/idle.sh — what a pair-node costs with nothing to do: one
# node in front of the benchmark engine (its pollers, timers and job log
# running, no requests), its CPU time and context switches (all threads)
# over DUR seconds, and what that comes to per request at a given rate.
# docs/benchmarks/proxy.md, "Twelfth round", has the figures.
#
# Usage: scripts/bench/idle.sh [PAIR_NODE] (default target/release/pair-node)
# Env:   DUR=20  RATE=7500 (requests a second to spread the idle cost over;
#        about the face's c=1 rate here)
# Needs: nginx, curl, python3.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=engine.sh
source "$ROOT/scripts/bench/engine.sh"
NODE=${1:-$ROOT/target/release/pair-node}
DUR=${DUR:-20}
RATE=${RATE:-7500}
WORK=$(mktemp -d /tmp/pair-idle.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null; rm -rf "$WORK"' EXIT
read -r P_ENGINE P_OLLAMA P_OPENAI P_CLUSTER <<<"$(free_ports 4)"
start_bench_engine "$P_ENGINE" "$WORK"
PIDS+=("$ENGINE_PID")
bench_node_args "$WORK" idle "$P_ENGINE" "$P_OLLAMA" "$P_OPENAI" "$P_CLUSTER"
"$NODE" "${BENCH_NODE_ARGS[@]}" >"$WORK/node.log" 2>&1 &
NODE_PID=$!
PIDS+=("$NODE_PID")
wait_chat "$P_OPENAI"
sleep 2 # past start-up and the answer above
t0=$(cpu_ticks "$NODE_PID")
read -r v0 n0 < <(switch_counts "$NODE_PID")
sleep "$DUR"
t1=$(cpu_ticks "$NODE_PID")
read -r v1 n1 < <(switch_counts "$NODE_PID")
python3 - "$((t1 - t0))" "$(getconf CLK_TCK)" "$((v1 - v0))" "$((n1 - n0))" "$DUR" "$RATE" <<'PY'
import sys
ticks, hz, vol, invol, dur, rate = (float(a) for a in sys.argv[1:])
ms = ticks / hz * 1000
print(f"idle over {dur:.0f} s: {ms:.0f} ms CPU ({ms / dur:.2f} ms/s), "
      f"{vol:.0f} voluntary and {invol:.0f} involuntary switches ({(vol + invol) / dur:.1f}/s); "
      f"at {rate:.0f} requests/s: {ms / dur * 1000 / rate:.3f} µs CPU per request")
PY
