"""Added time to first body byte of a translated stream, measured against
the untranslated one through the same node, interleaved request by request
(one keep-alive connection each) so that the machine's drifts hit both
alike.

Used by scripts/bench/proxy.sh:
    python3 ttfb_pair.py BASE_ADDR BASE_PATH OTHER_ADDR OTHER_PATH N [Header: value ...]
Prints one line: RESULT added_p50_us=.. pair_median_us=.. base_p50_us=.. other_p50_us=.. n=..
added_p50_us is the difference of the two medians; pair_median_us the
median of the per-pair differences.
"""

import socket
import statistics
import sys

from ttfb import BODIES, one


def connect(addr):
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request(addr, path, extra):
    body = BODIES[path]
    return (
        f"POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def main():
    base_addr, base_path, other_addr, other_path = sys.argv[1:5]
    n = int(sys.argv[5])
    extra = "".join(f"{h}\r\n" for h in sys.argv[6:])
    a, b = connect(base_addr), connect(other_addr)
    ra, rb = request(base_addr, base_path, extra), request(other_addr, other_path, extra)
    for _ in range(max(10, n // 10)):
        one(a, ra)
        one(b, rb)
    xs, ys = [], []
    for i in range(n):
        # Alternate which goes first, so neither always follows the other.
        if i % 2:
            xs.append(one(a, ra))
            ys.append(one(b, rb))
        else:
            ys.append(one(b, rb))
            xs.append(one(a, ra))
    mx, my = statistics.median(xs), statistics.median(ys)
    paired = statistics.median(y - x for x, y in zip(xs, ys))
    print(
        f"RESULT added_p50_us={my - mx:.1f} pair_median_us={paired:.1f} "
        f"base_p50_us={mx:.0f} other_p50_us={my:.0f} n={n}"
    )


if __name__ == "__main__":
    main()
