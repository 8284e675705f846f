//! The local cluster tests start (`pair_daemon::demo`'s, re-exported here)
//! and what tests do with it: a converged cluster in one call, a plain
//! HTTP client, small assertions on route receipts, the Python SDK checks
//! of a node's translated faces, and a real llama.cpp server.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
pub use pair_daemon::config::Mdns;
pub use pair_daemon::daemon::Node;
pub use pair_daemon::demo::{ClusterSpec, DEMO_PROFILES, LocalCluster, NodeSpec};

use crate::process::KillOnDrop;

/// A cluster of `n` nodes that all hold `llama3.2:3b`, emulated 20x faster
/// than real time, converged and ready.
pub async fn cluster(n: usize, tweak: impl FnOnce(&mut ClusterSpec)) -> Result<LocalCluster> {
    pair_identity::install_crypto_provider();
    let mut spec = ClusterSpec::new(n);
    spec.time_scale = 0.05;
    tweak(&mut spec);
    let c = LocalCluster::start(spec).await?;
    c.wait_converged(Duration::from_secs(20)).await?;
    Ok(c)
}

/// Waits until node 0's view of the cluster shows `model` loaded on each
/// of `nodes` (peers' reports arrive every gossip interval, engines are
/// polled every second).
pub async fn wait_loaded(c: &LocalCluster, model: &str, nodes: &[pair_core::NodeId]) {
    wait_loaded_at(c, 0, model, nodes).await;
}

/// Waits until node `viewer`'s view of the cluster shows `model` loaded on
/// each of `nodes`.
pub async fn wait_loaded_at(
    c: &LocalCluster,
    viewer: usize,
    model: &str,
    nodes: &[pair_core::NodeId],
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = c.nodes[viewer].state.cluster();
        let loaded = nodes.iter().all(|id| {
            s.node(*id).is_some_and(|n| {
                n.engines.iter().any(|e| {
                    e.models
                        .iter()
                        .any(|m| m.name.as_str() == model && m.loaded)
                })
            })
        });
        if loaded {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {viewer} never saw {model} loaded on {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Loads `model` on every node (a request pinned to each, through node 0's
/// Ollama face) and waits until every node sees it loaded everywhere (a
/// request sent to any node then finds the whole cluster warm).
pub async fn warm(c: &LocalCluster, model: &str) {
    for node in &c.nodes {
        let r = http()
            .post(format!("{}/api/generate", c.nodes[0].ollama_url()))
            .header("x-pair-node-pin", node.id.to_string())
            .json(&serde_json::json!({"model": model, "prompt": "warm", "stream": false}))
            .send()
            .await
            .unwrap_or_else(|e| panic!("warming {model} on {}: {e}", node.name));
        assert_eq!(r.status(), 200, "warming {model} on {}", node.name);
    }
    let ids: Vec<pair_core::NodeId> = c.nodes.iter().map(|n| n.id).collect();
    for viewer in 0..c.nodes.len() {
        wait_loaded_at(c, viewer, model, &ids).await;
    }
}

/// Waits until every node of `c` lets the client `id` in (the node it
/// paired with at once, the others through vouching).
pub async fn wait_trusted(c: &LocalCluster, id: pair_core::NodeId) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.nodes.iter().all(|n| n.trust.get(id).is_some()) {
        assert!(
            Instant::now() < deadline,
            "the cluster did not learn the client"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A plain HTTP client for the faces (no proxy, no TLS).
pub fn http() -> reqwest::Client {
    pair_identity::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// The node UUID in an `x-pair-node: name (uuid)` receipt.
pub fn served_by(resp: &reqwest::Response) -> Option<String> {
    let v = resp.headers().get("x-pair-node")?.to_str().ok()?;
    let start = v.rfind('(')? + 1;
    Some(v[start..v.len().checked_sub(1)?].to_owned())
}

/// `x-pair-job`: the job's id.
pub fn job_of(resp: &reqwest::Response) -> String {
    resp.headers()["x-pair-job"]
        .to_str()
        .unwrap_or_default()
        .to_owned()
}

/// Node `node`'s terminal record of `job`, once it has one (within 10 s;
/// a panic after).
pub async fn record(c: &LocalCluster, node: usize, job: &str) -> pair_core::JobRecord {
    let id: pair_core::JobId = serde_json::from_value(serde_json::json!(job))
        .unwrap_or_else(|e| panic!("job id {job:?}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = c.nodes[node].state.jobs.get(id)
            && r.status.is_terminal()
        {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "no record of {job} on node {node}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `x-pair-attempts` as a number.
pub fn attempts(resp: &reqwest::Response) -> Option<u32> {
    resp.headers()
        .get("x-pair-attempts")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Runs `tests/sdk/translated.py` (the real `ollama` and `anthropic` SDKs;
/// see the script for `mode`) against node `i`'s faces: its last line
/// ("N checks"), or what it said when a check failed.
pub fn sdks(
    c: &LocalCluster,
    i: usize,
    model: &str,
    embed: &str,
    mode: &str,
) -> std::result::Result<String, String> {
    let py = crate::env::sdk_python()?;
    let node = c.nodes.get(i).ok_or("no such node")?;
    let script = crate::env::repo_root().join("tests/sdk/translated.py");
    let out = std::process::Command::new(py)
        .arg(script)
        .args([&node.ollama_url(), &node.openai_url(), model, embed, mode])
        .output()
        .map_err(|e| format!("cannot run python: {e}"))?;
    let said = String::from_utf8_lossy(&out.stdout);
    let last = said
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    if out.status.success() && last.ends_with("checks") {
        Ok(last)
    } else {
        Err(format!(
            "SDK checks failed:\n{said}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A real llama-cpp-python server (SmolLM2-135M, served as `smollm2`,
/// embeddings on) on a free loopback port, up and answering, with a
/// context of `n_ctx` tokens: the process (killed on drop) and its URL.
pub async fn llama_server(n_ctx: u32) -> Result<(KillOnDrop, String)> {
    let (llama_py, model) = crate::env::llama_paths().map_err(anyhow::Error::msg)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let server = KillOnDrop(
        Command::new(llama_py)
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(&model)
            .args(["--model_alias", "smollm2", "--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            // Without this a second request silently truncates the first stream.
            .args(["--interrupt_requests", "False"])
            // Embeddings too (Ollama's /api/embed is translated to them).
            .args(["--embedding", "True"])
            .args(["--n_ctx", &n_ctx.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    loop {
        if let Ok(r) = http().get(format!("{base}/v1/models")).send().await
            && r.status().is_success()
        {
            return Ok((server, base));
        }
        if started.elapsed() > Duration::from_secs(90) {
            bail!("llama.cpp server did not start");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
