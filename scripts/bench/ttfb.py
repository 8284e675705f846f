"""Time to first body byte of a streamed answer, over one keep-alive
HTTP/1.1 connection (raw sockets, so the client adds almost nothing).

Used by scripts/bench/proxy.sh:
    python3 ttfb.py HOST:PORT PATH N [Header: value ...]
PATH is /v1/chat/completions, /api/chat or /v1/messages (the body follows).
Prints one line: RESULT p50_us=.. p90_us=.. p99_us=.. n=..
Each sample is the time from sending the request to receiving the first
byte of the response body; the rest of the answer is then read to the end
so the connection can be reused.
"""

import socket
import statistics
import sys
import time

# The same streamed chat in each client API, picked by the path: OpenAI's
# (untranslated), Ollama's and Anthropic's (translated by the node when its
# engine speaks OpenAI).
BODIES = {
    "/v1/chat/completions": (
        b'{"model":"bench","messages":[{"role":"user","content":"Say hello."}],'
        b'"max_tokens":16,"stream":true}'
    ),
    "/api/chat": (
        b'{"model":"bench","messages":[{"role":"user","content":"Say hello."}],'
        b'"options":{"num_predict":16},"stream":true}'
    ),
    "/v1/messages": (
        b'{"model":"bench","messages":[{"role":"user","content":"Say hello."}],'
        b'"max_tokens":16,"stream":true}'
    ),
    "/v1/responses": (
        b'{"model":"bench","input":[{"role":"user","content":"Say hello."}],'
        b'"max_output_tokens":16,"stream":true}'
    ),
}


def read_head(sock, buf):
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response head")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, rest


def one(sock, request):
    t0 = time.perf_counter_ns()
    sock.sendall(request)
    status, headers, rest = read_head(sock, b"")
    if status != 200:
        raise RuntimeError(f"HTTP {status}")
    # First body byte: for chunked answers, the first data byte after the
    # chunk-size line; otherwise any byte.
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    buf = rest
    while True:
        if chunked:
            if b"\r\n" in buf and len(buf.split(b"\r\n", 1)[1]) > 0:
                break
        elif buf:
            break
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the first body byte")
        buf += chunk
    t1 = time.perf_counter_ns()
    # Drain the rest of the answer.
    if chunked:
        while not buf.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed mid-answer")
            buf += chunk
    else:
        length = int(headers["content-length"])
        while len(buf) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed mid-answer")
            buf += chunk
    return (t1 - t0) / 1000.0


def main():
    addr, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    body = BODIES[path]
    extra = "".join(f"{h}\r\n" for h in sys.argv[4:])
    host, port = addr.rsplit(":", 1)
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(max(10, n // 10)):
        one(sock, request)  # warm-up
    samples = sorted(one(sock, request) for _ in range(n))
    q = statistics.quantiles(samples, n=100)
    print(f"RESULT p50_us={q[49]:.0f} p90_us={q[89]:.0f} p99_us={q[98]:.0f} n={n}")


if __name__ == "__main__":
    main()
