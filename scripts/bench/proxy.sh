#!/usr/bin/env bash
# scripts/bench/proxy.sh — the proxy benchmarks of docs/benchmarks/proxy.md,
# side by side in one run on 127.0.0.1:
#   1. added latency of the local face over the engine, vs nginx as a plain
#      reverse proxy (c=1 and c=32, wrk), the engine being nginx itself
#      answering a fixed small chat completion;
#   2. added latency of one peer hop over mTLS (two nodes paired with the
#      CLI, requests pinned to the peer) vs that peer's own face;
#   3. added time to first byte of a streamed answer (raw-socket client);
#   4. idle RSS of a node, then RSS while 1,000 concurrent streams pass
#      through it.
# Every figure is the median of $RUNS runs (variants interleaved per run, in
# an order that rotates from run to run); the face section also compares pair
# with nginx run by run (median paired difference, with its 95 % interval).
#
# Usage: scripts/bench/proxy.sh            (builds release binaries first)
# Env:   RUNS=3 DUR=5 TTFB_N=2000 STREAMS=1000 SLOW_SECONDS=6
#        SKIP_BUILD=1 (use existing binaries)  BIN_DIR=<dir with pair-node>
#        RESULTS=<file> (markdown output; default /tmp/pair-bench-proxy-results.md)
#        SECTIONS=face,ttfb,hop,mem (which parts to run)  NODE_ARGS="..." (extra
#        flags for every pair-node run)  ALT_ARGS="..." (face section: a second
#        node with these extra flags, measured in the same runs as pair-alt)
#        ALT_BIN=<pair-node binary> (the second node runs this build instead)
#        PAIR_BIN=<pair-node binary> (measured as pair instead of $BIN_DIR's)
#        PGO=1 (pair is scripts/build-pgo.sh's build, the plain one pair-alt)
#        PERF=1 (perf record the face node
#        during its c=32 runs; report in $WORK/face.perf, implies KEEP_WORK)
#        STRACE=1 (strace -c -f the face node during its first c=32 run; in
#        $WORK/face.strace; slows that run, so its figures are not comparable)
# Needs: nginx, wrk, hey (installed with apt-get if missing), python3, curl.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/scripts/bench"
# shellcheck source=engine.sh
source "$HERE/engine.sh"
RUNS=${RUNS:-3}
DUR=${DUR:-5}
TTFB_N=${TTFB_N:-2000}
STREAMS=${STREAMS:-1000}
SLOW_SECONDS=${SLOW_SECONDS:-6}
BIN_DIR=${BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
PY=${PYTHON:-python3}
SECTIONS=${SECTIONS:-face,ttfb,hop,mem}
want() { [[ ",$SECTIONS," == *",$1,"* ]]; }
[ -n "${PERF:-}${STRACE:-}" ] && KEEP_WORK=1

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# ------------------------------------------------------------------ tools
missing=()
for t in nginx wrk hey; do command -v "$t" >/dev/null || missing+=("$t"); done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt_install nginx wrk hey
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
command -v curl >/dev/null || die "curl is required"

if [ -z "${SKIP_BUILD:-}" ]; then
    log "building release binaries (cargo build --release -p pair-node -p pair-sim)"
    (cd "$ROOT" && cargo build --release -p pair-node -p pair-sim)
fi
PAIR_NODE=${PAIR_BIN:-$BIN_DIR/pair-node}
if [ -n "${PGO:-}" ]; then
    # The profile-guided build is measured as pair, the plain one as
    # pair-alt (unless told otherwise).
    [ -n "${ALT_BIN:-}${ALT_ARGS:-}" ] || ALT_BIN=$PAIR_NODE
    log "building the profile-guided pair-node (scripts/build-pgo.sh)"
    PAIR_NODE=$("$ROOT/scripts/build-pgo.sh")
fi
# The floor: a minimal hyper forwarder (crates/pair-http/examples), if built.
FLOOR=${FLOOR:-$BIN_DIR/examples/floor_forwarder}
# A floor without hyper: HTTP/1.1 framed on httparse (examples), if built.
RAW=${RAW:-$BIN_DIR/examples/raw_forwarder}
[ -x "$PAIR_NODE" ] || die "no $PAIR_NODE (build it or set BIN_DIR)"

# 1,000 streams need ~2,000 descriptors in the node and more in nginx.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ------------------------------------------------------------------ setup
WORK=$(mktemp -d /tmp/pair-bench.XXXXXX)
RESULTS=${RESULTS:-${TMPDIR:-/tmp}/pair-bench-proxy-results.md}
TSV="$WORK/results.tsv"
: >"$TSV"
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Distinct free loopback ports, all held open until every one is chosen.
read -r -a PORTS <<<"$(free_ports 16)"
# One more free loopback port (for the optional variants).
free_port() { free_ports 1; }
P_ENGINE=${PORTS[0]}
P_NGX=${PORTS[1]}
P_DEAD=${PORTS[2]} # nothing listens here: node A's own engine

# ------------------------------------------------------------- nginx
mkdir -p "$WORK/nginx-tmp"
bench_engine_config "$P_ENGINE" "$WORK" 2 >"$WORK/engine.conf"
nginx_proxy_config "$WORK" 2 "$P_ENGINE" "$P_NGX" >"$WORK/proxy.conf"
for c in engine proxy; do
    "$NGINX" -t -q -c "$WORK/$c.conf" -p "$WORK" -e "$WORK/$c-error.log" || die "nginx $c config"
    "$NGINX" -c "$WORK/$c.conf" -p "$WORK" -e "$WORK/$c-error.log" &
    PIDS+=($!)
done

wait_http() { # url: wait until it answers at all
    local i
    for ((i = 0; i < 100; i++)); do
        curl -s -o /dev/null "$1" && return 0
        sleep 0.1
    done
    die "nothing answers at $1"
}
wait_http "http://127.0.0.1:$P_ENGINE/health"
wait_http "http://127.0.0.1:$P_NGX/health"

# ------------------------------------------------------------- pair nodes
# start_node NAME ENGINE_PORT OLLAMA_PORT OPENAI_PORT CLUSTER_PORT
declare -A NODE_PID
start_node() {
    mkdir -p "$WORK/$1"
    "${BIN:-$PAIR_NODE}" run --state-dir "$WORK/$1" --name "$1" \
        --ollama-face "127.0.0.1:$3" --openai-face "127.0.0.1:$4" \
        --cluster "127.0.0.1:$5" --engine "openai-compat=http://127.0.0.1:$2" \
        --mdns off ${NODE_ARGS:-} ${EXTRA:-} >"$WORK/$1.log" 2>&1 &
    NODE_PID[$1]=$!
    PIDS+=($!)
    wait_http "http://127.0.0.1:$4/_pair/status"
}
stop_node() {
    kill "${NODE_PID[$1]}" 2>/dev/null || true
    wait "${NODE_PID[$1]}" 2>/dev/null || true
}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
# chat URL [header...]: one request, prints the status code
chat_status() {
    local url=$1; shift
    local h=()
    for x in "$@"; do h+=(-H "$x"); done
    curl -s -o /dev/null -w '%{http_code}' "${h[@]}" -H 'content-type: application/json' \
        -d '{"model":"bench","messages":[{"role":"user","content":"hi"}]}' "$url" || true
}
wait_routable() { # url [header...]: until the node routes "bench" (inventory polled)
    local i
    for ((i = 0; i < 300; i++)); do
        [ "$(chat_status "$@")" = 200 ] && return 0
        sleep 0.1
    done
    die "no 200 from $1 within 30 s"
}

CLK_TCK=$(getconf CLK_TCK)
# run_wrk SECTION VARIANT CONC RUN URL [PIN] [MODE]
# $CPU_PIDS (optional): the proxy's processes, for CPU time per request.
run_wrk() {
    local threads=1 out c0 c1 x0 x1 cpu=""
    [ "$3" -gt 1 ] && threads=2
    [ -n "${CPU_PIDS:-}" ] && c0=$(cpu_ticks $CPU_PIDS) && x0=$(ctx_switches $CPU_PIDS)
    out=$(BENCH_PIN=${6:-} BENCH_MODE=${7:-} BENCH_KEY=${BENCH_KEY:-} wrk -t"$threads" -c"$3" -d"${DUR}s" \
        -s "$HERE/post.lua" "$5" | grep '^RESULT') || die "wrk $1/$2 c=$3"
    if [ -n "${CPU_PIDS:-}" ]; then
        c1=$(cpu_ticks $CPU_PIDS)
        x1=$(ctx_switches $CPU_PIDS)
        cpu=$($PY -c "import sys; t, x, n = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3].split('requests=')[1].split()[0]); print(f' cpu_us={t * 1e6 / $CLK_TCK / n:.1f} ctx={x / n:.2f}')" "$((c1 - c0))" "$((x1 - x0))" "$out")
    fi
    log "$1 $2 c=$3 run $4: $out$cpu"
    case "$out" in *errors=0*) ;; *) die "$1 $2 c=$3: errors: $out" ;; esac
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${out#RESULT }$cpu" >>"$TSV"
}
warm() { # url [pin]: a short untimed run (connections, pools, caches)
    BENCH_PIN=${2:-} BENCH_KEY=${BENCH_KEY:-} wrk -t1 -c32 -d1s -s "$HERE/post.lua" "$1" >/dev/null
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ===================================================== 1. local face
NGX_PIDS="$(cat "$WORK/proxy.pid") $(pgrep -P "$(cat "$WORK/proxy.pid")" | tr '\n' ' ')"
if want face || want ttfb; then
    # The same node opens its LAN face too: the face section measures it
    # beside the loopback face (its door: the Host check, the API key, the
    # key's rate), with a key made as a user makes one.
    P_LAN=$(free_port)
    EXTRA="--lan-face 127.0.0.1:$P_LAN --lan-max-per-address 64" \
        start_node solo "$P_ENGINE" "${PORTS[3]}" "${PORTS[4]}" "${PORTS[5]}"
    sleep 2
    SOLO_IDLE_KB=$(rss_kb "${NODE_PID[solo]}")
    SOLO_URL="http://127.0.0.1:${PORTS[4]}/v1/chat/completions"
    wait_routable "$SOLO_URL"
    LAN_KEY=$("$PAIR_NODE" keys add bench --rate 100000000 --control "http://127.0.0.1:${PORTS[3]}" \
        --state-dir "$WORK/solo" --json | $PY -c 'import json, sys; print(json.load(sys.stdin)["secret"])') ||
        die "keys add"
    LAN_URL="http://127.0.0.1:$P_LAN/v1/chat/completions"
    wait_routable "$LAN_URL" "authorization: Bearer $LAN_KEY"
fi
if want face; then
    log "1. local face vs nginx (engine: nginx fixed answer)"
    DIRECT_URL="http://127.0.0.1:$P_ENGINE/v1/chat/completions"
    NGX_URL="http://127.0.0.1:$P_NGX/v1/chat/completions"
    FLOOR_URL="http://127.0.0.1:${PORTS[15]}/v1/chat/completions"
    if [ -n "${ALT_ARGS:-}${ALT_BIN:-}" ]; then
        P_ALT=$(free_port)
        P_ALT2=$(free_port)
        P_ALT3=$(free_port)
        EXTRA=${ALT_ARGS:-} BIN=${ALT_BIN:-$PAIR_NODE} start_node alt "$P_ENGINE" "$P_ALT" "$P_ALT2" "$P_ALT3"
        ALT_URL="http://127.0.0.1:$P_ALT2/v1/chat/completions"
        wait_routable "$ALT_URL"
        warm "$ALT_URL"
    fi
    if [ -x "$FLOOR" ]; then
        "$FLOOR" "127.0.0.1:${PORTS[15]}" "http://127.0.0.1:$P_ENGINE/" pool >"$WORK/floor.log" 2>&1 &
        FLOOR_PID=$!
        PIDS+=($FLOOR_PID)
        wait_http "http://127.0.0.1:${PORTS[15]}/health"
        # A second floor variant, $FLOOR2 = its mode and worker count (default:
        # thread per core, 2 current-thread workers; "pinned" = one upstream
        # connection per client connection).
        P_PINNED=$(free_port)
        "$FLOOR" "127.0.0.1:$P_PINNED" "http://127.0.0.1:$P_ENGINE/" ${FLOOR2:-pool 2} >"$WORK/floor2.log" 2>&1 &
        PINNED_PID=$!
        PIDS+=($PINNED_PID)
        PINNED_URL="http://127.0.0.1:$P_PINNED/v1/chat/completions"
        wait_http "http://127.0.0.1:$P_PINNED/health"
    fi
    if [ -x "$RAW" ]; then
        P_RAW=$(free_port)
        "$RAW" "127.0.0.1:$P_RAW" "127.0.0.1:$P_ENGINE" 2 >"$WORK/raw.log" 2>&1 &
        RAW_PID=$!
        PIDS+=($RAW_PID)
        RAW_URL="http://127.0.0.1:$P_RAW/v1/chat/completions"
        wait_http "http://127.0.0.1:$P_RAW/health"
        warm "$RAW_URL"
    fi
    for u in "$DIRECT_URL" "$NGX_URL" "$SOLO_URL"; do warm "$u"; done
    BENCH_KEY=$LAN_KEY warm "$LAN_URL"
    [ -n "${FLOOR_PID:-}" ] && warm "$FLOOR_URL" && warm "$PINNED_URL"
    # The variants of one run, in an order that rotates from run to run:
    # on this box the variant measured second of two did better in every
    # A/B (docs/benchmarks/proxy.md, fifth round), so a fixed order would
    # favour whoever follows whom. report.py compares pair with nginx run
    # by run (paired differences), which the rotation keeps fair.
    VARIANTS=(direct nginx)
    [ -n "${FLOOR_PID:-}" ] && VARIANTS+=(floor floor2)
    [ -n "${RAW_PID:-}" ] && VARIANTS+=(raw)
    VARIANTS+=(pair pair-lan)
    [ -n "${ALT_URL:-}" ] && VARIANTS+=(pair-alt)
    face_variant() { # VARIANT CONC RUN
        case $1 in
            direct) run_wrk face direct "$2" "$3" "$DIRECT_URL" ;;
            nginx) CPU_PIDS=$NGX_PIDS run_wrk face nginx "$2" "$3" "$NGX_URL" ;;
            floor) CPU_PIDS=$FLOOR_PID run_wrk face floor "$2" "$3" "$FLOOR_URL" ;;
            floor2) CPU_PIDS=$PINNED_PID run_wrk face floor2 "$2" "$3" "$PINNED_URL" ;;
            raw)
                if [ -n "${PERF:-}" ] && [ "$2" = 32 ] && [ "$3" = 1 ]; then
                    perf record -q ${PERF_ARGS:--g} -o "$WORK/raw.data" -p "$RAW_PID" \
                        -- sleep "$DUR" >/dev/null 2>&1 &
                    RAW_PERF=$!
                fi
                CPU_PIDS=$RAW_PID run_wrk face raw "$2" "$3" "$RAW_URL"
                if [ -n "${RAW_PERF:-}" ]; then
                    wait "$RAW_PERF" || true
                    RAW_PERF=""
                fi
                ;;
            pair)
                if [ -n "${STRACE:-}" ] && [ "$2" = 32 ] && [ "$3" = 1 ]; then
                    strace -c -f -o "$WORK/face.strace" -p "${NODE_PID[solo]}" >/dev/null 2>&1 &
                    STRACE_PID=$!
                fi
                if [ -n "${PERF:-}" ] && [ "$2" = 32 ] && [ "$3" = 1 ]; then
                    perf record -q ${PERF_ARGS:--g} -o "$WORK/face.data" -p "${NODE_PID[solo]}" \
                        -- sleep "$DUR" >/dev/null 2>&1 &
                    PERF_PID=$!
                fi
                CPU_PIDS=${NODE_PID[solo]} run_wrk face pair "$2" "$3" "$SOLO_URL"
                if [ -n "${STRACE_PID:-}" ]; then
                    kill -INT "$STRACE_PID" 2>/dev/null || true
                    wait "$STRACE_PID" 2>/dev/null || true
                    log "strace summary: $WORK/face.strace"
                    STRACE_PID=""
                fi
                if [ -n "${PERF_PID:-}" ]; then
                    wait "$PERF_PID" || true
                    perf report -i "$WORK/face.data" --no-children --percent-limit 0.7 \
                        --stdio -g none >"$WORK/face.perf" 2>/dev/null || true
                    log "perf report: $WORK/face.perf"
                    PERF_PID=""
                fi
                ;;
            pair-alt) CPU_PIDS=${NODE_PID[alt]} run_wrk face pair-alt "$2" "$3" "$ALT_URL" ;;
            pair-lan) BENCH_KEY=$LAN_KEY CPU_PIDS=${NODE_PID[solo]} run_wrk face pair-lan "$2" "$3" "$LAN_URL" ;;
        esac
    }
    for ((r = 1; r <= RUNS; r++)); do
        for c in 1 32; do
            n=${#VARIANTS[@]}
            for ((i = 0; i < n; i++)); do
                face_variant "${VARIANTS[(i + r) % n]}" "$c" "$r"
            done
        done
    done
    SOLO_AFTER_KB=$(rss_kb "${NODE_PID[solo]}")
    [ -n "${ALT_URL:-}" ] && stop_node alt
fi

# ===================================================== 3. streaming TTFB
if want ttfb; then
    log "3. time to first byte of a streamed answer"
    for ((r = 1; r <= RUNS; r++)); do
        for v in direct nginx pair; do
            case $v in
                direct) addr="127.0.0.1:$P_ENGINE" ;;
                nginx) addr="127.0.0.1:$P_NGX" ;;
                pair) addr="127.0.0.1:${PORTS[4]}" ;;
            esac
            out=$($PY "$HERE/ttfb.py" "$addr" /v1/chat/completions "$TTFB_N" "x-bench: stream") ||
                die "ttfb $v"
            log "ttfb $v run $r: $out"
            printf '%s\t%s\t%s\t%s\t%s\n' ttfb "$v" 1 "$r" "${out#RESULT }" >>"$TSV"
        done
        # The same stream through the same node, translated (Ollama's
        # /api/chat, Anthropic's /v1/messages, OpenAI's /v1/responses),
        # interleaved with the untranslated one request by request.
        for v in ollama anthropic responses; do
            case $v in
                ollama) other="127.0.0.1:${PORTS[3]} /api/chat" ;;
                anthropic) other="127.0.0.1:${PORTS[4]} /v1/messages" ;;
                responses) other="127.0.0.1:${PORTS[4]} /v1/responses" ;;
            esac
            # shellcheck disable=SC2086
            out=$(cd "$HERE" && $PY ttfb_pair.py "127.0.0.1:${PORTS[4]}" /v1/chat/completions \
                $other "$TTFB_N" "x-bench: stream") || die "ttfb translated $v"
            log "ttfb translated $v run $r: $out"
            printf '%s\t%s\t%s\t%s\t%s\n' translated "$v" 1 "$r" "${out#RESULT }" >>"$TSV"
        done
    done
fi
if want face || want ttfb; then stop_node solo; fi

# ===================================================== 2. peer hop
if want hop; then
    log "2. one peer hop over mTLS (A pinned to B; B's engine: nginx)"
    start_node a "$P_DEAD" "${PORTS[6]}" "${PORTS[7]}" "${PORTS[8]}"
    start_node b "$P_ENGINE" "${PORTS[9]}" "${PORTS[10]}" "${PORTS[11]}"
    PIN=$("$PAIR_NODE" pair invite --control "http://127.0.0.1:${PORTS[6]}" --state-dir "$WORK/a" --json |
        $PY -c 'import json,sys; print(json.load(sys.stdin)["pin"])')
    "$PAIR_NODE" pair join "127.0.0.1:${PORTS[8]}" --pin "$PIN" \
        --control "http://127.0.0.1:${PORTS[9]}" --state-dir "$WORK/b" --json >"$WORK/join.json"
    B_ID=$("$PAIR_NODE" status --json --control "http://127.0.0.1:${PORTS[9]}" |
        $PY -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    A_URL="http://127.0.0.1:${PORTS[7]}/v1/chat/completions"
    B_URL="http://127.0.0.1:${PORTS[10]}/v1/chat/completions"
    wait_routable "$A_URL" "x-pair-node-pin: $B_ID"
    served_by=$(curl -s -D - -o /dev/null -H 'content-type: application/json' \
        -H "x-pair-node-pin: $B_ID" -d '{"model":"bench","messages":[]}' "$A_URL" |
        tr -d '\r' | awk -F': ' 'tolower($1)=="x-pair-node" {print $2}')
    case "$served_by" in *"$B_ID"*) log "A routes to B: x-pair-node: $served_by" ;;
        *) die "A's answer did not come from B (x-pair-node: $served_by)" ;; esac
    warm "$B_URL"
    warm "$A_URL" "$B_ID"
    for ((r = 1; r <= RUNS; r++)); do
        for c in 1 32; do
            run_wrk hop b-face "$c" "$r" "$B_URL"
            run_wrk hop a-to-b "$c" "$r" "$A_URL" "$B_ID"
        done
    done
    stop_node a
    stop_node b
fi

# ===================================================== 4. memory
if want mem; then
    log "4. memory: idle, then $STREAMS concurrent streams"
    start_node mem "$P_ENGINE" "${PORTS[12]}" "${PORTS[13]}" "${PORTS[14]}"
    MEM_URL="http://127.0.0.1:${PORTS[13]}/v1/chat/completions"
    MEM_PID=${NODE_PID[mem]}
    sleep 2
    wait_routable "$MEM_URL"
    sleep 3
    MEM_IDLE_KB=$(rss_kb "$MEM_PID")
    # Sample RSS, established client connections and the node's own in-flight
    # count while hey holds $STREAMS slow streams open.
    touch "$WORK/sampling"
    echo "0 0 0" >"$WORK/peak"
    (
        peak=0 conns=0 inflight=0
        while [ -e "$WORK/sampling" ]; do
            kb=$(rss_kb "$MEM_PID")
            ((kb > peak)) && peak=$kb
            n=$(ss -Htn state established "( sport = :${PORTS[13]} )" | wc -l)
            ((n > conns)) && conns=$n
            f=$(curl -s "http://127.0.0.1:${PORTS[12]}/_pair/status" |
                $PY -c 'import json,sys; print(json.load(sys.stdin)["in_flight"])' 2>/dev/null || echo 0)
            ((f > inflight)) && inflight=$f
            echo "$peak $conns $inflight" >"$WORK/peak"
            sleep 0.2
        done
    ) &
    SAMPLER=$!
    PIDS+=($SAMPLER)
    STREAM_T0=$(date +%s.%N)
    hey -n "$STREAMS" -c "$STREAMS" -t 120 -m POST -T application/json \
        -H 'x-bench: slow' \
        -d '{"model":"bench","messages":[{"role":"user","content":"hi"}],"stream":true}' \
        "$MEM_URL" >"$WORK/hey.txt" 2>&1 || true
    STREAM_T1=$(date +%s.%N)
    rm -f "$WORK/sampling"
    wait "$SAMPLER" 2>/dev/null || true
    read -r MEM_PEAK_KB MEM_CONNS MEM_INFLIGHT <"$WORK/peak"
    sleep 1
    MEM_AFTER_KB=$(rss_kb "$MEM_PID")
    # The status line ("  [200]  1000 responses"), not a latency histogram
    # bucket that happens to hold 200 answers ("  7.1 [200] |■■■").
    STREAMS_OK=$(awk '$1 == "[200]" {print $2; exit}' "$WORK/hey.txt")
    STREAMS_OK=${STREAMS_OK:-0}
    STREAM_WALL=$($PY -c "print(f'{$STREAM_T1 - $STREAM_T0:.1f}')")
    log "streams: $STREAMS_OK/$STREAMS answered 200, peak RSS ${MEM_PEAK_KB} kB, peak conns $MEM_CONNS, peak in-flight $MEM_INFLIGHT, ${STREAM_WALL}s"
    stop_node mem
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ===================================================== report
export TSV RUNS DUR TTFB_N STREAMS SLOW_SECONDS LOAD_BEFORE LOAD_AFTER SECTIONS
export ALT_ARGS=${ALT_ARGS:-} ALT_BIN=${ALT_BIN:-}
export SOLO_IDLE_KB=${SOLO_IDLE_KB:-0} SOLO_AFTER_KB=${SOLO_AFTER_KB:-0} \
    MEM_IDLE_KB=${MEM_IDLE_KB:-0} MEM_PEAK_KB=${MEM_PEAK_KB:-0} MEM_AFTER_KB=${MEM_AFTER_KB:-0} \
    MEM_CONNS=${MEM_CONNS:-0} MEM_INFLIGHT=${MEM_INFLIGHT:-0} STREAMS_OK=${STREAMS_OK:-0} \
    STREAM_WALL=${STREAM_WALL:-0}
$PY "$HERE/report.py" >"$RESULTS"
cat "$RESULTS"
log "results in $RESULTS (raw: $TSV)"
if [ -n "${RESULTS_TSV:-}" ]; then cp "$TSV" "$RESULTS_TSV"; fi
