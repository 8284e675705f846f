//! The daemon: identity and trust, the cluster port (node info, pairing,
//! mTLS relay), telemetry, engine pollers, discovery, peer links, gossip and
//! the local faces, wired together and shut down in order.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use pair_cluster::gossip::{self, Gossip};
use pair_cluster::learning::SpeedLearner;
use pair_cluster::links::{self, LinkSources};
use pair_cluster::{
    AddrBook, Bindings, ClusterPort, GossipConfig, LocalLoad, LocalReport, PeerReports, Peers,
    Progress, SeedBySize, snapshot,
};
use pair_core::{GpuDevice, ModelPerf, NodeId, Role};
use pair_discovery::{Discovery, DiscoveryConfig, Interfaces, PeerSet};
use pair_engines::{EngineHandle, PollConfig, spawn_poller};
use pair_http::Timeouts;
use pair_identity::{ControlToken, Identity, IdentityPaths, Limits, PairingService, TrustStore};
use pair_jobs::JobLog;
use pair_proxy::dispatch::LocalEngine;
use pair_proxy::face::{self, Face};
use pair_proxy::gate::FaceGate;
use pair_proxy::relay;
use pair_proxy::state::{DEFAULT_BODY_CAP, NodeIdentity, ProxyConfig, ProxyState, now_ms};
use pair_runtime::runtime::EventLoops;
use pair_scheduler::SchedulerConfig;
use pair_telemetry::{FedGpuProbe, GpuProbe, NodeInfoConfig, Sampler, SamplerConfig, SysinfoHost};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[cfg(feature = "demo")]
use crate::config::EmulatedHardware;
use crate::config::{Mdns, NodeConfig};
use crate::control;

/// The node's three sockets, bound before start so tests and the demo can
/// use port 0 and read the real addresses.
#[derive(Debug)]
pub struct Listeners {
    pub ollama: TcpListener,
    pub openai: TcpListener,
    pub cluster: TcpListener,
    /// The LAN face, when `--lan-face` opens one.
    pub lan: Option<TcpListener>,
}

impl Listeners {
    pub async fn bind(cfg: &NodeConfig) -> Result<Self> {
        Ok(Self {
            ollama: bind_face(cfg.ollama_face, "Ollama").await?,
            openai: bind_face(cfg.openai_face, "OpenAI").await?,
            cluster: listen(cfg.cluster)
                .with_context(|| format!("cannot listen on cluster port {}", cfg.cluster))?,
            lan: match &cfg.lan {
                Some(lan) => Some(bind_face(lan.addr, "LAN").await?),
                None => None,
            },
        })
    }
}

/// A listener on `addr`; `[::]` explicitly dual-stack, IPv4 included, as
/// on Linux also on Windows, where it would otherwise be IPv6 only.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::from_std(pair_os::bind_tcp(addr)?)
}

async fn bind_face(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    listen(addr).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            match addr.port() {
                11434 => " — the engine probably still runs there; move it: OLLAMA_HOST=127.0.0.1:11435 ollama serve",
                1234 => " — the engine probably still runs there; move it: lms server start --port 1235 (llama.cpp: --port 1235)",
                _ => "",
            }
        } else {
            ""
        };
        anyhow::anyhow!("cannot listen on the {what} face {addr}: {e}{hint}")
    })
}

/// The names and addresses by which other machines reach this node: the
/// LAN face answers a `Host` of any of them (and what `--allowed-host`
/// adds). The hostname and its `.local` (mDNS) name, every address of
/// this machine's interfaces, and the face's own address.
fn own_names(name: &str, face: SocketAddr) -> Vec<String> {
    let literal = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let mut names = Vec::new();
    if let Some(host) = pair_os::hostname() {
        names.extend(pair_os::host::lan_names(&host));
    }
    names.push(name.to_owned());
    names.push(literal(face.ip()));
    if let Ok(addrs) = pair_discovery::local_addrs() {
        names.extend(addrs.into_iter().map(|a| literal(a.ip)));
    }
    names
}

/// The connection cap that fits this process's open-file limit (which
/// `main` raises to the hard limit at start; a fixed cap where the OS has
/// no such limit: `pair_os::limits`).
fn default_max_connections() -> usize {
    pair_http::conns::cap_for_fd_limit(pair_os::open_file_cap())
}

/// Optional parts the demo and tests swap in.
#[derive(Debug, Default, Clone)]
pub struct NodeExtras {
    /// Seed speed for models not yet learned (the demo derives it from the
    /// emulated hardware profile).
    pub base_perf: Option<ModelPerf>,
    /// Gossip timing (tests shorten it).
    pub gossip: Option<GossipConfig>,
    /// Seed speed of a model by its size (an emulated hardware profile's).
    pub seed_by_size: Option<SeedBySize>,
    /// The emulated engine's GPU: telemetry reads it from the engine
    /// instead of NVML (see `emulated`).
    pub emulated_gpu: Option<GpuDevice>,
}

impl NodeExtras {
    /// What a node over an emulated engine of `hw`'s profile says of its
    /// hardware: a GPU of the profile's name and, when asked, the profile's
    /// speeds (as the simulator's nodes do).
    #[cfg(feature = "demo")]
    pub fn emulating(hw: &EmulatedHardware) -> Self {
        let profile = hw.profile.clone();
        let gpu = GpuDevice {
            index: 0,
            name: profile.name.clone(),
            utilisation_pct: 0,
            vram_used_bytes: 0,
            vram_total_bytes: profile.memory_bytes,
        };
        let (base_perf, seed_by_size) = match hw.speed_scale {
            Some(scale) => {
                let base = profile
                    .rates(profile.reference_model_bytes)
                    .at_time_scale(scale)
                    .to_perf();
                let by_size = move |bytes: u64| profile.rates(bytes).at_time_scale(scale).to_perf();
                (Some(base), Some(SeedBySize(Arc::new(by_size))))
            }
            None => (None, None),
        };
        Self {
            base_perf,
            gossip: None,
            seed_by_size,
            emulated_gpu: Some(gpu),
        }
    }
}

/// A running node.
pub struct Node {
    pub id: NodeId,
    pub name: String,
    pub ollama_addr: SocketAddr,
    pub openai_addr: SocketAddr,
    /// The LAN face's address, when it is open.
    pub lan_addr: Option<SocketAddr>,
    pub cluster_addr: SocketAddr,
    pub state: Arc<ProxyState>,
    pub identity: Arc<Identity>,
    pub trust: TrustStore,
    pub pairing: PairingService,
    /// The owner's token for the control calls (also in the state dir).
    pub control_token: ControlToken,
    /// Addresses learned from pairing joins (peers that may not multicast).
    pub addrbook: AddrBook,
    /// The latest report of each peer, with where it said it listens.
    pub reports: Arc<PeerReports>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    discovery: Option<Discovery>,
    sampler: Sampler,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("ollama_addr", &self.ollama_addr)
            .field("openai_addr", &self.openai_addr)
            .field("cluster_addr", &self.cluster_addr)
            .finish_non_exhaustive()
    }
}

/// Runs a node until `shutdown` fires, then stops it gracefully.
pub async fn run(cfg: NodeConfig, listeners: Listeners, shutdown: CancellationToken) -> Result<()> {
    #[cfg(feature = "demo")]
    let mut extras = cfg
        .emulated
        .as_ref()
        .map(NodeExtras::emulating)
        .unwrap_or_default();
    #[cfg(not(feature = "demo"))]
    let mut extras = NodeExtras::default();
    if let Some(interval) = cfg.report_interval {
        extras.gossip = Some(GossipConfig {
            interval,
            ..GossipConfig::default()
        });
    }
    let node = start(cfg, listeners, extras, shutdown.clone()).await?;
    let lan = node
        .lan_addr
        .map_or_else(|| "off".to_owned(), |a| a.to_string());
    tracing::info!(
        id = %node.id, name = %node.name, ollama = %node.ollama_addr,
        openai = %node.openai_addr, cluster = %node.cluster_addr, lan = %lan, "pair-node running"
    );
    shutdown.cancelled().await;
    node.stop().await;
    Ok(())
}

/// Starts every part of a node on the given sockets.
pub async fn start(
    cfg: NodeConfig,
    listeners: Listeners,
    extras: NodeExtras,
    parent: CancellationToken,
) -> Result<Node> {
    pair_identity::install_crypto_provider();
    let dir = &cfg.state_dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create state directory {}", dir.display()))?;
    let had_identity = IdentityPaths::under(dir).key.exists();
    let identity = Arc::new(Identity::load_or_create(dir, Role::Node)?);
    let trust = TrustStore::open(TrustStore::default_path(dir))?;
    let pinned = trust.peers().len();
    if !had_identity && pinned > 0 {
        tracing::warn!(
            "this node has a new identity ({}): identity/ was missing from {} while trust.json still lists {pinned} paired peer(s), \
             who will refuse the new key; restore identity/ from a backup and restart, or pair again \
             (pair-node unpair each old peer, then pair-node pair invite / join)",
            identity.id(),
            dir.display()
        );
    }
    let control_token = ControlToken::create(dir)?;
    let pairing = PairingService::new(&identity, &cfg.name, trust.clone(), dir, Limits::default())?;
    let id = identity.id();
    let ollama_addr = listeners.ollama.local_addr()?;
    let openai_addr = listeners.openai.local_addr()?;
    let cluster_addr = listeners.cluster.local_addr()?;

    let shutdown = parent.child_token();
    let tasks = TaskTracker::new();

    let host = SysinfoHost::new().context("reading host CPU and memory")?;
    let mut sampler_cfg = SamplerConfig::default();
    if let Some(interval) = cfg.telemetry_interval {
        sampler_cfg.interval = interval;
    }
    // Over an emulated engine, its modelled GPU stands where NVML would.
    let gpu_probe: Box<dyn GpuProbe> = match (extras.emulated_gpu.clone(), cfg.engines.first()) {
        (Some(device), Some(engine)) => {
            let (probe, feed) = FedGpuProbe::new();
            tasks.spawn(crate::emulated::feed_gpu(
                engine.base_url.clone(),
                device,
                sampler_cfg.interval,
                feed,
                shutdown.clone(),
            ));
            Box::new(probe)
        }
        _ => pair_telemetry::default_gpu_probe(),
    };
    let sampler = Sampler::spawn(sampler_cfg, gpu_probe, Box::new(host), shutdown.clone());

    let mut engines: Vec<EngineHandle> = Vec::with_capacity(cfg.engines.len());
    for e in &cfg.engines {
        engines.push(spawn_poller(
            e.clone(),
            PollConfig::default(),
            &tasks,
            shutdown.clone(),
        )?);
    }
    // Each engine's progress: stamped by the request path, read by the
    // node's report (a stalled engine leaves routing for a while).
    // A hung engine is tried again after as long as it may stall.
    let progress: Vec<Arc<Progress>> = engines
        .iter()
        .map(|_| Arc::new(Progress::with_cooldown(cfg.first_byte_timeout)))
        .collect();
    let local_engines = cfg
        .engines
        .iter()
        .zip(&engines)
        .zip(&progress)
        .map(|((e, handle), progress)| {
            let base = e.base_url.to_string().parse()?;
            Ok(LocalEngine::new(
                e.kind,
                base,
                Some(handle.refresh_signal()),
                Arc::clone(progress),
            )?)
        })
        .collect::<Result<Vec<_>>>()?;

    let jobs = Arc::new(JobLog::open(dir, now_ms())?);
    // API keys for the LAN face, held cluster-wide.
    let keys = pair_identity::keys::KeyStore::open(dir)?;
    let peers = Peers::new();
    let load = LocalLoad::new();
    let bindings = Arc::new(Bindings::default());
    let loops = EventLoops::start(cfg.event_loops).context("starting the event loops")?;
    let st = ProxyState::new(
        ProxyConfig {
            node: NodeIdentity {
                id,
                name: cfg.name.clone(),
            },
            scheduler: SchedulerConfig::new(cfg.policy),
            timeouts: Timeouts {
                first_byte: cfg.first_byte_timeout,
                ..Timeouts::default()
            },
            resume: cfg.resume,
            body_cap: DEFAULT_BODY_CAP,
            engines: local_engines,
            loops: Arc::clone(&loops),
            gate: FaceGate::new(&cfg.allowed_hosts),
            max_connections: cfg.max_connections.unwrap_or_else(default_max_connections),
            deadlines: cfg.deadlines,
            body_budget: cfg.body_budget,
            http_stack: cfg.http_stack,
            peers: Arc::clone(&peers),
            load: Arc::clone(&load),
            bindings: Arc::clone(&bindings),
            queue: cfg.queue,
        },
        Arc::clone(&jobs),
    );
    let reports = PeerReports::new();

    // The cluster port: pairing and node info in plain HTTP, the rest mTLS.
    let node_info = pair_telemetry::node_info_router(
        NodeInfoConfig {
            id,
            name: cfg.name.clone(),
            role: Role::Node,
            cluster_port: cluster_addr.port(),
        },
        sampler.subscribe(),
    );
    let port = ClusterPort {
        plain: Router::new().merge(pairing.router()).merge(node_info),
        secure: pair_cluster::routes::router(Arc::clone(&reports), Arc::clone(&jobs))
            .merge(relay::router(Arc::clone(&st)))
            .merge(pair_proxy::probe::router(Arc::clone(&st)))
            .merge(pair_cluster::edge::router(
                trust.clone(),
                Arc::clone(&peers),
            ))
            .merge(pair_cluster::keys::router(keys.clone())),
        acceptor: pair_identity::tls::tls_acceptor(&identity, &trust)?,
        trust: trust.clone(),
        loops,
        conns: Arc::clone(&st.conns),
    };
    tasks.spawn(pair_cluster::port::serve(
        listeners.cluster,
        port,
        shutdown.clone(),
        tasks.clone(),
    ));

    let discovery = start_discovery(&cfg, id, cluster_addr, &shutdown).await?;
    let peer_set = discovery
        .as_ref()
        .map_or_else(|| watch::channel(PeerSet::default()).1, Discovery::peers);
    let addrbook = AddrBook::default();
    tasks.spawn(links::maintain(
        Arc::clone(&peers),
        LinkSources {
            identity: Arc::clone(&identity),
            trust: trust.clone(),
            discovered: peer_set.clone(),
            reports: Arc::clone(&reports),
            addrbook: Arc::clone(&addrbook),
            timeouts: st.timeouts,
        },
        shutdown.clone(),
    ));

    tasks.spawn(pair_cluster::edge::sync_vouched(
        trust.clone(),
        Arc::clone(&reports),
        Arc::clone(&peers),
        shutdown.clone(),
    ));
    let mut gossip_cfg = extras.gossip.unwrap_or_default();
    gossip_cfg.cluster_port = cluster_addr.port();
    let engine_handles = engines.clone();
    let local = LocalReport {
        id,
        name: cfg.name.clone(),
        engines,
        progress,
        telemetry: sampler.subscribe(),
        base_perf: extras.base_perf,
        seed_by_size: extras.seed_by_size,
        load,
        bindings,
        learner: Arc::new(SpeedLearner::new(Arc::clone(&jobs), id)),
        boot: boot_id(),
        trust: trust.clone(),
        aliases: cfg.aliases.clone(),
        keys: keys.clone(),
    };
    tasks.spawn(pair_cluster::keys::sync(
        keys.clone(),
        Arc::clone(&reports),
        Arc::clone(&peers),
        shutdown.clone(),
    ));
    let statuses = {
        let (trust, peers) = (trust.clone(), Arc::clone(&peers));
        move || snapshot::peer_statuses(&trust, &peer_set, &peers)
    };
    let publish = {
        let st = Arc::clone(&st);
        move |snapshot| st.publish(snapshot)
    };
    tasks.spawn(gossip::run(
        Gossip {
            node: id,
            jobs,
            peers,
            reports: Arc::clone(&reports),
            local,
            statuses: Box::new(statuses),
            publish: Box::new(publish),
        },
        gossip_cfg,
        shutdown.clone(),
    ));

    let control = control::router(control::Control {
        st: Arc::clone(&st),
        pairing: pairing.clone(),
        identity: Arc::clone(&identity),
        trust: trust.clone(),
        reports: Arc::clone(&reports),
        addrbook: Arc::clone(&addrbook),
        cluster_addr,
        name: cfg.name.clone(),
        token: control_token.clone(),
        engines: engine_handles,
        keys: keys.clone(),
    });
    let sweep_state = Arc::clone(&st);
    let sweep_stop = shutdown.clone();
    tasks.spawn(async move {
        let mut every = tokio::time::interval(pair_http::client::SWEEP_EVERY);
        loop {
            tokio::select! {
                () = sweep_stop.cancelled() => return,
                _ = every.tick() => sweep_state.sweep_engine_connections(),
            }
        }
    });
    if let Some(addr) = cfg.metrics_listen {
        let listener =
            listen(addr).with_context(|| format!("cannot listen on --metrics-listen {addr}"))?;
        tracing::info!(addr = %listener.local_addr()?, "metrics served for scraping");
        tasks.spawn(face::serve_metrics(
            listener,
            Arc::clone(&st),
            shutdown.clone(),
            tasks.clone(),
        ));
    }
    let lan_addr = match (listeners.lan, &cfg.lan) {
        (Some(listener), Some(lan)) => {
            let addr = listener.local_addr()?;
            let mut hosts = cfg.allowed_hosts.clone();
            hosts.extend(own_names(&cfg.name, addr));
            let rules = pair_proxy::lan::Lan::new(pair_proxy::lan::LanConfig {
                keys: keys.clone(),
                hosts,
                origins: lan.origins.clone(),
                per_address: lan.per_address,
            });
            tracing::info!(%addr, "LAN face open: every request needs an API key (pair-node keys add NAME)");
            tasks.spawn(face::serve_lan(
                listener,
                Arc::clone(&st),
                rules,
                shutdown.clone(),
            ));
            Some(addr)
        }
        _ => None,
    };
    tasks.spawn(face::serve(
        listeners.ollama,
        Arc::clone(&st),
        Face::Ollama,
        control.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(face::serve(
        listeners.openai,
        Arc::clone(&st),
        Face::OpenAi,
        control,
        shutdown.clone(),
    ));
    tasks.close();

    Ok(Node {
        id,
        name: cfg.name,
        ollama_addr,
        openai_addr,
        lan_addr,
        cluster_addr,
        state: st,
        identity,
        trust,
        pairing,
        control_token,
        addrbook,
        reports,
        shutdown,
        tasks,
        discovery,
        sampler,
    })
}

impl Node {
    /// Stops accepting, says goodbye on mDNS, lets in-flight streams finish
    /// (up to [`pair_http::hyper_conn::SHUTDOWN_GRACE`]), then stops every task.
    pub async fn stop(self) {
        if let Some(d) = self.discovery {
            d.shutdown().await;
        }
        self.shutdown.cancel();
        if tokio::time::timeout(pair_http::hyper_conn::SHUTDOWN_GRACE, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("shutdown grace elapsed with requests still in flight");
        }
        // What still runs on the extra loops is dropped with them, so the
        // state it holds (the job log flushes when dropped) is released.
        self.state.loops.shutdown(Duration::from_secs(2)).await;
        self.sampler.shutdown().await;
    }

    /// Stops at once, without the goodbye: what a crash looks like to peers.
    pub async fn kill(self) {
        if let Some(d) = self.discovery {
            d.abort().await;
        }
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.tasks.wait()).await;
        self.state.loops.shutdown(Duration::from_secs(2)).await;
        self.sampler.shutdown().await;
    }

    /// Base URL of the Ollama face.
    pub fn ollama_url(&self) -> String {
        format!("http://{}", self.ollama_addr)
    }

    /// Base URL of the OpenAI face.
    pub fn openai_url(&self) -> String {
        format!("http://{}", self.openai_addr)
    }
}

async fn start_discovery(
    cfg: &NodeConfig,
    id: NodeId,
    cluster: SocketAddr,
    shutdown: &CancellationToken,
) -> Result<Option<Discovery>> {
    if cfg.mdns == Mdns::Off && cfg.peers.is_empty() {
        return Ok(None);
    }
    let interfaces = match cfg.mdns {
        Mdns::Loopback | Mdns::Off => Interfaces::LoopbackOnly,
        Mdns::Lan => Interfaces::AllExceptVirtual,
    };
    let mut d = DiscoveryConfig::new(id, cfg.name.clone(), cluster.port(), interfaces);
    d.mdns = cfg.mdns != Mdns::Off;
    d.mdns_port = cfg.mdns_port;
    d.static_peers = cfg.peers.clone();
    Ok(Some(
        Discovery::start(d, shutdown.clone())
            .await
            .context("starting discovery")?,
    ))
}

/// This process's boot id: the start time in nanoseconds with the process
/// id, never 0.
fn boot_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ (u64::from(std::process::id()) << 40)) | 1
}
