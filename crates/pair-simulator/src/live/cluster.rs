//! The live cluster of a scenario: one emulated Ollama engine per node (its
//! hardware profile, models, slots and preloads, at the time scale) and one
//! `pair-node run` process in front of each, paired through the real CLI
//! (`pair-node pair invite` / `join`: PINs, the PAKE, mutual TLS), with
//! static peers on loopback and mDNS off.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pair_emulator::{EmulatedEngine, EmulatorConfig, Flavor, HardwareProfile, ModelSpec};
use pair_scheduler::Policy;
use serde_json::Value;

use crate::SimError;
use crate::scenario::{Scenario, SeedPerf};

/// How long a node may take to start, pair and see the whole cluster.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// One `pair-node run` process; killed and reaped when dropped.
pub(super) struct NodeProcess {
    pub(super) name: String,
    pub(super) ollama: SocketAddr,
    pub(super) cluster: SocketAddr,
    dir: tempfile::TempDir,
    child: Child,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl NodeProcess {
    pub(super) fn face(&self) -> String {
        format!("http://{}", self.ollama)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default()
    }

    fn state_dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A scenario's nodes and engines, running.
pub(super) struct LiveCluster {
    pub(super) nodes: Vec<NodeProcess>,
    engines: Vec<EmulatedEngine>,
}

/// A free loopback port for a node to take, not one handed out before:
/// below Linux's ephemeral range (32768 up), so the many client
/// connections of a run never take it between its check and the node's
/// bind, as a port from `bind(0)` can be.
fn free_port(taken: &mut Vec<u16>) -> Result<SocketAddr, SimError> {
    let seed = u64::from(std::process::id()) ^ (taken.len() as u64).wrapping_mul(0x9E37_79B9);
    for i in 0..4_000u64 {
        let port = 20_000 + ((seed.wrapping_add(i.wrapping_mul(7_919))) % 12_000) as u16;
        if taken.contains(&port) {
            continue;
        }
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            taken.push(port);
            return l.local_addr().map_err(|e| SimError::live("port", e));
        }
    }
    Err(SimError::live_msg(
        "no free loopback port between 20000 and 32000".into(),
    ))
}

/// One state directory per scenario node, each holding a fresh node
/// identity, handed out so that the live nodes' ids sort in the same order
/// as the simulator's ids of the same nodes: every tie a policy breaks by
/// node id then falls the same way live as simulated.
fn state_dirs_in_sim_id_order(scn: &Scenario) -> Result<Vec<tempfile::TempDir>, SimError> {
    let mut made = Vec::with_capacity(scn.nodes.len());
    for _ in &scn.nodes {
        let dir = tempfile::Builder::new()
            .prefix("pair-live-")
            .tempdir()
            .map_err(|e| SimError::live("state dir", e))?;
        let id = pair_identity::Identity::load_or_create(dir.path(), pair_core::Role::Node)
            .map_err(|e| SimError::live("node identity", e))?
            .id();
        made.push((id, dir));
    }
    made.sort_by_key(|(id, _)| *id);
    let mut by_sim_id: Vec<usize> = (0..scn.nodes.len()).collect();
    by_sim_id.sort_by_key(|&i| crate::sim::node_id(&scn.nodes[i].name));
    // The i-th smallest live id goes to the node with the i-th smallest
    // simulator id; then back into scenario order.
    let mut assigned: Vec<(usize, tempfile::TempDir)> = by_sim_id
        .into_iter()
        .zip(made.into_iter().map(|(_, dir)| dir))
        .collect();
    assigned.sort_by_key(|(node, _)| *node);
    Ok(assigned.into_iter().map(|(_, dir)| dir).collect())
}

impl LiveCluster {
    /// Starts every engine and node for `policy` and waits until each node
    /// routes to all of them.
    pub(super) async fn start(
        scn: &Scenario,
        policy: Policy,
        pair_node: &Path,
        time_scale: f64,
        threads: u16,
    ) -> Result<LiveCluster, SimError> {
        let mut engines = Vec::with_capacity(scn.nodes.len());
        for (i, n) in scn.nodes.iter().enumerate() {
            let profile = HardwareProfile::by_name(&n.profile)
                .map_err(|e| SimError::live(&format!("node {}", n.name), e))?;
            let models: Vec<ModelSpec> = n
                .models
                .iter()
                .map(|&m| ModelSpec::new(scn.models[m].name.as_str(), scn.models[m].size_bytes))
                .collect();
            let mut cfg = EmulatorConfig::new(Flavor::Ollama, models)
                .with_profile(profile)
                .with_time_scale(time_scale)
                .with_seed(i as u64)
                // The simulator's engines: a llama.cpp slot cache of its
                // context, so live caches hit where simulated ones do.
                .with_cache(crate::sim::ENGINE_CACHE);
            cfg.slots = n.slots.map(u32::from);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| SimError::live("engine listener", e))?;
            let engine = EmulatedEngine::spawn(cfg, listener)
                .map_err(|e| SimError::live(&format!("engine of {}", n.name), e))?;
            for &m in &n.preloaded {
                preload(&engine.base_url(), scn.models[m].name.as_str()).await?;
            }
            engines.push(engine);
        }
        let mut taken = Vec::new();
        let ports: Vec<[SocketAddr; 3]> = (0..scn.nodes.len())
            .map(|_| {
                Ok([
                    free_port(&mut taken)?,
                    free_port(&mut taken)?,
                    free_port(&mut taken)?,
                ])
            })
            .collect::<Result<_, SimError>>()?;
        // Reports and telemetry samples as often as the simulator's nodes
        // take them, on the engines' clock.
        let scaled = |us: u64| format!("{}us", ((us as f64 * time_scale) as u64).max(1_000));
        let report_interval = scaled(scn.info.report_interval);
        let telemetry_interval = scaled(scn.info.telemetry_interval);
        let dirs = state_dirs_in_sim_id_order(scn)?;
        let mut nodes = Vec::with_capacity(scn.nodes.len());
        for ((i, n), dir) in scn.nodes.iter().enumerate().zip(dirs) {
            let log = std::fs::File::create(dir.path().join("node.log"))
                .map_err(|e| SimError::live("node log", e))?;
            let [ollama, openai, cluster] = ports[i];
            let mut cmd = Command::new(pair_node);
            cmd.args(["run", "--name", &n.name, "--mdns", "off"])
                .args(["--ollama-face", &ollama.to_string()])
                .args(["--openai-face", &openai.to_string()])
                .args(["--cluster", &cluster.to_string()])
                .args(["--engine", &format!("ollama={}", engines[i].base_url())])
                .args(["--policy", policy.as_str()])
                .args(["--emulated-hardware", &n.profile])
                .args(["--report-interval", &report_interval])
                .args(["--telemetry-interval", &telemetry_interval])
                .args(["--queue", crate::scenario::queue_name(scn.queue)])
                .arg("--state-dir")
                .arg(dir.path());
            if n.seed_perf == SeedPerf::Profile {
                cmd.args(["--emulated-speed-scale", &time_scale.to_string()]);
            }
            for (j, p) in ports.iter().enumerate() {
                if j != i {
                    cmd.args(["--peer", &p[2].to_string()]);
                }
            }
            let child = cmd
                .env("PAIR_LOG", "warn")
                .env("PAIR_THREADS", threads.to_string())
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| SimError::live(&format!("starting {}", pair_node.display()), e))?;
            nodes.push(NodeProcess {
                name: n.name.clone(),
                ollama,
                cluster,
                dir,
                child,
            });
        }
        let cluster = LiveCluster { nodes, engines };
        let http = client()?;
        for n in &cluster.nodes {
            wait_routable(&http, n, 1).await?;
        }
        cluster.pair_all(pair_node).await?;
        let all = cluster.nodes.len();
        for n in &cluster.nodes {
            wait_routable(&http, n, all).await?;
        }
        Ok(cluster)
    }

    /// Pairs every two nodes as a user would: `pair-node pair invite` on
    /// one, `pair-node pair join` with its PIN on the other.
    async fn pair_all(&self, pair_node: &Path) -> Result<(), SimError> {
        for a in 0..self.nodes.len() {
            for b in (a + 1)..self.nodes.len() {
                let (inviter, joiner) = (&self.nodes[a], &self.nodes[b]);
                let invite = cli(pair_node, inviter, &["pair", "invite"]).await?;
                let pin = invite["pin"]
                    .as_str()
                    .ok_or_else(|| SimError::live_msg(format!("invite without a PIN: {invite}")))?
                    .to_owned();
                let addr = inviter.cluster.to_string();
                cli(pair_node, joiner, &["pair", "join", &addr, "--pin", &pin]).await?;
            }
        }
        Ok(())
    }

    /// Each engine's busy time so far (modelled µs), in node order.
    pub(super) fn busy_us(&self) -> Vec<u64> {
        self.engines.iter().map(EmulatedEngine::busy_us).collect()
    }

    /// Stops the nodes, then the engines.
    pub(super) async fn stop(self) {
        drop(self.nodes);
        for e in self.engines {
            e.shutdown().await;
        }
    }
}

/// Ollama's load-only request: a generate naming the model and no prompt.
async fn preload(base: &str, model: &str) -> Result<(), SimError> {
    let r = client()?
        .post(format!("{base}/api/generate"))
        .json(&serde_json::json!({ "model": model }))
        .send()
        .await
        .map_err(|e| SimError::live("preloading a model", e))?;
    if r.status().is_success() {
        Ok(())
    } else {
        Err(SimError::live_msg(format!(
            "preloading {model}: HTTP {}",
            r.status()
        )))
    }
}

/// The HTTP client of the live twin: loopback only, no proxy. (reqwest's
/// TLS needs a crypto provider even for plain HTTP: ring, as in the rest
/// of pair.)
pub(super) fn client() -> Result<reqwest::Client, SimError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(256)
        .build()
        .map_err(|e| SimError::live("HTTP client", e))
}

/// Waits until `node` answers its status and routes to `want` nodes.
async fn wait_routable(
    http: &reqwest::Client,
    node: &NodeProcess,
    want: usize,
) -> Result<(), SimError> {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let status = async {
            http.get(format!("{}/_pair/status", node.face()))
                .send()
                .await
                .ok()?
                .json::<Value>()
                .await
                .ok()
        }
        .await;
        let routable = status
            .as_ref()
            .and_then(|s| s["routable_nodes"].as_u64())
            .unwrap_or(0);
        if routable >= want as u64 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(SimError::live_msg(format!(
                "{} routes to {routable} of {want} node(s) after {READY_WITHIN:?}; its log:\n{}",
                node.name,
                node.log()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `pair-node ARGS --json` against `node` (its face and state dir,
/// where the owner's token is) and parses what it prints.
async fn cli(pair_node: &Path, node: &NodeProcess, args: &[&str]) -> Result<Value, SimError> {
    let mut cmd = Command::new(pair_node);
    cmd.args(args)
        .args(["--control", &node.face(), "--json", "--state-dir"])
        .arg(node.state_dir());
    let what = format!("pair-node {}", args.join(" "));
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .map_err(|e| SimError::live(&what, e))?
        .map_err(|e| SimError::live(&what, e))?;
    if !out.status.success() {
        return Err(SimError::live_msg(format!(
            "{what} on {}: {}",
            node.name,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| SimError::live(&what, e))
}

/// `pair-node` beside this executable, else the one on `PATH`.
pub fn default_pair_node() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let sibling = exe.parent()?.join("pair-node");
            sibling.is_file().then_some(sibling)
        })
        .unwrap_or_else(|| PathBuf::from("pair-node"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_node_ids_sort_as_the_simulators() {
        let mut toml = String::from(
            "name = \"s\"\nduration_s = 10\nslo = { ttft_p95_ms = 1000 }\n\
             [[models]]\nname = \"m\"\nsize_gb = 1\n",
        );
        for name in ["fast-4090", "slow-3060", "laptop", "mbp", "desk-2"] {
            toml.push_str(&format!(
                "[[nodes]]\nname = \"{name}\"\nprofile = \"rtx4090\"\nmodels = [\"m\"]\n"
            ));
        }
        toml.push_str(
            "[[workload]]\nname = \"c\"\nkind = \"closed-loop\"\nusers = 1\n\
             think_ms = { dist = \"fixed\", value = 100 }\n\
             prompt_tokens = { dist = \"fixed\", value = 10 }\n\
             output_tokens = { dist = \"fixed\", value = 10 }\n",
        );
        let scn = Scenario::parse(&toml).unwrap();
        let dirs = state_dirs_in_sim_id_order(&scn).unwrap();
        assert_eq!(dirs.len(), 5);
        // The identity each node will load from its dir.
        let live: Vec<_> = dirs
            .iter()
            .map(|d| {
                pair_identity::Identity::load_or_create(d.path(), pair_core::Role::Node)
                    .unwrap()
                    .id()
            })
            .collect();
        let sim: Vec<_> = scn
            .nodes
            .iter()
            .map(|n| crate::sim::node_id(&n.name))
            .collect();
        for i in 0..5 {
            for j in 0..5 {
                assert_eq!(live[i] < live[j], sim[i] < sim[j], "nodes {i} and {j}");
            }
        }
    }
}
