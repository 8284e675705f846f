#!/usr/bin/env python3
"""Agent fan-out with the real Claude Code: N parallel `claude -p`
sub-agents (each a turn with a tool call, as a sub-agent of a coding job
does) through a 3-node `pair-node demo` (emulated RTX 4090, RTX 3060 and
laptop), routed by pair; then the same job pinned to each node alone
(`x-pair-node-pin`). Reports the makespan routed, on the fastest node
alone, and the capacity-weighted ideal: with node i finishing the whole
job alone in T_i, the cluster working as one fluid machine would take
1 / sum(1 / T_i).

usage: scripts/bench/agents.py [--agents 5] [--time-scale 0.25] [--answer-tokens 200]
       [--pair-node target/release/pair-node] [--json OUT]
Needs scripts/setup-agents.sh (PAIR_CLAUDE) and a built pair-node.
Every request stays on loopback.
"""
import argparse
import collections
import json
import urllib.request
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agents_env():
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts/setup-agents.sh")],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def start_demo(pair_node, time_scale, model):
    ollama, openai = free_port(), free_port()
    proc = subprocess.Popen(
        [pair_node, "demo", "--nodes", "3", "--ollama-face", f"127.0.0.1:{ollama}",
         "--openai-face", f"127.0.0.1:{openai}", "--alias", f"claude-*={model}",
         "--time-scale", str(time_scale)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    names = []
    deadline = time.time() + 60
    for line in proc.stdout:
        words = line.split()
        if line.startswith("  node-") and words:
            names.append(words[0])
        if line.startswith("OpenAI face"):
            break
        if time.time() > deadline:
            break
    if len(names) != 3:
        proc.kill()
        sys.exit(f"the demo did not start (nodes seen: {names})")
    return proc, f"http://127.0.0.1:{openai}", names


def placement(base, names, jobs):
    """Where the last `jobs` requests ran, by node name."""
    with urllib.request.urlopen(f"{base}/_pair/jobs?limit={jobs}", timeout=10) as r:
        recent = json.load(r)
    cluster = json.load(urllib.request.urlopen(f"{base}/_pair/cluster", timeout=10))
    by_id = {n["id"]: n["name"] for n in cluster["snapshot"]["nodes"]}
    return dict(collections.Counter(by_id.get(j.get("ran_on"), "none") for j in recent))


def run_job(claude, base, n, answer_tokens, pin=None):
    """Runs n sub-agents at once; returns (makespan, per-agent seconds)."""
    headers = f"x-emulator-answer-tokens: {answer_tokens}"
    if pin:
        headers += f"\nx-pair-node-pin: {pin}"
    procs = []
    dirs = []
    t0 = time.monotonic()
    for k in range(n):
        home, work = tempfile.mkdtemp(), tempfile.mkdtemp()
        dirs += [home, work]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TERM": "dumb",
            "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "sk-local",
            "ANTHROPIC_CUSTOM_HEADERS": headers,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": "1",
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        }
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env[var] = "http://127.0.0.1:9"
        prompt = f'Sub-task {k}: Bash({{"command": "echo sub-agent-{k} > done.txt"}})'
        procs.append((subprocess.Popen(
            [claude, "-p", prompt, "--allowedTools", "Bash", "--output-format", "json"],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            work, time.monotonic()))
    times = []
    for p, work, started in procs:
        out, err = p.communicate(timeout=900)
        took = time.monotonic() - started
        ok = p.returncode == 0 and not json.loads(out or "{}").get("is_error", True)
        done = os.path.exists(os.path.join(work, "done.txt"))
        if not (ok and done):
            sys.exit(f"a sub-agent failed (rc {p.returncode}, tool ran: {done}):\n{out}\n{err}")
        times.append(took)
    makespan = time.monotonic() - t0
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return makespan, times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=5)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--answer-tokens", type=int, default=200)
    ap.add_argument("--model", default="llama3.2:3b")
    ap.add_argument("--pair-node", default=os.path.join(ROOT, "target/release/pair-node"))
    ap.add_argument("--json")
    a = ap.parse_args()
    claude = agents_env()["PAIR_CLAUDE"]
    demo, base, names = start_demo(a.pair_node, a.time_scale, a.model)
    try:
        # Warm each node's model (the demo's engines start with it loaded,
        # but a first job would also pay for the agent's own start-up).
        run_job(claude, base, 1, a.answer_tokens)
        alone = {}
        for name in names:
            alone[name], _ = run_job(claude, base, a.agents, a.answer_tokens, pin=name)
            print(f"{name:<22} alone: {alone[name]:7.1f} s", file=sys.stderr)
        routed, times = run_job(claude, base, a.agents, a.answer_tokens)
        placed = placement(base, names, 2 * a.agents)
        print(f"routed: {routed:.1f} s, requests ran on {placed}", file=sys.stderr)
    finally:
        demo.terminate()
        demo.wait(timeout=30)
    fastest = min(alone.values())
    ideal = 1.0 / sum(1.0 / t for t in alone.values())
    result = {
        "agents": a.agents, "time_scale": a.time_scale, "answer_tokens": a.answer_tokens,
        "model": a.model, "alone_s": alone, "routed_s": routed, "fastest_alone_s": fastest,
        "ideal_s": ideal, "routed_over_ideal": routed / ideal,
        "fastest_over_routed": fastest / routed, "agent_s": times, "placement": placed,
    }
    print(f"| {a.agents} sub-agents | routed {routed:.1f} s | fastest node alone {fastest:.1f} s "
          f"({fastest / routed:.2f}x routed) | capacity-weighted ideal {ideal:.1f} s "
          f"(routed {routed / ideal:.2f}x ideal) |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
