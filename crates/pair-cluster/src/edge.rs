//! The node's side of what the cluster port tells those at its edge: the
//! members route, and the clients a peer vouches for, kept pinned here (the
//! wire types, the probe answer and the members list: [`pair_link::edge`]).
//!
//! Pairing is one PIN between two parties. For a requester-only client
//! that would mean one PIN per node, so a node vouches: it lists, over
//! mTLS, the nodes it paired with (to a client it paired, which pins them
//! too) and the clients it paired (to its peers, which let them in). What a
//! voucher stops listing, or a voucher that is unpaired, stops being
//! trusted ([`TrustStore::reconcile_vouched`]); unpairing a client on the
//! node that paired it closes its connections on every node.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, Json, State};
use axum::routing::get;
use pair_core::{NodeId, Role};
use pair_identity::TrustStore;
use pair_link::edge::{MEMBERS_PATH, VouchedPin, fetch_members};
use tokio_util::sync::CancellationToken;

use crate::links::Peers;
use crate::port::PeerIdentity;
use crate::reports::PeerReports;

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

/// Keeps the clients this node's peers vouch for pinned here, until
/// `shutdown`: each peer's report carries a digest of its clients
/// ([`pair_core::NodeSnapshot::vouches`]); when it differs from the one last
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
