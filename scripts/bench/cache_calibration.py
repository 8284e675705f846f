#!/usr/bin/env python3
"""Prompt-cache calibration against the real llama-cpp-python engine: the
time to first token of a ~1.5k-token prompt cold (a fresh prompt, nothing
of it cached) and with its prefix cached (the same prompt plus ~60 new
tokens, sent right after), over several repetitions; then the same two
TTFTs and their ratio as the emulator's performance model gives them for
the profile calibrated to this engine (`cpu-smollm2-135m`), and whether
the emulator's cold/cached ratio is within 25 % of the measured one.

The emulator's figures come from the profile's constants, read from
crates/pair-emulator/src/profile.rs, the way `EngineModel::prefill_us`
uses them: the request overhead plus the uncached prompt tokens at the
prefill rate, the first token due when the prefill ends; its cache holds
whole 16-token blocks (`ENGINE_BLOCK_TOKENS` in pair-emulator's
http/api/prefix.rs), so a cached prompt re-evaluates the new tokens plus
what of the old prompt's last, partial block it could not keep.

usage: scripts/bench/cache_calibration.py [--reps 5] [--prompt-tokens 1500]
       [--new-tokens 60] [--json OUT]
Needs scripts/setup-python.sh (the llama-cpp-python venv and SmolLM2 GGUF;
PAIR_LLAMA_PYTHON / PAIR_LLAMA_MODEL override the cache). A bench, not a
test: timings on a shared machine are noisy, so run it when the machine
is quiet (`uptime`), or under `nice -n -10` (as root) so that builds
running beside it take less of the engine's two cores. Every request
stays on loopback.
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(os.path.expanduser("~"), ".cache/pair/llama-0.3.36")
BLOCK_TOKENS = 16  # the emulated engine's own blocks (pair-emulator http/api/prefix.rs)

WORDS = ("river stone cloud garden lantern copper meadow harbor violet engine "
         "window forest signal marble thunder pepper canvas orbit saddle ribbon "
         "glacier timber falcon velvet compass anchor orchard quartz ember tunnel "
         "harvest pillar mirror beacon walnut cobalt prairie summit willow cinder").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python, model, port, threads):
    args = [python, "-m", "llama_cpp.server", "--model", model, "--model_alias", "smollm2",
            "--host", "127.0.0.1", "--port", str(port),
            # Without this a second request silently truncates the first stream.
            "--interrupt_requests", "False", "--n_ctx", "2048"]
    if threads:
        args += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/v1/models")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("llama-cpp-python did not start")


def post(port, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return c, c.getresponse()


def token_count(port, text):
    c, r = post(port, "/extras/tokenize/count", {"input": text})
    n = json.load(r)["count"]
    c.close()
    return n


def ttft(port, prompt):
    """Seconds from sending a streamed completion to its first SSE event."""
    t0 = time.perf_counter()
    c, r = post(port, "/v1/completions", {
        "model": "smollm2", "prompt": prompt, "max_tokens": 4, "stream": True,
        "temperature": 0})
    if r.status != 200:
        sys.exit(f"the engine answered {r.status}: {r.read()[:200]!r}")
    first = None
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data:") and first is None:
            first = time.perf_counter() - t0
    c.close()
    if first is None:
        sys.exit("no event came back")
    return first


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def fresh_prompt(port, k, tokens):
    """A prompt of about `tokens` tokens that shares nothing with another
    k's: it opens with its own number."""
    rng = random.Random(k)
    text = f"Note {k}: " + words(rng, tokens)
    # Trim to the count the tokenizer gives (a word may be several tokens).
    n = token_count(port, text)
    while n > tokens + 8:
        text = text.rsplit(" ", max(1, (n - tokens) // 2))[0]
        n = token_count(port, text)
    return text, n


def profile_constants():
    """prefill_tps and request_overhead_us of `cpu-smollm2-135m`."""
    src = open(os.path.join(ROOT, "crates/pair-emulator/src/profile.rs")).read()
    body = src[src.index("fn cpu_smollm2_135m"):]
    body = body[:body.index("\n    }\n")]
    tps = float(re.search(r"prefill_tps:\s*([\d_.]+)", body).group(1).replace("_", ""))
    overhead = int(re.search(r"request_overhead_us:\s*([\d_]+)", body).group(1).replace("_", ""))
    return tps, overhead


def emulated(tps, overhead_us, cold_tokens, cached_prefix, total_tokens):
    """The model's TTFT (s) of a prompt of `total_tokens` of which
    `cached_prefix` tokens were seen before: whole blocks of it are cached."""
    cached = (cached_prefix // BLOCK_TOKENS) * BLOCK_TOKENS
    # llama.cpp and the model always evaluate at least one token.
    uncached = max(1, total_tokens - cached)
    return (overhead_us + uncached / tps * 1e6) / 1e6, (overhead_us + cold_tokens / tps * 1e6) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--new-tokens", type=int, default=60)
    ap.add_argument("--threads", type=int, default=0,
                    help="the engine's n_threads and n_threads_batch (0: its defaults, 1 and "
                         "2 on two cores); 1 keeps a prefill's threads from waiting on each "
                         "other when a build holds a core")
    ap.add_argument("--json")
    a = ap.parse_args()
    python = os.environ.get("PAIR_LLAMA_PYTHON", os.path.join(CACHE, "bin/python"))
    model = os.environ.get("PAIR_LLAMA_MODEL", os.path.join(CACHE, "model/smollm2.gguf"))
    for f in (python, model):
        if not os.path.exists(f):
            sys.exit(f"{f} is missing: run scripts/setup-python.sh")
    port = free_port()
    load = os.getloadavg()
    proc = start_server(python, model, port, a.threads)
    cold, cached, sizes = [], [], []
    try:
        # The first requests pay for warming the process and its buffers
        # at this prompt's size; not counted.
        warm = fresh_prompt(port, 10_000, a.prompt_tokens)[0]
        ttft(port, warm)
        ttft(port, warm + " " + words(random.Random(10_001), a.new_tokens))
        for k in range(a.reps):
            prompt, n = fresh_prompt(port, k, a.prompt_tokens)
            more = " " + words(random.Random(1_000 + k), a.new_tokens)
            m = token_count(port, prompt + more)
            cold.append(ttft(port, prompt))
            cached.append(ttft(port, prompt + more))
            sizes.append((n, m))
            print(f"rep {k}: {n} tokens cold {cold[-1] * 1e3:.0f} ms; "
                  f"{m} tokens ({m - n} new) cached {cached[-1] * 1e3:.0f} ms", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    tps, overhead_us = profile_constants()
    n = statistics.median(s[0] for s in sizes)
    m = statistics.median(s[1] for s in sizes)
    emu_cached, emu_cold = emulated(tps, overhead_us, n, n, m)
    # The prefix cache at token granularity (the real engine's), for scale.
    exact_cached = (overhead_us + max(1, m - n) / tps * 1e6) / 1e6
    med_cold, med_cached = statistics.median(cold), statistics.median(cached)
    ratio = med_cold / med_cached
    emu_ratio = emu_cold / emu_cached
    within = abs(emu_ratio - ratio) / ratio <= 0.25
    result = {
        "reps": a.reps, "threads": a.threads or "defaults", "prompt_tokens": n, "cached_prompt_tokens": m,
        "load_before": load, "load_after": os.getloadavg(),
        "measured": {
            "cold_s": {"min": min(cold), "median": med_cold, "all": cold},
            "cached_s": {"min": min(cached), "median": med_cached, "all": cached},
            "ratio_median": ratio, "ratio_min": min(cold) / min(cached),
            # The prefill rate the medians imply, for scale against the profile's.
            "prefill_tps": (n - (m - n)) / (med_cold - med_cached) if med_cold > med_cached else None,
        },
        "emulator": {
            "profile": "cpu-smollm2-135m", "prefill_tps": tps, "request_overhead_us": overhead_us,
            "cold_s": emu_cold, "cached_s": emu_cached, "ratio": emu_ratio,
            "cached_s_exact_prefix": exact_cached, "ratio_exact_prefix": emu_cold / exact_cached,
        },
        "emulator_within_25pct": within,
    }
    print(f"| llama-cpp-python ({a.threads or 'default'} threads), {n} tokens cold / "
          f"+{m - n} cached, {a.reps} reps | "
          f"cold min {min(cold) * 1e3:.0f} ms, median {med_cold * 1e3:.0f} ms | "
          f"cached min {min(cached) * 1e3:.0f} ms, median {med_cached * 1e3:.0f} ms | "
          f"ratio {ratio:.1f} (of minima {min(cold) / min(cached):.1f}) |")
    print(f"| emulator cpu-smollm2-135m ({tps:.0f} tok/s, {overhead_us / 1e3:.0f} ms overhead) | "
          f"cold {emu_cold * 1e3:.0f} ms | cached {emu_cached * 1e3:.0f} ms "
          f"(token-exact prefix: {exact_cached * 1e3:.0f} ms) | ratio {emu_ratio:.1f} "
          f"({'within' if within else 'NOT within'} 25 % of {ratio:.1f}) |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
