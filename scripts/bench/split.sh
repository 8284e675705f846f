#!/usr/bin/env bash
# scripts/bench/split.sh — where each proxy's CPU goes, per request: pair's
# face, nginx as a reverse proxy and the hand-framed floor (raw_forwarder),
# measured in turn (in an order that rotates from round to round) under the
# same wrk load against one engine (nginx, 2 workers, fixed chat answer).
# Per request and proxy: user and system CPU time, voluntary and
# involuntary context switches, minor page faults, and the engine's own CPU
# behind it (all threads, from /proc). docs/benchmarks/proxy.md, "Tenth
# round", has the figures.
#
# Usage: scripts/bench/split.sh [ROUNDS=3]
# Env:   DUR=3 CONC=32  BIN_DIR=<dir with pair-node and examples/raw_forwarder>
#        (default target/release)  PAIR_ARGS="..." (extra pair-node flags,
#        e.g. --threads 1)  PIN=1 (pin pair's two event loops to cores 0
#        and 1)  PERF=1 (perf record each proxy in round 1; prints its
#        costliest symbols in µs of samples per request)
# Needs: nginx, wrk, python3, curl; perf for PERF=1.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/scripts/bench"
# shellcheck source=engine.sh
source "$HERE/engine.sh"
ROUNDS=${1:-3}
DUR=${DUR:-3}
CONC=${CONC:-32}
BIN_DIR=${BIN_DIR:-$ROOT/target/release}
RAW=$BIN_DIR/examples/raw_forwarder
[ -x "$BIN_DIR/pair-node" ] && [ -x "$RAW" ] ||
    { echo "needs $BIN_DIR/pair-node and $RAW (cargo build --release -p pair-node; cargo build --release -p pair-http --example raw_forwarder)" >&2; exit 64; }
WORK=$(mktemp -d /tmp/pair-split.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null; rm -rf "$WORK"' EXIT

read -r P_ENGINE P_OLLAMA P_PAIR P_CLUSTER P_NGINX P_RAW <<<"$(free_ports 6)"
start_bench_engine "$P_ENGINE" "$WORK" 2
PIDS+=("$ENGINE_PID")
nginx_proxy_config "$WORK" 2 "$P_ENGINE" "$P_NGINX" >"$WORK/proxy.conf"
"${NGINX:-nginx}" -c "$WORK/proxy.conf" -p "$WORK" -e "$WORK/proxy-error.log" &
PIDS+=($!)
bench_node_args "$WORK" split "$P_ENGINE" "$P_OLLAMA" "$P_PAIR" "$P_CLUSTER"
# shellcheck disable=SC2086
"$BIN_DIR/pair-node" "${BENCH_NODE_ARGS[@]}" ${PAIR_ARGS:-} >"$WORK/node.log" 2>&1 &
PAIR_PID=$!
PIDS+=("$PAIR_PID")
"$RAW" "127.0.0.1:$P_RAW" "127.0.0.1:$P_ENGINE" 2 >"$WORK/raw.log" 2>&1 &
RAW_PID=$!
PIDS+=("$RAW_PID")
for p in "$P_PAIR" "$P_NGINX" "$P_RAW"; do wait_chat "$p"; done
if [ -n "${PIN:-}" ]; then
    # The node's main thread runs loop 0; pair-loop-1 the second.
    for t in /proc/"$PAIR_PID"/task/*; do
        case $(cat "$t/comm") in
            pair-node) taskset -p -c 0 "${t##*/}" >/dev/null ;;
            pair-loop-1) taskset -p -c 1 "${t##*/}" >/dev/null ;;
        esac
    done
fi

# An nginx's processes: its master and workers.
family() { echo "$1" $(pgrep -P "$1"); }
pids_of() {
    case $1 in
        pair) echo "$PAIR_PID" ;;
        nginx) family "$(cat "$WORK/proxy.pid")" ;;
        raw) echo "$RAW_PID" ;;
    esac
}
port_of() {
    case $1 in pair) echo "$P_PAIR" ;; nginx) echo "$P_NGINX" ;; raw) echo "$P_RAW" ;; esac
}
ENGINE=$(family "$(cat "$WORK/engine.pid")")
faults() { # minor page faults of the given processes, all threads
    local pid n=0
    for pid in "$@"; do n=$((n + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $8}'))); done
    echo "$n"
}
url() { echo "http://127.0.0.1:$(port_of "$1")/v1/chat/completions"; }
# wrk needs a connection per thread.
THREADS=$((CONC < 2 ? 1 : 2))
for v in pair nginx raw; do wrk -t"$THREADS" -c"$CONC" -d1s -s "$HERE/post.lua" "$(url "$v")" >/dev/null; done

VARIANTS=(pair nginx raw)
echo "round proxy p50_us req/s user_us sys_us vol_sw invol_sw minflt engine_us (per request)"
for ((r = 1; r <= ROUNDS; r++)); do
    for ((i = 0; i < 3; i++)); do
        v=${VARIANTS[(i + r) % 3]}
        # shellcheck disable=SC2046
        set -- $(pids_of "$v")
        read -r u0 s0 < <(cpu_times "$@")
        read -r v0 n0 < <(switch_counts "$@")
        f0=$(faults "$@")
        # shellcheck disable=SC2086
        e0=$(cpu_ticks $ENGINE)
        if [ -n "${PERF:-}" ] && [ "$r" = 1 ]; then
            perf record -q -F 4999 -o "$WORK/$v.data" -p "$(echo "$@" | tr ' ' ,)" \
                -- sleep "$DUR" >/dev/null 2>&1 &
            PERF_PID=$!
        fi
        out=$(wrk -t"$THREADS" -c"$CONC" -d"${DUR}s" -s "$HERE/post.lua" "$(url "$v")" | grep '^RESULT')
        read -r u1 s1 < <(cpu_times "$@")
        read -r v1 n1 < <(switch_counts "$@")
        f1=$(faults "$@")
        # shellcheck disable=SC2086
        e1=$(cpu_ticks $ENGINE)
        python3 - "$r" "$v" "$out" "$(getconf CLK_TCK)" $((u1 - u0)) $((s1 - s0)) \
            $((v1 - v0)) $((n1 - n0)) $((f1 - f0)) $((e1 - e0)) <<'PY'
import sys
r, v, out, hz = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
u, s, vol, inv, flt, eng = map(int, sys.argv[5:])
f = dict(kv.split("=") for kv in out.split()[1:])
n = int(f["requests"])
us = lambda ticks: ticks * 1e6 / hz / n
print(f"{r} {v} {f['p50_us']} {float(f['rps']):.0f} {us(u):.1f} {us(s):.1f} "
      f"{vol / n:.3f} {inv / n:.3f} {flt / n:.3f} {us(eng):.1f}")
PY
        if [ -n "${PERF_PID:-}" ]; then
            wait "$PERF_PID" || true
            PERF_PID=""
            n=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$out")
            echo "  $v, costliest symbols (µs of samples per request; perf adds its own):"
            # Costliest first; `head` closing the pipe early is expected.
            perf report -i "$WORK/$v.data" --no-children --sort sym --stdio \
                -F overhead,sample,sym 2>/dev/null |
                awk -v n="$n" '$1 ~ /%$/ {printf "    %6.2f %s\n", $2 / 4999 * 1e6 / n, substr($0, index($0, $3))}' |
                sort -rn | head -8 || true
        fi
    done
done
