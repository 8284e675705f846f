//! The daemon: identity and trust, the cluster port (node info, pairing,
//! mTLS relay), telemetry, engine pollers, discovery, peer links, gossip and
//! the local faces, wired together and shut down in order.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use pair_core::{ModelPerf, NodeId, NodeSnapshot, Role};
use pair_discovery::{Discovery, DiscoveryConfig, Interfaces, PeerSet};
use pair_engines::{EngineHandle, PollConfig, spawn_poller};
use pair_http::Timeouts;
use pair_http::runtime::EventLoops;
use pair_identity::tls::Expect;
use pair_identity::{ControlToken, Identity, IdentityPaths, Limits, PairingService, TrustStore};
use pair_jobs::JobLog;
use pair_proxy::cluster::{self, ClusterPort};
use pair_proxy::dispatch::PeerLink;
use pair_proxy::face::{self, Face};
use pair_proxy::gate::FaceGate;
use pair_proxy::gossip::{self, GossipConfig, PeerReports, PeerView};
use pair_proxy::relay;
use pair_proxy::state::{
    DEFAULT_BODY_CAP, LocalEngine, NodeIdentity, ProxyConfig, ProxyState, now_ms,
};
use pair_scheduler::SchedulerConfig;
use pair_telemetry::{NodeInfoConfig, Sampler, SamplerConfig, SysinfoHost, Telemetry};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Mdns, NodeConfig};
use crate::control;

/// The node's three sockets, bound before start so tests and the demo can
/// use port 0 and read the real addresses.
#[derive(Debug)]
pub struct Listeners {
    pub ollama: TcpListener,
    pub openai: TcpListener,
    pub cluster: TcpListener,
}

impl Listeners {
    pub async fn bind(cfg: &NodeConfig) -> Result<Self> {
        Ok(Self {
            ollama: bind_face(cfg.ollama_face, "Ollama").await?,
            openai: bind_face(cfg.openai_face, "OpenAI").await?,
            cluster: TcpListener::bind(cfg.cluster)
                .await
                .with_context(|| format!("cannot listen on cluster port {}", cfg.cluster))?,
        })
    }
}

async fn bind_face(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
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

/// The connection cap that fits this process's open-file limit (which
/// `main` raises to the hard limit at start).
fn default_max_connections() -> usize {
    let nofile = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
    pair_http::conns::cap_for_fd_limit(nofile)
}

/// Optional parts the demo and tests swap in.
#[derive(Debug, Default, Clone)]
pub struct NodeExtras {
    /// Seed speed for models not yet learned (the demo derives it from the
    /// emulated hardware profile).
    pub base_perf: Option<ModelPerf>,
    /// Gossip timing (tests shorten it).
    pub gossip: Option<GossipConfig>,
}

/// A running node.
pub struct Node {
    pub id: NodeId,
    pub name: String,
    pub ollama_addr: SocketAddr,
    pub openai_addr: SocketAddr,
    pub cluster_addr: SocketAddr,
    pub state: Arc<ProxyState>,
    pub identity: Arc<Identity>,
    pub trust: TrustStore,
    pub pairing: PairingService,
    /// The owner's token for the control calls (also in the state dir).
    pub control_token: ControlToken,
    /// Addresses learned from pairing joins (peers that may not multicast).
    pub addrbook: Arc<Mutex<HashMap<NodeId, SocketAddr>>>,
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
    let node = start(cfg, listeners, NodeExtras::default(), shutdown.clone()).await?;
    tracing::info!(
        id = %node.id, name = %node.name, ollama = %node.ollama_addr,
        openai = %node.openai_addr, cluster = %node.cluster_addr, "pair-node running"
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
    let sampler = Sampler::spawn(
        SamplerConfig::default(),
        pair_telemetry::default_gpu_probe(),
        Box::new(host),
        shutdown.clone(),
    );

    let mut engines: Vec<EngineHandle> = Vec::with_capacity(cfg.engines.len());
    for e in &cfg.engines {
        engines.push(spawn_poller(
            e.clone(),
            PollConfig::default(),
            &tasks,
            shutdown.clone(),
        )?);
    }
    let local_engines = cfg
        .engines
        .iter()
        .zip(&engines)
        .map(|(e, handle)| {
            let base = e.base_url.to_string().parse()?;
            Ok(LocalEngine::new(
                e.kind,
                base,
                Some(handle.refresh_signal()),
            )?)
        })
        .collect::<Result<Vec<_>>>()?;

    let jobs = Arc::new(JobLog::open(dir, now_ms())?);
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
            body_cap: DEFAULT_BODY_CAP,
            engines: local_engines,
            loops: Arc::clone(&loops),
            gate: FaceGate::new(&cfg.allowed_hosts),
            max_connections: cfg.max_connections.unwrap_or_else(default_max_connections),
            deadlines: cfg.deadlines,
            http_stack: cfg.http_stack,
        },
        jobs,
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
        secure: relay::router(Arc::clone(&st), Arc::clone(&reports)),
        acceptor: pair_identity::tls::tls_acceptor(&identity, &trust)?,
        trust: trust.clone(),
        loops,
        conns: Arc::clone(&st.conns),
    };
    tasks.spawn(cluster::serve(
        listeners.cluster,
        port,
        shutdown.clone(),
        tasks.clone(),
    ));

    let discovery = start_discovery(&cfg, id, cluster_addr, &shutdown).await?;
    let peer_set = discovery
        .as_ref()
        .map_or_else(|| watch::channel(PeerSet::default()).1, Discovery::peers);
    let addrbook = Arc::new(Mutex::new(HashMap::new()));

    tasks.spawn(maintain_links(
        Arc::clone(&st),
        Arc::clone(&identity),
        trust.clone(),
        peer_set.clone(),
        Arc::clone(&reports),
        Arc::clone(&addrbook),
        shutdown.clone(),
    ));

    let mut gossip_cfg = extras.gossip.unwrap_or_default();
    gossip_cfg.cluster_port = cluster_addr.port();
    let telemetry = sampler.subscribe();
    let local = local_snapshot(
        Arc::clone(&st),
        engines,
        telemetry,
        extras.base_perf,
        cfg.name.clone(),
    );
    let views = peer_views(Arc::clone(&st), trust.clone(), peer_set);
    tasks.spawn(gossip::run(
        Arc::clone(&st),
        Arc::clone(&reports),
        local,
        views,
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
        cluster_addr,
        state: st,
        identity,
        trust,
        pairing,
        control_token,
        addrbook,
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

/// This node's own entry of the cluster snapshot.
fn local_snapshot(
    st: Arc<ProxyState>,
    engines: Vec<EngineHandle>,
    telemetry: watch::Receiver<Telemetry>,
    base_perf: Option<ModelPerf>,
    name: String,
) -> impl Fn() -> NodeSnapshot + Send + Sync {
    move || {
        let now = now_ms();
        let mut n = NodeSnapshot::new(st.node.id, name.clone());
        n.engines = engines.iter().map(EngineHandle::snapshot).collect();
        for e in &mut n.engines {
            for m in &mut e.models {
                let seed = m.perf.or(base_perf).unwrap_or(ModelPerf::FALLBACK);
                if let Some(learned) = st.learned(st.node.id, m.name.as_str(), seed) {
                    m.perf = Some(learned);
                } else if m.perf.is_none() {
                    m.perf = base_perf;
                }
            }
        }
        let t = telemetry.borrow();
        n.gpus = t.gpus.clone();
        n.pressure = t.pressure_at(now);
        drop(t);
        st.metrics.pressure.set(i64::from(n.pressure.band()));
        // Work sent straight to an engine's own port (vLLM reports its queue)
        // is invisible to PAIR; count it here.
        let (running, waiting) = engines
            .iter()
            .filter_map(|h| h.report().queue)
            .fold((0u32, 0u32), |(r, w), q| {
                (r.saturating_add(q.running), w.saturating_add(q.waiting))
            });
        st.load.set_engine_queue(running, waiting);
        n.workload = st.load.workload(n.slots());
        n.reported_at_ms = now;
        n.base_perf = base_perf;
        n
    }
}

/// The peers the scheduler may route to: paired nodes, with what discovery
/// says of them (peers known only by address are taken as alive; their
/// report age decides).
fn peer_views(
    st: Arc<ProxyState>,
    trust: TrustStore,
    discovered: watch::Receiver<PeerSet>,
) -> impl Fn() -> HashMap<NodeId, PeerView> + Send + Sync {
    move || {
        let set = discovered.borrow();
        let links = st.peer_links();
        trust
            .peers()
            .into_iter()
            .filter(|p| p.role == Role::Node && links.contains_key(&p.id))
            .map(|p| {
                let view = set.get(p.id).map_or(
                    PeerView {
                        liveness: pair_core::Liveness::Alive,
                        rtt_us: 0,
                    },
                    |d| PeerView {
                        liveness: d.liveness,
                        rtt_us: d.rtt_us.unwrap_or(0),
                    },
                );
                (p.id, view)
            })
            .collect()
    }
}

/// Keeps one mTLS link per paired node whose address is known: from mDNS
/// or static probing first, else where it last reported from, else where
/// we joined it.
async fn maintain_links(
    st: Arc<ProxyState>,
    identity: Arc<Identity>,
    trust: TrustStore,
    discovered: watch::Receiver<PeerSet>,
    reports: Arc<PeerReports>,
    addrbook: Arc<Mutex<HashMap<NodeId, SocketAddr>>>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = trust.subscribe();
    let timeouts = st.timeouts;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            ev = events.recv() => {
                if let Ok(pair_identity::TrustEvent::Removed(id)) = ev {
                    reports.forget(id);
                }
            }
        }
        let reported = reports.addresses();
        let booked = addrbook.lock().map(|b| b.clone()).unwrap_or_default();
        let current = st.peer_links();
        let mut next: HashMap<NodeId, PeerLink> = HashMap::new();
        for peer in trust.peers() {
            if peer.role != Role::Node {
                continue;
            }
            let found = discovered.borrow().get(peer.id).and_then(|d| {
                d.addrs
                    .first()
                    .map(|ip| SocketAddr::new(*ip, d.cluster_port))
            });
            let Some(addr) = found
                .or_else(|| reported.get(&peer.id).copied())
                .or_else(|| booked.get(&peer.id).copied())
            else {
                continue;
            };
            if let Some(link) = current.get(&peer.id)
                && link_addr(link) == Some(addr)
            {
                next.insert(peer.id, link.clone());
                continue;
            }
            match pair_identity::tls::client_config(&identity, &trust, Expect::Peer(peer.id))
                .map_err(anyhow::Error::from)
                .and_then(|c| {
                    PeerLink::new(peer.id, addr, Arc::new(c), timeouts).map_err(Into::into)
                }) {
                Ok(link) => {
                    tracing::info!(peer = %peer.id, name = %peer.name, %addr, "peer link up");
                    next.insert(peer.id, link);
                }
                Err(e) => tracing::warn!(peer = %peer.id, error = %e, "cannot build a peer link"),
            }
        }
        let changed = next.len() != current.len()
            || next
                .iter()
                .any(|(id, l)| current.get(id).map(link_addr) != Some(link_addr(l)));
        if changed {
            st.set_peers(next);
        }
    }
}

fn link_addr(link: &PeerLink) -> Option<SocketAddr> {
    let a = link.base.authority()?;
    a.as_str().parse().ok()
}
