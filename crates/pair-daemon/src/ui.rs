//! The Jobs view: one self-contained page on the loopback face (`/ui`) that
//! polls the control API. Nodes with their models, load and pressure; recent
//! jobs with where they were sent and where they ran.

pub const PAGE: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>pair · cluster</title>
<style>
  :root { font-family: system-ui, sans-serif; color: #1d2330; background: #f5f6f8; }
  body { margin: 0 auto; max-width: 1100px; padding: 24px; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  .sub { color: #667; margin-bottom: 20px; font-size: 13px; }
  h2 { font-size: 15px; margin: 24px 0 8px; }
  .nodes { display: grid; grid-template-columns: repeat(auto-fill, minmax(250px, 1fr)); gap: 12px; }
  .node { background: #fff; border-radius: 8px; padding: 12px 14px; box-shadow: 0 1px 2px #0002; }
  .node.self { outline: 2px solid #3b82f6; }
  .node h3 { margin: 0 0 6px; font-size: 14px; }
  .kv { font-size: 12px; color: #445; line-height: 1.6; }
  .badge { display: inline-block; border-radius: 4px; padding: 0 6px; font-size: 11px; margin: 1px 2px 1px 0; background: #e8ecf3; }
  .badge.warm { background: #d9f5e1; }
  .p0 { color: #198754 } .p1 { color: #8a6d00 } .p2 { color: #c2410c } .p3 { color: #b91c1c }
  table { width: 100%; border-collapse: collapse; background: #fff; border-radius: 8px; overflow: hidden; font-size: 12px; }
  th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid #eef0f4; }
  th { background: #eef1f6; font-weight: 600; }
  .completed { color: #198754 } .failed { color: #b91c1c } .running { color: #2563eb } .cancelled { color: #777 }
</style>
</head>
<body>
<h1>pair cluster</h1>
<div class="sub" id="sub">loading…</div>
<h2>Nodes</h2>
<div class="nodes" id="nodes"></div>
<h2>Recent jobs</h2>
<table><thead><tr><th>time</th><th>model</th><th>route</th><th>sent to</th><th>ran on</th><th>key</th><th>tries</th><th>status</th><th>TTFT</th><th>total</th><th>tokens</th></tr></thead>
<tbody id="jobs"></tbody></table>
<script>
const esc = s => String(s ?? "").replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;"}[c]));
let names = {};
const WAITS = {"silent-only-owner": "waited on a silent engine with no alternative", "cluster-queue": "waited at the cluster for a free slot"};
async function refresh() {
  try {
    const [c, j] = await Promise.all([fetch("/_pair/cluster").then(r => r.json()), fetch("/_pair/jobs?limit=50").then(r => r.json())]);
    const nodes = c.snapshot.nodes || [];
    nodes.forEach(n => names[n.id] = n.name);
    document.getElementById("sub").textContent = `${nodes.length} node(s) · policy ${c.policy} · snapshot #${c.snapshot.generation}`;
    document.getElementById("nodes").innerHTML = nodes.map(n => {
      const models = n.engines.flatMap(e => e.models.map(m => `<span class="badge ${m.loaded ? "warm" : ""}" title="${m.loaded ? "loaded" : "not loaded"}">${esc(m.name)}</span>`)).join("");
      const gpus = n.gpus.length ? n.gpus.map(g => `${esc(g.name)} ${g.utilisation_pct}% · ${(g.vram_used_bytes/2**30).toFixed(1)}/${(g.vram_total_bytes/2**30).toFixed(1)} GiB`).join("<br>") : "no GPU";
      return `<div class="node ${n.id === c.self ? "self" : ""}"><h3>${esc(n.name)}</h3><div class="kv">
        ${esc(n.id.slice(0, 8))} · ${esc(n.liveness)} · rtt ${(n.rtt_us/1000).toFixed(1)} ms<br>
        pending ${n.workload.running + n.workload.queued} (running ${n.workload.running}, queued ${n.workload.queued})<br>
        pressure <b class="p${n.pressure}">${n.pressure}</b><br>${gpus}<br>${models || "<i>no models</i>"}</div></div>`;
    }).join("");
    document.getElementById("jobs").innerHTML = j.map(r => `<tr>
      <td>${new Date(r.created_at_ms).toLocaleTimeString()}</td><td>${esc(r.model)}</td><td>${esc(r.route)}</td>
      <td>${esc(names[r.origin] || r.origin.slice(0, 8))}</td><td>${esc(r.ran_on ? (names[r.ran_on] || r.ran_on.slice(0, 8)) : "—")}</td>
      <td>${r.key ? esc(r.key) : "—"}</td><td>${r.attempts}</td><td class="${r.status}">${r.status}${r.error ? " · " + esc(r.error) : ""}${r.waited ? " · " + esc(WAITS[r.waited.why] || r.waited.why) + " (" + (r.waited.ms/1000).toFixed(1) + " s)" : ""}</td>
      <td>${r.ttft_ms ?? "—"} ms</td><td>${r.duration_ms ?? "—"} ms</td><td>${r.output_tokens ?? "—"}</td></tr>`).join("");
  } catch (e) {
    document.getElementById("sub").textContent = "cannot reach the node: " + e;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
"##;

#[cfg(test)]
mod tests {
    use pair_core::WaitReason;

    /// The Jobs view says why a job waited as `pair-node jobs` does, for
    /// every reason.
    #[test]
    fn the_page_names_every_wait_reason() {
        for why in WaitReason::ALL {
            let label = serde_json::to_value(why).unwrap();
            let entry = format!("{label}: \"{}\"", why.describe());
            assert!(super::PAGE.contains(&entry), "{entry}");
        }
    }
}
