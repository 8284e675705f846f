#!/usr/bin/env bash
# scripts/bench/ab.sh — A/B two pair-node builds on the same engine:
# alternating wrk runs against a node of each, CPU time per request (from
# /proc, all threads), req/s and p99 per run, then the medians. Alternating
# short runs keep both builds under the same (noisy) machine state, which
# makes a few-µs difference visible where separate runs hide it; which build
# goes first swaps every round. Use an even ROUNDS.
#
# Usage: scripts/bench/ab.sh BIN_A BIN_B ENGINE_URL [ROUNDS=8] [CONC=32] [DUR=3]
#   ENGINE_URL: an openai-compat engine answering POST /v1/chat/completions
#   for model "bench" (scripts/bench/proxy.sh's nginx engine, or any).
# Needs: wrk, python3. Nodes use free loopback ports and temporary state.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,12p "$0"; exit 64; }
A=$1 B=$2 ENGINE=$3 ROUNDS=${4:-8} CONC=${5:-32} DUR=${6:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /tmp/pair-ab.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
# shellcheck source=engine.sh
source "$HERE/engine.sh"
read -r -a P <<<"$(free_ports 6)"
start() { # name bin ollama openai cluster
    mkdir -p "$WORK/$1"
    "$2" run --state-dir "$WORK/$1" --name "$1" --ollama-face "127.0.0.1:$3" \
        --openai-face "127.0.0.1:$4" --cluster "127.0.0.1:$5" \
        --engine "openai-compat=$ENGINE" --mdns off >"$WORK/$1.log" 2>&1 &
    PIDS+=($!)
}
start a "$A" "${P[0]}" "${P[1]}" "${P[2]}"
start b "$B" "${P[3]}" "${P[4]}" "${P[5]}"
URL_A="http://127.0.0.1:${P[1]}/v1/chat/completions"
URL_B="http://127.0.0.1:${P[4]}/v1/chat/completions"
for u in "$URL_A" "$URL_B"; do
    for _ in $(seq 100); do
        code=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
            -d '{"model":"bench","messages":[]}' "$u" || true)
        [ "$code" = 200 ] && break
        sleep 0.1
    done
    [ "$code" = 200 ] || { echo "no 200 from $u" >&2; exit 1; }
    wrk -t2 -c"$CONC" -d1s -s "$HERE/post.lua" "$u" >/dev/null
done
run() { # pid url -> "cpu_us rps p99_us"
    local c0 c1 out
    c0=$(cpu_ticks "$1")
    out=$(wrk -t2 -c"$CONC" -d"${DUR}s" -s "$HERE/post.lua" "$2" | grep '^RESULT')
    c1=$(cpu_ticks "$1")
    python3 - "$c0" "$c1" "$(getconf CLK_TCK)" "$out" <<'EOF'
import sys
c0, c1, hz, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
f = dict(kv.split("=") for kv in out.split()[1:])
print(f"{(c1 - c0) * 1e6 / hz / int(f['requests']):.1f} {float(f['rps']):.0f} {f['p99_us']}")
EOF
}
: >"$WORK/rows"
for r in $(seq "$ROUNDS"); do
    # The second of two runs back to back does better on a busy box
    # (docs/benchmarks/proxy.md, fifth round): each build goes first in
    # every other round.
    if ((r % 2)); then
        ra=$(run "${PIDS[0]}" "$URL_A")
        rb=$(run "${PIDS[1]}" "$URL_B")
    else
        rb=$(run "${PIDS[1]}" "$URL_B")
        ra=$(run "${PIDS[0]}" "$URL_A")
    fi
    echo "$ra $rb" >>"$WORK/rows"
    echo "round $r  A: ${ra// / }  B: ${rb// / }   (cpu_us rps p99_us)"
done
python3 - "$WORK/rows" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
for name, off in (("A", 0), ("B", 3)):
    cpu, rps, p99 = (statistics.median(r[off + i] for r in rows) for i in range(3))
    print(f"median {name}: {cpu:.1f} µs CPU/request, {rps:.0f} req/s, p99 {p99:.0f} µs")
EOF
