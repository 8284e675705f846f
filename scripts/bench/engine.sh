# scripts/bench/engine.sh — sourced by the bench scripts: the nginx
# configuration they share, the benchmark engine alone (nginx answering
# a fixed small chat completion, and what pair-node's openai-compat poller
# reads) for the scripts that need only it, and the /proc readings they
# take of the processes they measure.

# The benchmark engine's answer: a small non-streamed chat completion.
BENCH_CHAT='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}'

# sse_body N VAR: sets VAR to a streamed chat completion of N token
# events, then [DONE] (set, not printed: $(...) would strip the stream's
# last blank line).
sse_body() {
    local i out=""
    for ((i = 0; i < $1; i++)); do
        out+="data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok$i \"}}]}"$'\n\n'
    done
    out+=$'data: [DONE]\n\n'
    printf -v "$2" '%s' "$out"
}

# ... a short streamed one (eight token events), and a long one (48; nginx
# caps one parameter at 4 KB).
sse_body 8 BENCH_SSE
sse_body 48 BENCH_SSE_LONG

# apt_install PACKAGE...: installs Debian packages (with sudo unless root).
# A fresh machine's package lists may not name the package yet (seen for
# llvm-22): a failed install updates them and tries once more.
apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 || {
        $sudo apt-get update -qq >/dev/null
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    }
}

# nginx_preamble NAME DIR WORKERS: the start of an nginx configuration
# (through `http {` and its common settings) with state and logs under DIR.
nginx_preamble() {
    cat <<CONF
daemon off;
master_process on;
worker_processes $3;
worker_rlimit_nofile 20000;
pid $2/$1.pid;
error_log $2/$1-error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $2/nginx-tmp/body;
    proxy_temp_path $2/nginx-tmp/proxy;
    fastcgi_temp_path $2/nginx-tmp/fastcgi;
    uwsgi_temp_path $2/nginx-tmp/uwsgi;
    scgi_temp_path $2/nginx-tmp/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
CONF
}

# nginx_proxy_config DIR WORKERS ENGINE_PORT PORT: nginx as a plain reverse
# proxy on 127.0.0.1:PORT to the engine on ENGINE_PORT (a keep-alive pool,
# HTTP/1.1, no buffering), the configuration every bench compares with.
nginx_proxy_config() {
    nginx_preamble proxy "$1" "$2"
    cat <<CONF
    upstream engine {
        server 127.0.0.1:$3;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$4;
        location / {
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
CONF
}

# sse_location PATH BODY [RATE]: an internal nginx location answering BODY
# as an SSE stream (trickled at RATE bytes a second if given).
sse_location() {
    cat <<CONF
        location = $1 {
            internal;
            default_type text/event-stream;${3:+
            limit_rate $3;}
            return 200 '$2';
        }
CONF
}

# What pair-node's openai-compat poller reads from an engine, as nginx
# locations.
engine_poller_locations() {
    cat <<'CONF'
        location = /health { return 200 '{"status":"ok"}'; }
        location = /props { return 200 '{"total_slots":1024}'; }
        location = /v1/models {
            return 200 '{"object":"list","data":[{"id":"bench","object":"model","owned_by":"bench"}]}';
        }
CONF
}

# bench_engine_config PORT DIR WORKERS: the benchmark engine's nginx
# configuration, on 127.0.0.1:PORT with state under DIR (which needs a
# nginx-tmp folder). An x-bench header (post.lua's BENCH_MODE; the
# proxies pass it through) picks another answer: `stream`, the short SSE
# stream; `slow`, the long one trickled out over about SLOW_SECONDS (6).
bench_engine_config() {
    local slow_rate=$((${#BENCH_SSE_LONG} / ${SLOW_SECONDS:-6}))
    nginx_preamble engine "$2" "$3"
    cat <<CONF
    default_type application/json;
    server {
        listen 127.0.0.1:$1;
$(engine_poller_locations)
        location = /v1/chat/completions {
            if (\$http_x_bench = "stream") { rewrite ^ /_stream last; }
            if (\$http_x_bench = "slow") { rewrite ^ /_slow last; }
            return 200 '$BENCH_CHAT';
        }
$(sse_location /_stream "$BENCH_SSE")
$(sse_location /_slow "$BENCH_SSE_LONG" "$slow_rate")
        location / { return 404 '{"error":"not found"}'; }
    }
}
CONF
}

# start_bench_engine PORT DIR [WORKERS]: the engine on 127.0.0.1:PORT, one
# worker unless told. Sets ENGINE_PID.
start_bench_engine() {
    mkdir -p "$2/nginx-tmp"
    bench_engine_config "$1" "$2" "${3:-1}" >"$2/engine.conf"
    "${NGINX:-nginx}" -c "$2/engine.conf" -p "$2" -e "$2/engine-error.log" &
    ENGINE_PID=$!
}

# bench_node_args DIR NAME ENGINE OLLAMA OPENAI CLUSTER: sets the array
# BENCH_NODE_ARGS to `pair-node`'s arguments for a node named NAME in front
# of the benchmark engine on port ENGINE: state under DIR/node, its faces
# and cluster port on the given loopback ports, no mDNS.
bench_node_args() {
    BENCH_NODE_ARGS=(run --state-dir "$1/node" --name "$2"
        --ollama-face "127.0.0.1:$4" --openai-face "127.0.0.1:$5"
        --cluster "127.0.0.1:$6" --engine "openai-compat=http://127.0.0.1:$3" --mdns off)
}

# free_ports N: N distinct free loopback ports.
free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# wait_chat PORT: until a chat completion through the face at PORT answers 200.
wait_chat() {
    local i
    for ((i = 0; i < 150; i++)); do
        curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
            -d '{"model":"bench","messages":[]}' "http://127.0.0.1:$1/v1/chat/completions" 2>/dev/null |
            grep -q 200 && return 0
        sleep 0.2
    done
    echo "nothing answers on 127.0.0.1:$1" >&2
    return 1
}

# cpu_times PID...: user and system CPU time (all threads) of the given
# processes, in clock ticks (getconf CLK_TCK a second).
cpu_times() {
    local pid u=0 s=0 a b
    for pid in "$@"; do
        # Fields 14 and 15 of /proc/PID/stat; the name (field 2) may hold spaces.
        read -r a b < <(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12, $13}')
        u=$((u + a)) s=$((s + b))
    done
    echo "$u $s"
}

# cpu_ticks PID...: their user plus system time, in clock ticks.
cpu_ticks() {
    local u s
    read -r u s < <(cpu_times "$@")
    echo $((u + s))
}

# switch_counts PID...: voluntary and involuntary context switches (all
# threads) of the given processes.
switch_counts() {
    local pid
    for pid in "$@"; do cat /proc/"$pid"/task/*/status 2>/dev/null; done |
        awk '/^voluntary_ctxt/ {v += $2} /^nonvoluntary_ctxt/ {n += $2} END {print v + 0, n + 0}'
}

# ctx_switches PID...: all their context switches.
ctx_switches() {
    local v n
    read -r v n < <(switch_counts "$@")
    echo $((v + n))
}
