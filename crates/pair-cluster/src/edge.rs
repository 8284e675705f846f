//! What the cluster port tells those at its edge: the probe answer an edge
//! client ranks nodes by, and the members list through which one pairing
//! reaches the whole cluster.
//!
//! Pairing is one PIN between two parties. For a requester-only client
//! that would mean one PIN per node, so a node vouches: it lists, over
//! mTLS, the nodes it paired with (to a client it paired, which pins them
//! too) and the clients it paired (to its peers, which let them in). What a
//! voucher stops listing, or a voucher that is unpaired, stops being
//! trusted ([`TrustStore::reconcile_vouched`]); unpairing a client on the
//! node that paired it closes its connections on every node.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, Json, State};
use axum::routing::get;
use bytes::Bytes;
use http_body_util::BodyExt;
use pair_core::{NodeId, NodeSnapshot, Role};
use pair_identity::{PeerRecord, TrustStore};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::links::Peers;
use crate::port::PeerIdentity;
use crate::reports::PeerReports;

/// The probe: a node's models in the OpenAI `/v1/models` shape, with its
/// load and the cluster's members.
pub const PROBE_PATH: &str = "/pair/v1/probe";
/// The pins a node vouches for.
pub const MEMBERS_PATH: &str = "/pair/v1/members";

/// Largest members answer a node or client reads.
const MEMBERS_MAX_BYTES: usize = 1 << 20;

/// A node's answer to [`PROBE_PATH`]: `object` and `data` as OpenAI's
/// `/v1/models` (plain tools read them), the node's own report (load,
/// engines, slots, pressure, warm models, learned speeds; what the edge
/// client ranks with) and the members of its cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeAnswer {
    pub object: String,
    pub data: Vec<ProbeModel>,
    pub node: NodeSnapshot,
    pub members: Vec<Member>,
}

/// One model a node holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeModel {
    pub id: String,
    pub object: String,
    pub created: u64,
    /// The node's name.
    pub owned_by: String,
    /// Loaded in memory now (warm).
    pub loaded: bool,
    /// The scheduler's predicted time to first token of a short streamed
    /// request for this model, here, now (queue, load and prefill).
    pub predicted_ttft_ms: u32,
    /// Of that, the time spent waiting for work ahead of it.
    pub predicted_wait_ms: u32,
}

/// A node of the cluster, as one member sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: NodeId,
    pub name: String,
    /// Where its cluster port is, when known.
    pub addr: Option<SocketAddr>,
}

/// One pin a node vouches for, with where to reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VouchedPin {
    pub record: PeerRecord,
    pub addr: Option<SocketAddr>,
}

#[derive(Clone)]
struct Vouch {
    trust: TrustStore,
    peers: Arc<Peers>,
}

/// The members route, for the cluster port's mTLS side.
pub fn router(trust: TrustStore, peers: Arc<Peers>) -> Router {
    Router::new()
        .route(MEMBERS_PATH, get(members))
        .with_state(Vouch { trust, peers })
}

/// A client gets the nodes this node paired with (so it can reach them);
/// a node gets the clients this node paired (so it lets them in). Only
/// pins made here with a PIN are vouched for: vouching does not chain.
async fn members(
    State(v): State<Vouch>,
    Extension(peer): Extension<PeerIdentity>,
) -> Json<Vec<VouchedPin>> {
    let role = match peer.role {
        Role::Client => Role::Node,
        Role::Node => Role::Client,
    };
    let links = v.peers.links();
    Json(
        v.trust
            .peers()
            .into_iter()
            .filter(|r| r.role == role && r.vouched_by.is_none() && r.id != peer.id)
            .map(|record| VouchedPin {
                addr: links.get(&record.id).and_then(|l| l.addr()),
                record,
            })
            .collect(),
    )
}

/// Reads the pins `link`'s node vouches for.
pub async fn fetch_members(
    link: &crate::PeerLink,
    deadline: Duration,
) -> Result<Vec<VouchedPin>, String> {
    fetch_json(link, MEMBERS_PATH, MEMBERS_MAX_BYTES, deadline).await
}

/// `GET path` on a peer's cluster port over its link, its JSON answer
/// read (at most `max` bytes) within `deadline`.
pub(crate) async fn fetch_json<T: serde::de::DeserializeOwned>(
    link: &crate::PeerLink,
    path: &str,
    max: usize,
    deadline: Duration,
) -> Result<T, String> {
    let resp = link
        .call(http::Method::GET, path, Bytes::new(), deadline)
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("{path} answered {}", resp.status()));
    }
    let body = tokio::time::timeout(
        deadline,
        http_body_util::Limited::new(resp.into_body(), max).collect(),
    )
    .await
    .map_err(|_| format!("{path}: answer too slow"))?
    .map_err(|e| e.to_string())?
    .to_bytes();
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

/// Keeps the clients this node's peers vouch for pinned here, until
/// `shutdown`: each peer's report carries a digest of its clients
/// ([`NodeSnapshot::vouches`]); when it differs from the one last
/// synced, the list is fetched again. A peer that is no longer paired
/// vouches for nothing.
pub async fn sync_vouched(
    trust: TrustStore,
    reports: Arc<PeerReports>,
    peers: Arc<Peers>,
    shutdown: CancellationToken,
) {
    let mut synced: HashMap<NodeId, u64> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let pins = trust.snapshot();
        // Vouchers gone: what they vouched for goes with them.
        let gone: Vec<NodeId> = pins
            .values()
            .filter_map(|r| r.vouched_by)
            .filter(|v| pins.get(v).is_none_or(|r| r.role != Role::Node))
            .collect();
        for voucher in gone {
            synced.remove(&voucher);
            if let Err(e) = trust.reconcile_vouched(voucher, Role::Client, &[]) {
                tracing::warn!(%voucher, error = %e, "cannot drop the clients of an unpaired node");
            }
        }
        for (report, _) in reports.ages() {
            let (id, want) = (report.id, report.vouches);
            if synced.get(&id) == Some(&want) || pins.get(&id).is_none_or(|r| r.role != Role::Node)
            {
                continue;
            }
            let listed = if want == 0 {
                Vec::new()
            } else {
                let Some(link) = peers.get(id) else { continue };
                match fetch_members(&link, Duration::from_secs(3)).await {
                    Ok(pins) => pins.into_iter().map(|p| p.record).collect(),
                    Err(e) => {
                        tracing::debug!(peer = %id, error = %e, "cannot read the clients a peer vouches for");
                        continue;
                    }
                }
            };
            match trust.reconcile_vouched(id, Role::Client, &listed) {
                Ok(changed) => {
                    if changed > 0 {
                        tracing::info!(peer = %id, changed, "clients vouched for by a peer updated");
                        // A client two peers vouch for is pinned under one
                        // of them; when that one drops it, the others' lists
                        // must be read again to keep it.
                        synced.clear();
                    }
                    synced.insert(id, want);
                }
                Err(e) => {
                    tracing::warn!(peer = %id, error = %e, "cannot pin the clients a peer vouches for")
                }
            }
        }
    }
}
