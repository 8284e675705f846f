//! The demo's cluster, in-process on loopback: N real nodes (real
//! identities, real PIN pairing through the PAKE, real mTLS, mDNS on
//! loopback), each with an emulated engine of its own hardware profile.
//! `pair-node demo` runs one (feature `demo`, on by default: the only part
//! of the daemon that links the emulator); tests reach it through
//! `pair_testkit::cluster`, which adds what only tests need:
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use pair_daemon::demo::{LocalCluster, ClusterSpec};
//! let cluster = LocalCluster::start(ClusterSpec::new(3)).await?;
//! cluster.wait_converged(std::time::Duration::from_secs(10)).await?;
//! let url = cluster.nodes[0].ollama_url();
//! cluster.stop().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use pair_cluster::GossipConfig;
use pair_emulator::{EmulatedEngine, EmulatorConfig as EmuConfig, Flavor, HardwareProfile};
use pair_scheduler::Policy;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Mdns, NodeConfig, parse_engine};
use crate::daemon::{self, Listeners, Node, NodeExtras};

/// One node of a local cluster.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub profile: String,
    pub flavor: Flavor,
    pub models: Vec<String>,
    /// Requests the emulated engine runs at once (`None`: the profile's).
    pub slots: Option<u32>,
    /// A real engine (`KIND=URL`) instead of an emulated one. Nodes with
    /// one must come after every emulated node, so `engines[i]` stays node
    /// `i`'s emulated engine.
    pub external: Option<String>,
    /// Model aliases configured on this node (`--alias`).
    pub aliases: Vec<pair_core::ModelAlias>,
    /// This node's LAN face (`--lan-face`).
    pub lan: Option<crate::config::LanFace>,
}

/// The whole cluster.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub nodes: Vec<NodeSpec>,
    pub policy: Policy,
    /// Faces of the first node (the demo uses 11434 / 1234); others get
    /// ephemeral ports.
    pub first_faces: Option<(SocketAddr, SocketAddr)>,
    /// Emulated engine speed: 1.0 is real time.
    pub time_scale: f64,
    pub mdns: Mdns,
    /// A private mDNS port keeps parallel clusters apart.
    pub mdns_port: u16,
    pub pair: bool,
    pub gossip: GossipConfig,
    pub first_byte_timeout: Duration,
    /// Event loops per node (`pair-node --threads`).
    pub event_loops: usize,
    /// Nodes advertise their profile's speed until jobs teach them theirs
    /// (the demo); off, they start knowing nothing, as a real node does.
    pub seed_perf: bool,
    /// Every emulated engine's seed (the same model weights everywhere:
    /// a greedy answer is the same on every node); `None`: each its own.
    pub engine_seed: Option<u64>,
    /// How a stream cut after its first byte is continued (`--resume`).
    pub resume: pair_proxy::resume::ResumePolicy,
    /// Late binding (`--queue`); `None`: off.
    pub queue: Option<pair_scheduler::Order>,
    /// With `queue`: interactive work cuts batch work for its slot
    /// (`--queue preempt`).
    pub preempt: bool,
    /// How long emulated answers run: to the request's limit (tests that
    /// count tokens), or to a natural length as a real model's do (the
    /// demo: an agent's greeting ends in seconds, not at its 32k limit).
    pub answer_length: pair_emulator::AnswerLength,
    /// The emulated engines' prompt cache; `None`: what their kind keeps
    /// by default (Ollama's 4,096 tokens a slot).
    pub cache: Option<pair_emulator::CacheKind>,
}

/// How the demo's emulated answers end: at a natural length, as a real
/// model's do ([`pair_emulator::AnswerLength::NATURAL`]).
pub const NATURAL_ANSWERS: pair_emulator::AnswerLength = pair_emulator::AnswerLength::NATURAL;

/// The demo's engines' prompt cache: 32k tokens a slot, the context a
/// user gives an engine that serves coding agents (their ~20k-token
/// prompts do not fit Ollama's default 4,096).
pub const AGENT_CONTEXT: pair_emulator::CacheKind = pair_emulator::CacheKind::slots(32_768);

/// Hardware profiles the demo cycles through, fastest first.
pub const DEMO_PROFILES: [&str; 4] = ["rtx4090", "rtx3060", "laptop", "cpu"];

impl ClusterSpec {
    /// `n` Ollama-flavoured nodes with different hardware. Every node holds
    /// `llama3.2:3b` and `nomic-embed-text`; the two fastest also hold
    /// `qwen2.5:7b`, so routing by model is visible.
    pub fn new(n: usize) -> Self {
        let nodes = (0..n)
            .map(|i| {
                let profile = DEMO_PROFILES[i % DEMO_PROFILES.len()];
                let mut models = vec!["llama3.2:3b".to_owned(), "nomic-embed-text".to_owned()];
                if i < 2 {
                    models.push("qwen2.5:7b".to_owned());
                }
                NodeSpec {
                    name: format!("node-{}-{profile}", i + 1),
                    profile: profile.to_owned(),
                    flavor: Flavor::Ollama,
                    models,
                    slots: None,
                    external: None,
                    aliases: Vec::new(),
                    lan: None,
                }
            })
            .collect();
        Self {
            nodes,
            policy: Policy::default(),
            first_faces: None,
            time_scale: 1.0,
            mdns: Mdns::Loopback,
            mdns_port: 20_000 + (std::process::id() % 20_000) as u16,
            pair: true,
            gossip: GossipConfig {
                interval: Duration::from_millis(200),
                suspect_after: Duration::from_millis(1_000),
                dead_after: Duration::from_millis(2_000),
                cluster_port: 0,
            },
            first_byte_timeout: Duration::from_secs(30),
            // Two loops, so every cluster test also crosses threads the
            // way a node on a multi-core machine does.
            event_loops: 2,
            seed_perf: true,
            engine_seed: None,
            resume: pair_proxy::resume::ResumePolicy::default(),
            queue: None,
            preempt: false,
            answer_length: pair_emulator::AnswerLength::Limit,
            cache: None,
        }
    }
}

/// A running local cluster; dropping it without [`LocalCluster::stop`]
/// cancels everything.
pub struct LocalCluster {
    pub nodes: Vec<Node>,
    pub engines: Vec<EmulatedEngine>,
    pub spec: ClusterSpec,
    dirs: Vec<tempfile::TempDir>,
    shutdown: CancellationToken,
}

impl LocalCluster {
    /// Node `i`'s state directory (a temporary one), where `pair-node pair
    /// invite --state-dir` reads its owner's token.
    pub fn state_dir(&self, i: usize) -> Option<&std::path::Path> {
        self.dirs.get(i).map(tempfile::TempDir::path)
    }
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl LocalCluster {
    pub async fn start(spec: ClusterSpec) -> Result<Self> {
        let shutdown = CancellationToken::new();
        let mut nodes = Vec::with_capacity(spec.nodes.len());
        let mut engines = Vec::with_capacity(spec.nodes.len());
        let mut dirs = Vec::with_capacity(spec.nodes.len());
        for (i, ns) in spec.nodes.iter().enumerate() {
            let profile = HardwareProfile::by_name(&ns.profile)
                .with_context(|| format!("hardware profile {}", ns.profile))?;
            let engine_spec = match &ns.external {
                Some(external) => external.clone(),
                None => {
                    let mut emu = EmuConfig::new(ns.flavor, ns.models.iter().cloned());
                    emu.profile = profile.clone();
                    emu.time_scale = spec.time_scale;
                    emu.seed = spec.engine_seed.unwrap_or(i as u64);
                    emu.slots = ns.slots;
                    emu = emu.with_answer_length(spec.answer_length);
                    if let Some(cache) = spec.cache {
                        emu = emu.with_cache(cache);
                    }
                    let engine =
                        EmulatedEngine::spawn(emu, TcpListener::bind("127.0.0.1:0").await?)?;
                    let kind = match ns.flavor {
                        Flavor::Ollama => "ollama",
                        Flavor::OpenAi => "openai-compat",
                        Flavor::LmStudio => "lm-studio",
                    };
                    let s = format!("{kind}={}", engine.base_url());
                    engines.push(engine);
                    s
                }
            };
            let dir = tempfile::Builder::new().prefix("pair-node-").tempdir()?;
            let (ollama_face, openai_face) = match (i, spec.first_faces) {
                (0, Some(f)) => f,
                _ => (
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                ),
            };
            let cfg = NodeConfig {
                state_dir: dir.path().to_owned(),
                name: ns.name.clone(),
                ollama_face,
                openai_face,
                cluster: SocketAddr::from(([127, 0, 0, 1], 0)),
                engines: vec![parse_engine(&engine_spec)?],
                policy: spec.policy,
                peers: Vec::new(),
                mdns: spec.mdns,
                mdns_port: spec.mdns_port,
                first_byte_timeout: spec.first_byte_timeout,
                resume: spec.resume,
                queue: spec.queue.map(|order| pair_proxy::waiting::Queue {
                    order,
                    preempt: spec.preempt,
                }),
                default_engine: false,
                engine_cmd: None,
                detect_ports: Vec::new(),
                event_loops: spec.event_loops,
                allowed_hosts: Vec::new(),
                aliases: ns.aliases.clone(),
                lan: ns.lan.clone(),
                max_connections: None,
                deadlines: pair_http::conns::ClientDeadlines::default(),
                body_budget: crate::config::DEFAULT_BODY_BUDGET,
                http_stack: pair_http::HttpStack::default(),
                metrics_listen: None,
                emulated: None,
                report_interval: None,
                telemetry_interval: None,
            };
            let listeners = Listeners::bind(&cfg).await?;
            // Seed the scheduler with the profile's speed on a typical
            // model until jobs teach it the real one.
            let seed_model = pair_emulator::ModelSpec::guess(
                ns.models.first().map_or("llama3.2:3b", String::as_str),
            );
            let extras = NodeExtras {
                base_perf: spec
                    .seed_perf
                    .then(|| profile.rates(seed_model.size_bytes).to_perf()),
                gossip: Some(spec.gossip),
                ..NodeExtras::default()
            };
            nodes.push(daemon::start(cfg, listeners, extras, shutdown.clone()).await?);
            dirs.push(dir);
        }
        let cluster = Self {
            nodes,
            engines,
            spec,
            dirs,
            shutdown,
        };
        if cluster.spec.pair {
            cluster.pair_all().await?;
        }
        Ok(cluster)
    }

    /// Pairs every two nodes through the real protocol: one opens an
    /// invite, the other joins with the PIN over HTTP.
    pub async fn pair_all(&self) -> Result<()> {
        for i in 0..self.nodes.len() {
            for j in (i + 1)..self.nodes.len() {
                self.pair(i, j).await?;
            }
        }
        Ok(())
    }

    /// Node `joiner` joins node `inviter`.
    pub async fn pair(&self, inviter: usize, joiner: usize) -> Result<()> {
        let a = &self.nodes[inviter];
        let b = &self.nodes[joiner];
        let pin = a.pairing.open_invite(SystemTime::now())?;
        let addr = a.cluster_addr.to_string();
        let rec = pair_identity::join(&addr, &pin, &b.identity, &b.trust, &b.name)
            .await
            .with_context(|| format!("{} joining {}", b.name, a.name))?;
        if let Ok(mut book) = b.addrbook.lock() {
            book.insert(rec.id, a.cluster_addr);
        }
        Ok(())
    }

    /// Waits until every node routes to every other node.
    pub async fn wait_converged(&self, within: Duration) -> Result<()> {
        let n = self.nodes.len();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let ok = self.nodes.iter().all(|node| {
                let s = node.state.cluster();
                s.len() == n
                    && s.nodes()
                        .iter()
                        .all(|x| x.liveness == pair_core::Liveness::Alive && !x.engines.is_empty())
                    && s.nodes()
                        .iter()
                        .all(|x| x.engines.iter().all(|e| e.healthy))
            });
            if ok {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let views: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|node| {
                        let s = node.state.cluster();
                        format!("{} sees {} node(s)", node.name, s.len())
                    })
                    .collect();
                bail!(
                    "cluster did not converge within {within:?}: {}",
                    views.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every node and engine gracefully.
    pub async fn stop(self) {
        for node in self.nodes {
            node.stop().await;
        }
        for e in self.engines {
            e.shutdown().await;
        }
        self.shutdown.cancel();
        drop(self.dirs);
    }
}
