//! The local control API on the faces (loopback only, like everything on
//! them): status, peers, jobs, pairing and unpairing for the CLI and the
//! Jobs view.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pair_cluster::{AddrBook, PeerReports};
use pair_core::{NodeId, Role};
use pair_engines::EngineHandle;
use pair_identity::{ControlToken, Identity, PairingService, Pin, TrustStore};
use pair_proxy::state::ProxyState;
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const STATUS: &str = "/_pair/status";
pub const PEERS: &str = "/_pair/peers";
pub const JOBS: &str = "/_pair/jobs";
pub const CLUSTER: &str = "/_pair/cluster";
pub const INVITE: &str = "/_pair/invite";
pub const JOIN: &str = "/_pair/join";
pub const UNPAIR: &str = "/_pair/unpair";
pub const KEYS: &str = "/_pair/keys";
pub const KEYS_REVOKE: &str = "/_pair/keys/revoke";

#[derive(Clone)]
pub struct Control {
    pub st: Arc<ProxyState>,
    pub pairing: PairingService,
    pub identity: Arc<Identity>,
    pub trust: TrustStore,
    pub reports: Arc<PeerReports>,
    pub addrbook: AddrBook,
    pub cluster_addr: SocketAddr,
    pub name: String,
    /// What the calls that change the node must present.
    pub token: ControlToken,
    /// This node's engines, as their pollers last saw them.
    pub engines: Vec<EngineHandle>,
    /// The LAN face's API keys (held cluster-wide).
    pub keys: pair_identity::keys::KeyStore,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("name", &self.name)
            .field("cluster_addr", &self.cluster_addr)
            .finish_non_exhaustive()
    }
}

pub fn router(c: Control) -> Router {
    // The calls that change the node answer only its owner (the token the
    // daemon wrote to the state dir); the read-only ones, which the Jobs
    // view uses from the node's own origin, need none.
    let owner_only = Router::new()
        .route(INVITE, post(invite))
        .route(JOIN, post(join))
        .route(UNPAIR, post(unpair))
        .route(KEYS, post(add_key))
        .route(KEYS_REVOKE, post(revoke_key))
        .route_layer(middleware::from_fn_with_state(c.clone(), owner));
    Router::new()
        .route(STATUS, get(status))
        .route(PEERS, get(peers))
        .route(JOBS, get(jobs))
        .route(CLUSTER, get(cluster))
        .route(KEYS, get(list_keys))
        .route("/ui", get(ui))
        .merge(owner_only)
        .with_state(c)
}

/// Lets a request through only with the owner's token; 401 otherwise,
/// before anything else is looked at (a page learns nothing, not even
/// whether a remote port it names is open).
async fn owner(State(c): State<Control>, req: Request, next: Next) -> Response {
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|v| c.token.authorizes(v.as_bytes()));
    if !authorized {
        tracing::info!(
            path = req.uri().path(),
            "refused a control call without the owner's token"
        );
        let mut resp = err(
            StatusCode::UNAUTHORIZED,
            "this call needs the node owner's token: use the pair-node CLI on this machine (it reads control.token from the state dir)",
        );
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return resp;
    }
    next.run(req).await
}

fn err(status: StatusCode, msg: impl std::fmt::Display) -> Response {
    (status, Json(json!({ "error": msg.to_string() }))).into_response()
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Status {
    pub id: NodeId,
    pub name: String,
    pub policy: String,
    pub cluster_addr: SocketAddr,
    pub fingerprint: String,
    pub paired_peers: usize,
    pub routable_nodes: usize,
    pub in_flight: u32,
    pub served: u64,
    pub jobs_logged: usize,
    pub invite_open: bool,
    #[serde(default)]
    pub engines: Vec<EngineStatus>,
    /// The model aliases in force here: this node's, then its peers'.
    #[serde(default)]
    pub aliases: Vec<AliasRow>,
}

/// One model alias and the node that configured it.
#[derive(Serialize, Deserialize, Debug)]
pub struct AliasRow {
    /// `PATTERN=MODEL`.
    pub alias: String,
    pub node: String,
}

/// One engine of the node, as the node reports it to the cluster (health
/// with stalls counted, slots with learned ones), else as its poller last
/// saw it.
#[derive(Serialize, Deserialize, Debug)]
pub struct EngineStatus {
    /// As `--engine` names it: ollama, lm-studio, openai-compat.
    pub kind: String,
    pub url: String,
    pub healthy: bool,
    /// Requests it runs at once (configured, reported, learned, or 1).
    pub slots: u16,
    pub models: Vec<EngineModel>,
    /// Why the last poll failed, while it is down.
    pub failure: Option<String>,
    pub version: Option<String>,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct EngineModel {
    pub name: String,
    pub loaded: bool,
}

impl EngineStatus {
    fn of(handle: &EngineHandle, reported: Option<&pair_core::EngineSnapshot>) -> Self {
        let r = handle.report();
        let snap = reported.unwrap_or(&r.snapshot);
        Self {
            kind: snap.kind.to_string(),
            url: handle.config().base_url.to_string(),
            healthy: snap.healthy,
            slots: snap.slots,
            models: snap
                .models
                .iter()
                .map(|m| EngineModel {
                    name: m.name.as_str().to_owned(),
                    loaded: m.loaded,
                })
                .collect(),
            failure: r.last_failure.map(|f| format!("{f:?}")),
            version: r.version,
        }
    }
}

async fn status(State(c): State<Control>) -> Json<Status> {
    let cluster = c.st.cluster();
    let own = cluster.node(c.st.node.id);
    Json(Status {
        id: c.st.node.id,
        name: c.name.clone(),
        policy: c.st.policy().to_string(),
        cluster_addr: c.cluster_addr,
        fingerprint: c.identity.fingerprint().grouped(),
        paired_peers: c.trust.peers().len(),
        routable_nodes: cluster
            .nodes()
            .iter()
            .filter(|n| n.liveness.is_routable())
            .count(),
        in_flight: c.st.load.in_flight(),
        served: c.st.load.served(),
        jobs_logged: c.st.jobs.len(),
        invite_open: c.pairing.invite_status(SystemTime::now()).is_some(),
        // The node's own report lists its engines in the pollers' order.
        engines: c
            .engines
            .iter()
            .enumerate()
            .map(|(i, h)| EngineStatus::of(h, own.and_then(|n| n.engines.get(i))))
            .collect(),
        aliases: own
            .into_iter()
            .chain(cluster.nodes().iter().filter(|n| n.id != c.st.node.id))
            .flat_map(|n| {
                n.aliases.iter().map(|a| AliasRow {
                    alias: a.to_string(),
                    node: n.name.clone(),
                })
            })
            .collect(),
    })
}

#[derive(Serialize, Deserialize, Debug)]
pub struct PeerRow {
    pub id: NodeId,
    pub name: String,
    pub role: Role,
    pub fingerprint: String,
    pub paired_at: u64,
    /// The paired node that vouched for this client (`None`: paired here).
    #[serde(default)]
    pub vouched_by: Option<NodeId>,
    /// Cluster address in use, if linked.
    pub addr: Option<String>,
    /// Routing state from the current snapshot (`absent` if not in it).
    pub liveness: String,
    pub models: Vec<String>,
    pub pending: u32,
    pub pressure: u8,
    pub rtt_us: u32,
}

async fn peers(State(c): State<Control>) -> Json<Vec<PeerRow>> {
    let cluster = c.st.cluster();
    let links = c.st.peer_links();
    let rows = c
        .trust
        .peers()
        .into_iter()
        .map(|p| {
            let snap = cluster.node(p.id);
            PeerRow {
                id: p.id,
                name: p.name.clone(),
                role: p.role,
                fingerprint: p.fingerprint.grouped(),
                paired_at: p.paired_at,
                vouched_by: p.vouched_by,
                addr: links
                    .get(&p.id)
                    .and_then(|l| l.base.authority().map(|a| a.to_string())),
                liveness: snap.map_or_else(
                    || "absent".to_owned(),
                    |n| format!("{:?}", n.liveness).to_lowercase(),
                ),
                models: snap
                    .map(|n| {
                        n.engines
                            .iter()
                            .flat_map(|e| e.models.iter().map(|m| m.name.to_string()))
                            .collect()
                    })
                    .unwrap_or_default(),
                pending: snap.map_or(0, |n| n.workload.pending()),
                pressure: snap.map_or(0, |n| n.pressure.band()),
                rtt_us: snap.map_or(0, |n| n.rtt_us),
            }
        })
        .collect();
    Json(rows)
}

#[derive(Deserialize)]
struct JobsQuery {
    limit: Option<usize>,
}

async fn jobs(State(c): State<Control>, Query(q): Query<JobsQuery>) -> impl IntoResponse {
    Json(c.st.jobs.recent(q.limit.unwrap_or(100).min(10_000)))
}

async fn cluster(State(c): State<Control>) -> impl IntoResponse {
    let snap = c.st.cluster();
    Json(json!({
        "self": c.st.node.id,
        "policy": c.st.policy().to_string(),
        "snapshot": &*snap,
    }))
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Invite {
    pub pin: String,
    pub expires_in_s: u64,
    pub cluster_addr: SocketAddr,
}

async fn invite(State(c): State<Control>) -> Response {
    let now = SystemTime::now();
    match c.pairing.open_invite(now) {
        Ok(pin) => {
            let expires_in_s = c
                .pairing
                .invite_status(now)
                .and_then(|s| s.expires_at.duration_since(now).ok())
                .map_or(0, |d| d.as_secs());
            Json(Invite {
                pin: pin.reveal().to_owned(),
                expires_in_s,
                cluster_addr: c.cluster_addr,
            })
            .into_response()
        }
        Err(e) => err(StatusCode::TOO_MANY_REQUESTS, e),
    }
}

#[derive(Serialize, Deserialize, Debug)]
pub struct JoinRequest {
    /// The inviter's cluster address, HOST:PORT.
    pub addr: String,
    pub pin: String,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Joined {
    pub id: NodeId,
    pub name: String,
    pub fingerprint: String,
}

async fn join(State(c): State<Control>, Json(req): Json<JoinRequest>) -> Response {
    let pin = match req.pin.parse::<Pin>() {
        Ok(p) => p,
        Err(e) => return err(StatusCode::BAD_REQUEST, e),
    };
    match pair_identity::join(&req.addr, &pin, &c.identity, &c.trust, &c.name).await {
        Ok(rec) => {
            // An IP literal keeps its zone (`[fe80::1%eth0]:port`), which
            // the system resolver refuses; a host name is resolved.
            let addr = pair_identity::PeerAddr::parse(&req.addr)
                .ok()
                .and_then(|a| a.socket_addr())
                .or_else(|| req.addr.to_socket_addrs().ok().and_then(|mut a| a.next()));
            if let Some(addr) = addr
                && let Ok(mut book) = c.addrbook.lock()
            {
                book.insert(rec.id, addr);
            }
            Json(Joined {
                id: rec.id,
                name: rec.name,
                fingerprint: rec.fingerprint.grouped(),
            })
            .into_response()
        }
        Err(e) => {
            let status = match e.refusal() {
                Some(_) => StatusCode::FORBIDDEN,
                None => StatusCode::BAD_GATEWAY,
            };
            err(status, format!("pairing failed: {e}"))
        }
    }
}

#[derive(Serialize, Deserialize, Debug)]
pub struct UnpairRequest {
    /// Node UUID or name.
    pub node: String,
}

/// A request class, as keys carry it.
pub use pair_core::Priority;

/// `pair-node keys add`'s request.
#[derive(Serialize, Deserialize, Debug)]
pub struct NewKey {
    pub name: String,
    /// Model patterns the key may use (empty: every model).
    #[serde(default)]
    pub models: Vec<String>,
    /// Requests a minute (none: no limit).
    pub rate_per_min: Option<std::num::NonZeroU32>,
    /// The class of its requests that name none (none: interactive).
    #[serde(default)]
    pub priority: Option<pair_core::Priority>,
}

/// A key just made: the secret, shown this once.
#[derive(Serialize, Deserialize, Debug)]
pub struct MadeKey {
    pub secret: String,
    pub key: KeyRow,
}

/// A key as `keys list` shows it (never its secret or hash).
#[derive(Serialize, Deserialize, Debug)]
pub struct KeyRow {
    pub name: String,
    pub id: String,
    pub models: Vec<String>,
    pub rate_per_min: Option<std::num::NonZeroU32>,
    #[serde(default)]
    pub priority: Option<pair_core::Priority>,
    pub created_at_ms: u64,
    pub revoked_at_ms: Option<u64>,
    /// The node that made it.
    pub origin: NodeId,
}

impl From<&pair_identity::keys::KeyRecord> for KeyRow {
    fn from(k: &pair_identity::keys::KeyRecord) -> Self {
        Self {
            name: k.name.clone(),
            id: k.id.to_string(),
            models: k.models.clone(),
            rate_per_min: k.rate_per_min,
            priority: k.priority,
            created_at_ms: k.created_at_ms,
            revoked_at_ms: k.revoked_at_ms,
            origin: k.origin,
        }
    }
}

/// `pair-node keys revoke`'s request.
#[derive(Serialize, Deserialize, Debug)]
pub struct RevokeKey {
    pub name: String,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn add_key(State(c): State<Control>, Json(req): Json<NewKey>) -> Response {
    match c.keys.add(
        &req.name,
        pair_identity::keys::KeyTerms {
            models: req.models,
            rate_per_min: req.rate_per_min,
            priority: req.priority,
        },
        unix_ms(),
        c.st.node.id,
        &mut rand::rng(),
    ) {
        Ok((record, secret)) => Json(MadeKey {
            secret: secret.expose().to_owned(),
            key: KeyRow::from(&record),
        })
        .into_response(),
        Err(e) => err(StatusCode::BAD_REQUEST, e),
    }
}

async fn list_keys(State(c): State<Control>) -> Json<Vec<KeyRow>> {
    let mut rows: Vec<KeyRow> = c.keys.list().iter().map(KeyRow::from).collect();
    rows.extend(c.keys.revoked().iter().map(KeyRow::from));
    Json(rows)
}

async fn revoke_key(State(c): State<Control>, Json(req): Json<RevokeKey>) -> Response {
    match c.keys.revoke(&req.name, unix_ms()) {
        Ok(revoked) => Json(revoked.iter().map(KeyRow::from).collect::<Vec<_>>()).into_response(),
        Err(e) => err(StatusCode::NOT_FOUND, e),
    }
}

async fn unpair(State(c): State<Control>, Json(req): Json<UnpairRequest>) -> Response {
    let id = req.node.parse::<NodeId>().ok().or_else(|| {
        c.trust
            .peers()
            .into_iter()
            .find(|p| p.name.eq_ignore_ascii_case(&req.node))
            .map(|p| p.id)
    });
    let Some(id) = id else {
        return err(
            StatusCode::NOT_FOUND,
            format!("no paired peer named {:?}", req.node),
        );
    };
    match c.trust.remove(id) {
        Ok(Some(rec)) => {
            c.reports.forget(id);
            if let Ok(mut book) = c.addrbook.lock() {
                book.remove(&id);
            }
            let mut answer = json!({ "removed": rec.id, "name": rec.name });
            if let Some(voucher) = rec.vouched_by {
                // Pinned because a peer vouches for it: that peer's next
                // list pins it again unless it is unpaired there.
                answer["note"] = json!(format!(
                    "{} was paired on node {voucher}, which vouches for it to the cluster; unpair it there to revoke it everywhere",
                    rec.name
                ));
            }
            Json(answer).into_response()
        }
        Ok(None) => err(StatusCode::NOT_FOUND, format!("{id} is not paired")),
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn ui() -> Html<&'static str> {
    Html(crate::ui::PAGE)
}
