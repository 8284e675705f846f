//! API keys held cluster-wide: each node's report carries a digest of
//! the key records it holds ([`NodeSnapshot::keys`]); a peer whose digest
//! differs from this node's is asked for its records (`GET
//! /pair/v1/keys`, nodes only, over mutual TLS) and they are merged
//! ([`KeyStore::merge`]: a revocation wins). So a key made on one node
//! works on every node's LAN face, and a revocation reaches every node
//! within a report interval or two, as the clients' vouching does.
//!
//! [`NodeSnapshot::keys`]: pair_core::NodeSnapshot::keys

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, Json, State};
use axum::routing::get;
use http::StatusCode;
use pair_core::{NodeId, Role};
use pair_identity::keys::{KeyRecord, KeyStore};
use tokio_util::sync::CancellationToken;

use crate::port::PeerIdentity;
use crate::{PeerReports, Peers};

pub const KEYS_PATH: &str = "/pair/v1/keys";

/// Largest key list a node reads from a peer.
const KEYS_MAX_BYTES: usize = 4 << 20;

/// The keys route, for the cluster port's mTLS side.
pub fn router(keys: KeyStore) -> Router {
    Router::new().route(KEYS_PATH, get(list)).with_state(keys)
}

/// Every record this node holds, revoked ones included, to a node; a
/// client has no business with keys.
async fn list(
    State(keys): State<KeyStore>,
    Extension(peer): Extension<PeerIdentity>,
) -> Result<Json<Vec<KeyRecord>>, StatusCode> {
    if peer.role != Role::Node {
        return Err(StatusCode::FORBIDDEN);
    }
    Ok(Json(keys.records()))
}

/// Reads the key records `link`'s node holds.
pub async fn fetch(
    link: &pair_link::PeerLink,
    deadline: Duration,
) -> Result<Vec<KeyRecord>, String> {
    pair_link::edge::fetch_json(link, KEYS_PATH, KEYS_MAX_BYTES, deadline).await
}

/// Keeps this node's keys merged with its peers', until `shutdown`: a peer
/// whose reported digest differs from this node's own, and from the one
/// last merged from it, is read and merged.
pub async fn sync(
    keys: KeyStore,
    reports: Arc<PeerReports>,
    peers: Arc<Peers>,
    shutdown: CancellationToken,
) {
    let mut merged: HashMap<NodeId, u64> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        for (report, _) in reports.ages() {
            let (id, theirs) = (report.id, report.keys);
            if theirs == 0 || theirs == keys.digest() || merged.get(&id) == Some(&theirs) {
                continue;
            }
            let Some(link) = peers.get(id) else { continue };
            match fetch(&link, Duration::from_secs(3)).await {
                Ok(records) => match keys.merge(records) {
                    Ok(changed) => {
                        if changed {
                            tracing::info!(peer = %id, "API keys updated from a peer");
                        }
                        merged.insert(id, theirs);
                    }
                    Err(e) => {
                        tracing::warn!(peer = %id, error = %e, "cannot keep a peer's API keys")
                    }
                },
                Err(e) => {
                    tracing::debug!(peer = %id, error = %e, "cannot read a peer's API keys");
                }
            }
        }
    }
}
