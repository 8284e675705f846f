-- wrk script for the proxy benchmarks (scripts/bench/proxy.sh): POSTs one
-- small chat completion, optionally pinned to a node, and prints one
-- machine-readable RESULT line (microseconds, requests/s, errors).
wrk.method = "POST"
local body = os.getenv("BENCH_BODY")
if body == nil or body == "" then
  body = '{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
end
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
local pin = os.getenv("BENCH_PIN")
if pin and pin ~= "" then
  wrk.headers["x-pair-node-pin"] = pin
end
local key = os.getenv("BENCH_KEY")
if key and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
end
local mode = os.getenv("BENCH_MODE")
if mode and mode ~= "" then
  wrk.headers["x-bench"] = mode
end

function done(summary, latency, requests)
  local e = summary.errors
  local errors = e.connect + e.read + e.write + e.timeout + e.status
  io.write(string.format(
    "RESULT p50_us=%d p99_us=%d rps=%.1f requests=%d errors=%d\n",
    latency:percentile(50), latency:percentile(99),
    summary.requests / (summary.duration / 1e6), summary.requests, errors))
end
