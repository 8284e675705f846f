#!/usr/bin/env python3
"""Agent fan-out with the real Claude Code: N parallel `claude -p`
sub-agents through a 3-node `pair-node demo` (emulated RTX 4090, RTX 3060
and laptop), routed by pair; then the same job pinned to each node alone
(`x-pair-node-pin`). Each sub-agent is a coding agent's loop of `--turns`
tool calls: its task names the call with a count
(`Bash({"command": ...}) x5`), so the emulated model calls Bash after
each tool result until it has called it that many times, then answers in
text; every request re-sends Claude Code's ~20k-token system prompt and
tools and the sub-agent's growing conversation, which the engines' prompt
caches serve.

Reports the makespan routed, on the fastest node alone, and the
capacity-weighted ideal (with node i finishing the whole job alone in
T_i, the cluster as one fluid machine would take 1 / sum(1 / T_i)); per
run, the prompt tokens sent and the cached prompt tokens served (from the
job records, `GET /_pair/jobs`), and the answers' lengths (the demo's
natural lengths unless --answer-tokens sets one).

Job records also give each job's span from its first request to its last
answer, the makespan scenarios/agents-claude-code-demo.toml simulates.

usage: scripts/bench/agents.py [--agents 5] [--turns 5] [--time-scale 0.25]
       [--answer-tokens 0] [--alone rtx4090,...] [--repeat 1]
       [--pair-node target/release/pair-node] [--json OUT]
Needs scripts/setup-agents.sh (PAIR_CLAUDE) and a built pair-node.
Every request stays on loopback.
"""
import statistics
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


def job_records(base, since_ms):
    """The job records of requests made since `since_ms` (unix ms), one a job."""
    with urllib.request.urlopen(f"{base}/_pair/jobs?limit=10000", timeout=10) as r:
        recent = json.load(r)
    by_id = {}
    for j in recent:
        if j.get("created_at_ms", 0) >= since_ms:
            by_id.setdefault(j["id"], j)
    return list(by_id.values())


def summary(base, names, records):
    """Where the requests ran, by node name; prompt and cached tokens;
    answer lengths."""
    cluster = json.load(urllib.request.urlopen(f"{base}/_pair/cluster", timeout=10))
    by_id = {n["id"]: n["name"] for n in cluster["snapshot"]["nodes"]}
    out = sorted(j.get("output_tokens") or 0 for j in records)
    prompt = sum(j.get("prompt_tokens") or 0 for j in records)
    cached = sum(j.get("cached_tokens") or 0 for j in records)
    # From the job's first request to its last answer, as the simulator
    # measures a job's makespan (without the agents' own start and exit).
    ends = [j["created_at_ms"] + (j.get("duration_ms") or 0) for j in records]
    starts = [j["created_at_ms"] for j in records]
    return {
        "requests": len(records),
        "span_s": (max(ends) - min(starts)) / 1e3 if records else 0.0,
        "placement": dict(collections.Counter(by_id.get(j.get("ran_on"), "none") for j in records)),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        # Records that hold a cache account at all (the engine's, or the
        # scheduler's prediction): 0 cached of none recorded says nothing.
        "cache_recorded": sum(1 for j in records if j.get("cached_tokens") is not None),
        "cached_share": cached / prompt if prompt else 0.0,
        "output_tokens": {"min": out[0], "median": statistics.median(out), "max": out[-1]}
        if out else {},
        "status": dict(collections.Counter(str(j.get("status")) for j in records)),
        "records": [{k: j.get(k) for k in ("created_at_ms", "ran_on", "prompt_tokens",
                                           "cached_tokens", "output_tokens", "ttft_ms",
                                           "duration_ms")} for j in records],
    }


def run_job(claude, base, n, turns, answer_tokens, pin=None):
    """Runs n sub-agents at once; returns (makespan, per-agent seconds,
    unix ms when it began)."""
    headers = []
    if answer_tokens:
        headers.append(f"x-emulator-answer-tokens: {answer_tokens}")
    if pin:
        headers.append(f"x-pair-node-pin: {pin}")
    headers = "\n".join(headers)
    since_ms = int(time.time() * 1000)
    procs = []
    # One job's sub-agents share a home and a working directory, as a
    # coding agent's do: Claude Code names both in its system prompt, so
    # they share the prompt's ~20k-token prefix as real sub-agents do.
    home, work = tempfile.mkdtemp(), tempfile.mkdtemp()
    dirs = [home, work]
    t0 = time.monotonic()
    for k in range(n):
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TERM": "dumb",
            "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "sk-local",
            **({"ANTHROPIC_CUSTOM_HEADERS": headers} if headers else {}),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_RETRIES": "1",
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        }
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env[var] = "http://127.0.0.1:9"
        # Each call appends a line to the sub-agent's own file: it shows
        # every turn's tool ran.
        done = f"done-{k}.txt"
        prompt = f'Sub-task {k}: Bash({{"command": "echo sub-agent-{k} >> {done}"}}) x{turns}'
        procs.append((subprocess.Popen(
            [claude, "-p", prompt, "--allowedTools", "Bash", "--output-format", "json"],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            os.path.join(work, done), time.monotonic()))
    times = []
    for p, done, started in procs:
        out, err = p.communicate(timeout=900)
        took = time.monotonic() - started
        ok = p.returncode == 0 and not json.loads(out or "{}").get("is_error", True)
        try:
            with open(done) as f:
                ran = len(f.read().splitlines())
        except OSError:
            ran = 0
        if not (ok and ran == turns):
            sys.exit(f"a sub-agent failed (rc {p.returncode}, tool ran {ran} of {turns} times):"
                     f"\n{out}\n{err}")
        times.append(took)
    makespan = time.monotonic() - t0
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return makespan, times, since_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=5)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--turns", type=int, default=5,
                    help="tool calls per sub-agent before its text answer")
    ap.add_argument("--answer-tokens", type=int, default=0,
                    help="every answer's length; 0: the demo's natural lengths")
    ap.add_argument("--model", default="llama3.2:3b")
    ap.add_argument("--pair-node", default=os.path.join(ROOT, "target/release/pair-node"))
    ap.add_argument("--alone", default="",
                    help="comma-separated node names (or profiles, e.g. rtx4090) to run the "
                         "job alone on; default every node (the ideal needs them all)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="jobs to run routed and on each node alone (medians reported)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.repeat < 1:
        sys.exit("--repeat is at least 1")
    claude = agents_env()["PAIR_CLAUDE"]
    demo, base, names = start_demo(a.pair_node, a.time_scale, a.model)
    try:
        # Warm each node's model (the demo's engines start with it loaded,
        # but a first job would also pay for the agent's own start-up).
        run_job(claude, base, 1, a.turns, a.answer_tokens)
        alone, alone_jobs = {}, {}
        wanted = [w for w in a.alone.split(",") if w]
        for name in names:
            if wanted and not any(w in name for w in wanted):
                continue
            took = []
            for _ in range(a.repeat):
                t, _, since = run_job(claude, base, a.agents, a.turns, a.answer_tokens, pin=name)
                jobs = summary(base, names, job_records(base, since))
                brief = {k: v for k, v in jobs.items() if k != "records"}
                print(f"{name:<22} alone: {t:7.1f} s, {brief}", file=sys.stderr)
                took.append(t)
                alone_jobs.setdefault(name, []).append(jobs)
            alone[name] = statistics.median(took)
        runs = []
        for _ in range(a.repeat):
            routed, times, since = run_job(claude, base, a.agents, a.turns, a.answer_tokens)
            jobs = summary(base, names, job_records(base, since))
            brief = {k: v for k, v in jobs.items() if k != "records"}
            print(f"routed: {routed:.1f} s, {brief}", file=sys.stderr)
            runs.append({"routed_s": routed, "agent_s": times, "jobs": jobs})
        routed = statistics.median(r["routed_s"] for r in runs)
        span = statistics.median(r["jobs"]["span_s"] for r in runs)
    finally:
        demo.terminate()
        demo.wait(timeout=30)
    fastest = min(alone.values()) if alone else None
    # The capacity-weighted ideal needs every node's time alone.
    ideal = 1.0 / sum(1.0 / t for t in alone.values()) if len(alone) == len(names) else None
    result = {
        "agents": a.agents, "turns": a.turns, "time_scale": a.time_scale,
        "answer_tokens": a.answer_tokens, "model": a.model, "alone_s": alone,
        "routed_s": routed, "routed_span_s": span, "fastest_alone_s": fastest,
        "alone_span_s": {name: statistics.median(j["span_s"] for j in runs_alone)
                         for name, runs_alone in alone_jobs.items()},
        "ideal_s": ideal,
        "routed_over_ideal": routed / ideal if ideal else None,
        "fastest_over_routed": fastest / routed if fastest else None,
        "routed_runs": runs, "alone_jobs": alone_jobs,
    }
    spread = " ".join(f"{r['routed_s']:.1f}" for r in runs)
    ideal_cell = (f"capacity-weighted ideal {ideal:.1f} s (routed {routed / ideal:.2f}x ideal)"
                  if ideal else "ideal not measured (--alone)")
    alone_cell = (f"fastest node alone {fastest:.1f} s ({fastest / routed:.2f}x routed)"
                  if fastest else "no node alone (--alone)")
    print(f"| {a.agents} sub-agents x {a.turns} turns | routed {routed:.1f} s (runs: {spread}) "
          f"| {alone_cell} | {ideal_cell} | requests span {span:.1f} s (median) "
          f"| last routed job: {jobs['requests']} requests, "
          f"{jobs['cached_tokens']} of {jobs['prompt_tokens']} "
          f"prompt tokens cached ({100 * jobs['cached_share']:.0f} %; a cache account on "
          f"{jobs['cache_recorded']} records) "
          f"| ran on {jobs['placement']} | answers {jobs['output_tokens']} tokens |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
