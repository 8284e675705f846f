//! What the cluster port tells those at its edge, on the wire: the probe
//! answer an edge client ranks nodes by, and the members list through
//! which one pairing reaches the whole cluster (the node's side of it is
//! `pair_cluster::edge`).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use pair_core::{NodeId, NodeSnapshot};
use pair_identity::PeerRecord;
use serde::{Deserialize, Serialize};

use crate::PeerLink;

/// The probe: a node's models in the OpenAI `/v1/models` shape, with its
/// load and the cluster's members.
pub const PROBE_PATH: &str = "/pair/v1/probe";
/// The pins a node vouches for.
pub const MEMBERS_PATH: &str = "/pair/v1/members";

/// Largest members answer a node or client reads.
pub const MEMBERS_MAX_BYTES: usize = 1 << 20;

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

/// Reads the pins `link`'s node vouches for.
pub async fn fetch_members(link: &PeerLink, deadline: Duration) -> Result<Vec<VouchedPin>, String> {
    fetch_json(link, MEMBERS_PATH, MEMBERS_MAX_BYTES, deadline).await
}

/// `GET path` on a peer's cluster port over its link, its JSON answer
/// read (at most `max` bytes) within `deadline`.
pub async fn fetch_json<T: serde::de::DeserializeOwned>(
    link: &PeerLink,
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
