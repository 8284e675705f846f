//! The client: candidates, probe rounds, the cached ranking and the links;
//! requests (`client/send.rs`) go straight to a node's cluster port with failover
//! by the nodes' own driver.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use pair_core::Role;
use pair_core::{ApiFlavor, ChainBuilder, NodeId, PromptChain, RequestProfile, SessionKey};
use pair_discovery::Discovery;
use pair_identity::{Identity, PeerRecord, TrustStore};
use pair_link::PeerLink;
use pair_link::{InferenceRoute, edge};
use pair_scheduler::{Ranking, Reservations, Scheduler, SchedulerConfig, Target};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, Mdns};
use crate::error::{Error, Result};
use crate::probe::{ProbeFailure, Probed, Prober};
use crate::view::{NodeView, View};

mod send;

/// A request as it goes to a node: an inference route of either API, or
/// any other route a node's relay takes (listings).
#[derive(Clone, Debug)]
pub struct Request {
    pub method: Method,
    /// The route as a client calls it on a face: `/v1/chat/completions`,
    /// `/api/generate`, `/api/tags`.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The model, for ranking (`None` for routes without one).
    pub model: Option<String>,
    pub flavor: ApiFlavor,
    /// The caller wants a stream (it feels the first token, not the whole).
    pub streaming: bool,
    /// Keeps a conversation on the node that served it while that node is
    /// healthy (its prompt cache is warm).
    pub session: Option<String>,
}

impl Request {
    /// A JSON POST to `path`; model and stream flag are read from `body`.
    pub fn json(path: &str, body: Bytes) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| Error::InvalidRequest(format!("body is not JSON: {e}")))?;
        let model = v.get("model").and_then(|m| m.as_str()).map(str::to_owned);
        let flavor = if path.starts_with("/api/") {
            ApiFlavor::Ollama
        } else if path.starts_with(InferenceRoute::AnthropicMessages.path()) {
            ApiFlavor::Anthropic
        } else if path.starts_with(InferenceRoute::OpenAiResponses.path()) {
            ApiFlavor::Responses
        } else {
            ApiFlavor::OpenAi
        };
        // Ollama streams unless told not to; OpenAI only when asked.
        let streaming = match (flavor, v.get("stream").and_then(serde_json::Value::as_bool)) {
            (_, Some(s)) => s,
            (ApiFlavor::Ollama, None) => !path.starts_with(InferenceRoute::OllamaEmbed.path()),
            (_, None) => false,
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(Self {
            method: Method::POST,
            path: path.to_owned(),
            headers,
            body,
            model,
            flavor,
            streaming,
            session: None,
        })
    }

    /// A GET of `path` (a listing: `/v1/models`, `/api/tags`).
    pub fn get(path: &str) -> Self {
        Self {
            method: Method::GET,
            path: path.to_owned(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            model: None,
            flavor: if path.starts_with("/api/") {
                ApiFlavor::Ollama
            } else {
                ApiFlavor::OpenAi
            },
            streaming: false,
            session: None,
        }
    }

    /// The same request in a session (see [`Request::session`]).
    pub fn in_session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }

    fn profile(&self) -> Option<RequestProfile> {
        let model = self.model.as_deref()?;
        let mut p = RequestProfile::new(model, self.flavor);
        p.streaming = self.streaming;
        p.prompt_tokens = RequestProfile::estimate_tokens_from_bytes(self.body.len());
        p.prefix = prompt_chain(&self.body);
        p.session = self
            .session
            .as_deref()
            .map(|s| SessionKey::of(s.as_bytes()));
        // As on a node's face: `x-pair-node-pin: UUID` tries that node
        // first while it is eligible.
        p.pinned = self
            .headers
            .get(pair_link::header::PIN_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        Some(p)
    }
}

/// The prompt's chain as a node's face builds it: the bytes of the
/// prompt's fields as the client wrote them, in engine order
/// ([`pair_core::prompt::PROMPT_FIELDS`]), so the SDK's ranking sees what
/// each node's engine has cached of it, as the nodes' own does.
fn prompt_chain(body: &[u8]) -> PromptChain {
    let Ok(fields) = serde_json::from_slice::<HashMap<String, &serde_json::value::RawValue>>(body)
    else {
        return PromptChain::EMPTY;
    };
    let mut chain = ChainBuilder::new();
    for names in pair_core::prompt::PROMPT_FIELDS {
        if let Some(value) = names.iter().find_map(|n| fields.get(*n)) {
            chain.bytes(value.get().as_bytes());
        }
    }
    chain.finish()
}

/// `req` and its profile for the target of the alias its model takes, if
/// no node holds that model and some node's alias covers it (as a node's
/// face applies aliases); else as they are.
fn aliased(
    view: &View,
    mut req: Request,
    mut profile: RequestProfile,
) -> Result<(Request, RequestProfile)> {
    if view.holds(&profile.model, profile.flavor) {
        return Ok((req, profile));
    }
    // No node of its own: every node's aliases, in id order.
    let Some(target) = view
        .cluster
        .alias_for(&profile.model, NodeId::from_u128(0))
        .map(|a| a.target.as_str().to_owned())
    else {
        return Ok((req, profile));
    };
    // Put in as a node's face puts it: the rest of the body byte for byte.
    let at = pair_translate::model::span(&req.body).ok_or_else(|| {
        Error::InvalidRequest("body has no single top-level \"model\" string".to_owned())
    })?;
    req.body = pair_translate::model::splice(&req.body, at, &target);
    req.model = Some(target.clone());
    profile.model = target;
    Ok((req, profile))
}

/// How long a join waits for every node of the cluster to let the new
/// client in (the nodes it did not join through pin it from the vouching
/// in the next reports).
const JOIN_SETTLE: Duration = Duration::from_secs(5);

/// Counters, for `pair-client probe` and for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Probe rounds run (the whole cluster probed).
    pub rounds: u64,
    /// Single nodes probed again after they failed a request.
    pub reprobes: u64,
}

/// A probe round's result, for display.
#[derive(Clone, Debug)]
pub struct Survey {
    /// Every node that answered, best first for `model` when one was
    /// given (by id otherwise), with the scheduler's reason.
    pub nodes: Vec<(NodeView, Option<String>)>,
    pub failures: Vec<ProbeFailure>,
    /// How old the ranking is (zero: just probed).
    pub age: Duration,
}

/// An edge client of a pair cluster. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: Config,
    identity: Arc<Identity>,
    trust: TrustStore,
    prober: Prober,
    view: Mutex<Option<Arc<View>>>,
    /// One probe round at a time.
    probing: tokio::sync::Mutex<()>,
    links: Mutex<HashMap<NodeId, PeerLink>>,
    sched: Mutex<Sched>,
    /// This client's process, as the nodes name it in their reports
    /// (drawn at open): with a reservation's sequence number it says
    /// which reservation a request is.
    epoch: u64,
    rounds: AtomicU64,
    reprobes: AtomicU64,
    /// Nodes that refused this client's certificate on their last probe
    /// (up, but it is not, or no longer, paired with them).
    refused: Mutex<std::collections::BTreeSet<NodeId>>,
    /// A background probe round is running.
    refreshing: std::sync::atomic::AtomicBool,
    discovery: tokio::sync::Mutex<Option<Discovery>>,
    discovered: Option<tokio::sync::watch::Receiver<pair_discovery::PeerSet>>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.identity.id())
            .field("state_dir", &self.cfg.state_dir)
            .finish_non_exhaustive()
    }
}

struct Sched {
    scheduler: Scheduler,
    reservations: Reservations,
    ranking: Ranking,
    rng: SmallRng,
}

impl Client {
    /// Opens the client's state (its identity is made on first use) and
    /// starts browsing when mDNS is on. Nothing is probed yet.
    pub async fn open(cfg: Config) -> Result<Self> {
        pair_identity::install_crypto_provider();
        let dir = &cfg.state_dir;
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            what: format!("cannot create state directory {}", dir.display()),
            source,
        })?;
        let identity = Arc::new(Identity::load_or_create(dir, Role::Client)?);
        let trust = TrustStore::open(TrustStore::default_path(dir))?;
        let prober = Prober {
            tls: crate::probe::connector(&identity, &trust)?,
            trust: trust.clone(),
            connect_timeout: cfg.connect_timeout,
            probe_timeout: cfg.probe_timeout,
        };
        let stop = CancellationToken::new();
        let discovery = match cfg.mdns {
            Mdns::Off => None,
            Mdns::Loopback { .. } | Mdns::Lan => {
                let interfaces = match cfg.mdns {
                    Mdns::Lan => pair_discovery::Interfaces::AllExceptVirtual,
                    _ => pair_discovery::Interfaces::LoopbackOnly,
                };
                let mut d = pair_discovery::DiscoveryConfig::new(
                    identity.id(),
                    cfg.name.clone(),
                    0,
                    interfaces,
                );
                d.advertise = false;
                if let Mdns::Loopback { port } = cfg.mdns {
                    d.mdns_port = port;
                }
                match Discovery::start(d, stop.clone()).await {
                    Ok(d) => Some(d),
                    Err(e) => {
                        tracing::warn!(error = %e, "mDNS browse unavailable; using seeds and the cache");
                        None
                    }
                }
            }
        };
        let discovered = discovery.as_ref().map(Discovery::peers);
        let view = View::load(&cfg.cache_path()).map(Arc::new);
        let epoch = rand::random::<u64>();
        let sched = Sched {
            scheduler: Scheduler::new(SchedulerConfig::new(cfg.policy)),
            reservations: {
                let mut r = Reservations::new();
                r.set_origin(identity.id(), epoch);
                r
            },
            ranking: Ranking::new(),
            rng: SmallRng::from_rng(&mut rand::rng()),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                identity,
                trust,
                prober,
                view: Mutex::new(view),
                probing: tokio::sync::Mutex::new(()),
                links: Mutex::new(HashMap::new()),
                sched: Mutex::new(sched),
                epoch,
                rounds: AtomicU64::new(0),
                reprobes: AtomicU64::new(0),
                refreshing: std::sync::atomic::AtomicBool::new(false),
                refused: Mutex::new(std::collections::BTreeSet::new()),
                discovery: tokio::sync::Mutex::new(discovery),
                discovered,
                stop,
                tasks: TaskTracker::new(),
            }),
        })
    }

    /// A builder over [`Config`]'s defaults, state in `state_dir`.
    pub fn builder(state_dir: impl Into<std::path::PathBuf>) -> crate::config::ClientBuilder {
        crate::config::ClientBuilder::new(state_dir)
    }

    /// This client's id (what the nodes list it as).
    pub fn id(&self) -> NodeId {
        self.inner.identity.id()
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    pub fn stats(&self) -> Stats {
        Stats {
            rounds: self.inner.rounds.load(Ordering::Relaxed),
            reprobes: self.inner.reprobes.load(Ordering::Relaxed),
        }
    }

    /// The nodes this client has pinned.
    pub fn pinned_nodes(&self) -> Vec<PeerRecord> {
        self.inner
            .trust
            .peers()
            .into_iter()
            .filter(|r| r.role == Role::Node)
            .collect()
    }

    /// Pairs this client with the node at `addr` (`host:port` of its
    /// cluster port) with the PIN its owner got from `pair-node pair
    /// invite`, then pins the rest of the cluster through it.
    pub async fn join(&self, addr: &str, pin: &str) -> Result<PeerRecord> {
        let pin: pair_identity::Pin = pin
            .parse()
            .map_err(|e| Error::InvalidRequest(format!("PIN: {e}")))?;
        let record = pair_identity::join(
            addr,
            &pin,
            &self.inner.identity,
            &self.inner.trust,
            &self.inner.cfg.name,
        )
        .await?;
        if let Some(sa) = pair_identity::PeerAddr::parse(addr)
            .ok()
            .and_then(|a| a.socket_addr())
        {
            self.remember(record.id, sa);
        } else if let Ok(mut found) = tokio::net::lookup_host(addr).await
            && let Some(sa) = found.next()
        {
            self.remember(record.id, sa);
        }
        if let Some(sa) = self.known_addr(record.id) {
            self.learn_members(record.id, sa).await;
        }
        // The other nodes pin this client once the one it joined vouches
        // for it in a report (a report interval or two): the join ends
        // when every member answers a probe (or after JOIN_SETTLE), so the
        // first `probe` after it lists the whole cluster.
        let until = Instant::now() + JOIN_SETTLE;
        loop {
            match self.refresh().await {
                Ok(round) if round.failures.is_empty() => break,
                _ if Instant::now() >= until => break,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        // Where the cluster is, for the next process.
        if let Some(v) = self.current_view()
            && let Err(e) = v.save(&self.inner.cfg.cache_path())
        {
            tracing::warn!(error = %e, "cannot save the cluster's addresses");
        }
        Ok(record)
    }

    /// Shuts down the background work (re-probes, mDNS) and waits for it.
    pub async fn close(&self) {
        self.inner.stop.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        if let Some(d) = self.inner.discovery.lock().await.take() {
            d.shutdown().await;
        }
    }

    // ---- the ranking ------------------------------------------------------

    /// The current view. One older than the cache TTL is still used while
    /// a probe round refreshes it in the background; with none to use (or
    /// one from a clock set back), the round runs inline.
    async fn view(&self) -> Result<Arc<View>> {
        let cached = self.current_view();
        match cached {
            Some(v) if v.is_fresh(self.inner.cfg.cache_ttl) && !v.nodes.is_empty() => Ok(v),
            Some(v) if !v.nodes.is_empty() && !v.stale_file() => {
                self.refresh_in_background();
                Ok(v)
            }
            _ => {
                self.refresh().await?;
                self.current_view().ok_or_else(|| Error::NoNodes {
                    detail: "no probe round completed".into(),
                })
            }
        }
    }

    /// Starts a probe round unless one is running; requests go on with the
    /// ranking they have. [`Client::close`] waits for it.
    fn refresh_in_background(&self) {
        if self.inner.stop.is_cancelled() || self.inner.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        self.inner.tasks.spawn(async move {
            if let Err(e) = me.refresh().await {
                tracing::warn!(error = %e, "background probe round failed; keeping the last ranking");
                // Tried: the stale ranking is used until the next TTL.
                if let Ok(mut slot) = me.inner.view.lock()
                    && let Some(v) = slot.as_mut()
                {
                    Arc::make_mut(v).taken_at = Instant::now();
                }
            }
            me.inner.refreshing.store(false, Ordering::Release);
        });
    }

    /// The current view: shared, copied only when it changes.
    fn current_view(&self) -> Option<Arc<View>> {
        self.inner.view.lock().ok().and_then(|v| v.clone())
    }

    /// Probes every candidate now and replaces the ranking. Candidates:
    /// the seeds (each address a name resolves to), what mDNS found, every
    /// address the cache and earlier answers gave, and then the members
    /// the answering nodes list.
    pub async fn refresh(&self) -> Result<Survey> {
        let _one = self.inner.probing.lock().await;
        if let Some(v) = self.current_view()
            && v.is_fresh(self.inner.cfg.cache_ttl)
            && !v.nodes.is_empty()
            && v.age() < Duration::from_millis(50)
        {
            // Another caller's round just ended.
            return Ok(self.survey(&v, None, Vec::new()));
        }
        if self.pinned_nodes().is_empty() {
            return Err(Error::NotPaired {
                state_dir: self.inner.cfg.state_dir.display().to_string(),
            });
        }
        self.inner.rounds.fetch_add(1, Ordering::Relaxed);
        // First the ways in this client was given (seeds, mDNS); then, for
        // nodes not reached that way, every address it learned (the cache,
        // the members the answers list), wave by wave.
        let mut targets = self.entry_points().await;
        if targets.is_empty() {
            targets = self.known_targets(&BTreeMap::new());
        }
        if targets.is_empty() {
            self.wait_for_browse().await;
            targets = self.entry_points().await;
        }
        let mut probed: BTreeMap<NodeId, Probed> = BTreeMap::new();
        let mut failures = Vec::new();
        let mut tried: std::collections::HashSet<(SocketAddr, Option<NodeId>)> =
            std::collections::HashSet::new();
        for _wave in 0..4 {
            targets.retain(|t| tried.insert(*t));
            if targets.is_empty() {
                break;
            }
            for r in self.inner.prober.round(std::mem::take(&mut targets)).await {
                match r {
                    Ok(p) => {
                        if probed.get(&p.id).is_none_or(|have| p.rtt < have.rtt) {
                            probed.insert(p.id, p);
                        }
                    }
                    Err(f) => failures.push(f),
                }
            }
            // Members not pinned yet get their pins from the node that
            // lists them; every member's address is remembered.
            let listed: Vec<(NodeId, SocketAddr, pair_link::edge::Member)> = probed
                .values()
                .flat_map(|p| p.answer.members.iter().map(|m| (p.id, p.addr, m.clone())))
                .collect();
            for (voucher, voucher_addr, m) in listed {
                if self.inner.trust.get(m.id).is_none() {
                    self.learn_members(voucher, voucher_addr).await;
                }
                if let Some(addr) = m.addr {
                    self.remember(m.id, addr);
                }
            }
            targets = self.known_targets(&probed);
        }
        failures.retain(|f| f.expected.is_none_or(|id| !probed.contains_key(&id)));
        let mut known = self
            .current_view()
            .map(|v| v.known.clone())
            .unwrap_or_default();
        let nodes: BTreeMap<NodeId, NodeView> = probed
            .into_values()
            .map(|p| {
                known.insert(p.id, p.addr);
                (p.id, node_view(p))
            })
            .collect();
        if nodes.is_empty() {
            let detail = failures
                .iter()
                .map(|f| format!("{}: {}", f.addr, f.why))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(Error::NoNodes {
                detail: if detail.is_empty() {
                    "no address known: give a seed (--seed HOST:PORT) or turn on mDNS".into()
                } else {
                    detail
                },
            });
        }
        let generation = self.current_view().map_or(0, |v| v.generation());
        let view = View::new(nodes, known, generation);
        if let Err(e) = view.save(&self.inner.cfg.cache_path()) {
            tracing::warn!(error = %e, "cannot save the ranking cache");
        }
        self.sync_reservations(&view);
        let survey = self.survey(&view, None, failures);
        if let Ok(mut slot) = self.inner.view.lock() {
            *slot = Some(Arc::new(view));
        }
        Ok(survey)
    }

    /// The nodes in the order the client would use for `model` (probing
    /// when the ranking is stale), with what failed to answer.
    pub async fn survey_for(&self, model: Option<&str>, force: bool) -> Result<Survey> {
        let failures = if force {
            self.refresh().await?.failures
        } else {
            self.view().await?;
            Vec::new()
        };
        let view = self.current_view().ok_or_else(|| Error::NoNodes {
            detail: "no probe round completed".into(),
        })?;
        Ok(self.survey(&view, model, failures))
    }

    fn survey(&self, view: &View, model: Option<&str>, failures: Vec<ProbeFailure>) -> Survey {
        let mut nodes: Vec<(NodeView, Option<String>)> = Vec::new();
        if let Some(model) = model {
            let mut p = RequestProfile::new(model, ApiFlavor::OpenAi);
            p.streaming = true;
            p.prompt_tokens = 64;
            for (target, reason) in self.rank(view, &p) {
                if let Some(n) = view.nodes.get(&target.node) {
                    nodes.push((n.clone(), Some(reason)));
                }
            }
        } else {
            let mut all: Vec<_> = view.nodes.values().cloned().collect();
            all.sort_by_key(|n| n.rtt_us);
            nodes = all.into_iter().map(|n| (n, None)).collect();
        }
        Survey {
            nodes,
            failures,
            age: view.age(),
        }
    }

    /// The seeds (each address a name resolves to) and what mDNS found.
    async fn entry_points(&self) -> Vec<(SocketAddr, Option<NodeId>)> {
        let mut out: Vec<(SocketAddr, Option<NodeId>)> = Vec::new();
        for seed in &self.inner.cfg.seeds {
            match resolve(seed).await {
                Ok(addrs) => out.extend(addrs.into_iter().map(|a| (a, None))),
                Err(e) => tracing::warn!(seed, error = %e, "seed did not resolve"),
            }
        }
        if let Some(rx) = &self.inner.discovered {
            for p in &rx.borrow().peers {
                if self
                    .inner
                    .trust
                    .get(p.id)
                    .is_some_and(|r| r.role == Role::Node)
                {
                    out.extend(p.socket_addrs().map(|a| (a, Some(p.id))));
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The learned address of every pinned node not in `probed`.
    fn known_targets(
        &self,
        probed: &BTreeMap<NodeId, Probed>,
    ) -> Vec<(SocketAddr, Option<NodeId>)> {
        let Some(v) = self.current_view() else {
            return Vec::new();
        };
        v.known
            .iter()
            .filter(|(id, _)| !probed.contains_key(id))
            .filter(|(id, _)| {
                self.inner
                    .trust
                    .get(**id)
                    .is_some_and(|r| r.role == Role::Node)
            })
            .map(|(id, addr)| (*addr, Some(*id)))
            .collect()
    }

    /// Waits (up to the browse wait) for mDNS to find a pinned node.
    async fn wait_for_browse(&self) {
        let Some(mut rx) = self.inner.discovered.clone() else {
            return;
        };
        // Until a pinned node shows up with an address to dial.
        let _ = tokio::time::timeout(self.inner.cfg.browse_wait, async {
            while self.entry_points().await.is_empty() {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// Pins the nodes `voucher` (reached at `addr`) vouches for.
    async fn learn_members(&self, voucher: NodeId, addr: SocketAddr) {
        let Some(link) = self.link_at(voucher, addr) else {
            return;
        };
        match edge::fetch_members(&link, self.inner.cfg.probe_timeout).await {
            Ok(pins) => {
                let records: Vec<PeerRecord> = pins.iter().map(|p| p.record.clone()).collect();
                if let Err(e) = self
                    .inner
                    .trust
                    .reconcile_vouched(voucher, Role::Node, &records)
                {
                    tracing::warn!(error = %e, "cannot pin the cluster's nodes");
                }
                for p in pins {
                    if let Some(a) = p.addr {
                        self.remember(p.record.id, a);
                    }
                }
            }
            Err(e) => {
                tracing::debug!(node = %voucher, error = %e, "cannot read the cluster's members")
            }
        }
    }

    fn remember(&self, id: NodeId, addr: SocketAddr) {
        if let Ok(mut slot) = self.inner.view.lock() {
            let v = slot.get_or_insert_with(|| {
                let mut v = View::new(BTreeMap::new(), BTreeMap::new(), 0);
                // Nothing probed yet: never fresh.
                v.taken_at = Instant::now()
                    .checked_sub(self.inner.cfg.cache_ttl)
                    .unwrap_or_else(Instant::now);
                Arc::new(v)
            });
            if !v.known.contains_key(&id) {
                Arc::make_mut(v).known.insert(id, addr);
            }
        }
    }

    fn known_addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.current_view().and_then(|v| v.known.get(&id).copied())
    }

    fn sync_reservations(&self, view: &View) {
        if let Ok(mut s) = self.inner.sched.lock() {
            s.reservations.sync(&view.cluster);
        }
    }

    /// The view's nodes for `profile`, best first, with the scheduler's
    /// reason.
    fn rank(&self, view: &View, profile: &RequestProfile) -> Vec<(Target, String)> {
        self.rank_with(view, profile, |c| {
            (pair_scheduler::Candidate::target(c), c.to_string())
        })
    }

    /// The view's nodes for `profile`, best first (what a request tries).
    fn targets(&self, view: &View, profile: &RequestProfile) -> Vec<Target> {
        self.rank_with(view, profile, pair_scheduler::Candidate::target)
    }

    fn rank_with<T>(
        &self,
        view: &View,
        profile: &RequestProfile,
        each: impl Fn(&pair_scheduler::Candidate) -> T,
    ) -> Vec<T> {
        let Ok(mut guard) = self.inner.sched.lock() else {
            return Vec::new();
        };
        let s = &mut *guard;
        s.scheduler.rank_into(
            &mut s.ranking,
            &view.cluster,
            profile,
            &s.reservations,
            unix_ms(),
            &mut s.rng,
        );
        s.ranking.candidates().iter().map(each).collect()
    }

    // ---- links and failures -------------------------------------------

    fn link(&self, id: NodeId) -> Option<PeerLink> {
        let addr = self.current_view().and_then(|v| {
            v.nodes
                .get(&id)
                .map(|n| n.addr)
                .or_else(|| v.known.get(&id).copied())
        })?;
        self.link_at(id, addr)
    }

    /// A pooled mTLS link to node `id` at `addr` (kept while the address
    /// holds).
    fn link_at(&self, id: NodeId, addr: SocketAddr) -> Option<PeerLink> {
        let mut links = self.inner.links.lock().ok()?;
        if let Some(l) = links.get(&id)
            && l.addr() == Some(addr)
        {
            return Some(l.clone());
        }
        let tls = pair_identity::tls::client_config(
            &self.inner.identity,
            &self.inner.trust,
            pair_identity::tls::Expect::Peer(id),
        )
        .ok()?;
        let link = PeerLink::new(
            id,
            addr,
            Arc::new(tls),
            pair_http::Timeouts {
                connect: self.inner.cfg.connect_timeout,
                first_byte: self.inner.cfg.failover.stall_floor,
            },
        )
        .ok()?;
        links.insert(id, link.clone());
        Some(link)
    }

    /// A node failed a request: out of the ranking now, probed again in the
    /// background (not on the request path); back when it answers.
    fn node_failed(&self, id: NodeId) {
        let changed = self
            .inner
            .view
            .lock()
            .ok()
            .and_then(|mut v| {
                v.as_mut()
                    .filter(|v| !v.down.contains(&id))
                    .map(|v| Arc::make_mut(v).mark_down(id))
            })
            .unwrap_or(false);
        if !changed || self.inner.stop.is_cancelled() {
            return;
        }
        if let Ok(mut links) = self.inner.links.lock() {
            links.remove(&id);
        }
        let Some(addr) = self.known_addr(id) else {
            return;
        };
        let me = self.clone();
        self.inner.tasks.spawn(async move {
            // At once, then less often, for as long as the ranking lasts.
            let mut wait = Duration::ZERO;
            let until = Instant::now() + me.inner.cfg.cache_ttl;
            while Instant::now() < until {
                tokio::select! {
                    () = me.inner.stop.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                me.inner.reprobes.fetch_add(1, Ordering::Relaxed);
                let probed = me.inner.prober.probe(addr, Some(id)).await;
                me.set_refused(
                    id,
                    probed.as_ref().err().is_some_and(ProbeFailure::is_refusal),
                );
                if let Ok(p) = probed {
                    let node = node_view(p);
                    if let Ok(mut slot) = me.inner.view.lock()
                        && let Some(v) = slot.as_mut()
                    {
                        let v = Arc::make_mut(v);
                        v.restore(node);
                        if let Err(e) = v.save(&me.inner.cfg.cache_path()) {
                            tracing::debug!(error = %e, "cannot save the ranking cache");
                        }
                    }
                    return;
                }
                wait = (wait * 2).clamp(Duration::from_millis(200), Duration::from_secs(10));
            }
        });
    }

    fn set_refused(&self, id: NodeId, refused: bool) {
        if let Ok(mut r) = self.inner.refused.lock() {
            if refused {
                r.insert(id);
            } else {
                r.remove(&id);
            }
        }
    }

    /// Every node of the last round that holds the model refuses this
    /// client's certificate.
    fn all_owners_refuse(&self, view: &View, profile: &RequestProfile) -> Option<Vec<String>> {
        let refused = self.inner.refused.lock().ok()?;
        let owners: Vec<&NodeView> = view
            .nodes
            .values()
            .filter(|n| {
                n.snapshot
                    .find_model(&profile.model, profile.flavor)
                    .is_some()
            })
            .collect();
        (!owners.is_empty() && owners.iter().all(|n| refused.contains(&n.id)))
            .then(|| owners.iter().map(|n| n.name.clone()).collect())
    }

    /// The links to every node of the current ranking (for `serve`, which
    /// routes through the node's own pipeline over them).
    pub fn links(&self) -> HashMap<NodeId, PeerLink> {
        let ids: Vec<NodeId> = self
            .current_view()
            .map(|v| v.nodes.keys().copied().collect())
            .unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| self.link(id).map(|l| (id, l)))
            .collect()
    }

    /// The ranked cluster as of the current view (probing when stale).
    pub async fn cluster(&self) -> Result<Arc<pair_core::ClusterSnapshot>> {
        Ok(Arc::clone(&self.view().await?.cluster))
    }

    /// The current view without probing.
    pub fn cached_cluster(&self) -> Option<Arc<pair_core::ClusterSnapshot>> {
        self.current_view().map(|v| Arc::clone(&v.cluster))
    }
}

fn node_view(p: Probed) -> NodeView {
    let rtt_us = u32::try_from(p.rtt.as_micros()).unwrap_or(u32::MAX).max(1);
    NodeView {
        id: p.id,
        name: p.answer.node.name.clone(),
        addr: p.addr,
        rtt_us,
        snapshot: p.answer.node,
        models: p.answer.data,
    }
}

/// `host:port`, an IP literal (v6 in brackets, with a zone) or a DNS name
/// that may resolve to several addresses.
async fn resolve(seed: &str) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(a) = pair_identity::PeerAddr::parse(seed)
        && let Some(sa) = a.socket_addr()
    {
        return Ok(vec![sa]);
    }
    let mut v: Vec<SocketAddr> = tokio::net::lookup_host(seed).await?.collect();
    v.sort();
    v.dedup();
    Ok(v)
}

fn unix_ms() -> u64 {
    pair_core::unix_ms(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests;
