//! The probe (mounted on the cluster port, behind mutual TLS): what an edge
//! client ranks this node by. The models this node's engines hold, in the
//! OpenAI `/v1/models` shape, each with whether it is warm and the
//! scheduler's predicted wait here now; this node's own report with its
//! live workload; and the members of its cluster with their addresses.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use pair_core::{ApiFlavor, NodeSnapshot, RequestProfile};
use pair_link::edge::{Member, PROBE_PATH, ProbeAnswer, ProbeModel};
use pair_scheduler::{Reserved, predict};

use crate::state::ProxyState;

/// The probe route, for the cluster port's mTLS side.
pub fn router(st: Arc<ProxyState>) -> Router {
    Router::new().route(PROBE_PATH, get(probe)).with_state(st)
}

async fn probe(State(st): State<Arc<ProxyState>>) -> Json<ProbeAnswer> {
    Json(answer(&st))
}

/// The probe answer as of now.
pub fn answer(st: &ProxyState) -> ProbeAnswer {
    let cluster = st.cluster();
    let me = st.node.id;
    let mut node = cluster
        .node(me)
        .cloned()
        .unwrap_or_else(|| NodeSnapshot::new(me, st.node.name.clone()));
    node.workload = st.load.workload(node.slots());
    let links = st.peer_links();
    let members = cluster
        .nodes()
        .iter()
        .filter(|n| n.id != me)
        .map(|n| Member {
            id: n.id,
            name: n.name.clone(),
            addr: links.get(&n.id).and_then(pair_link::PeerLink::addr),
        })
        .collect();
    ProbeAnswer {
        object: "list".into(),
        data: models(&node),
        node,
        members,
    }
}

/// Each model of a healthy engine once (the warm copy when several hold
/// it), with the prediction for a short streamed request.
fn models(node: &NodeSnapshot) -> Vec<ProbeModel> {
    let mut out: Vec<ProbeModel> = Vec::new();
    for engine in node.engines.iter().filter(|e| e.healthy) {
        for entry in &engine.models {
            let mut request = RequestProfile::new(entry.name.as_str(), ApiFlavor::OpenAi);
            request.streaming = true;
            request.prompt_tokens = 64;
            // The node's own workload, read live.
            let p = predict::predict(
                node,
                &node.workload,
                entry,
                &request,
                Reserved::default(),
                0,
            );
            let model = ProbeModel {
                id: entry.name.as_str().to_owned(),
                object: "model".into(),
                created: 0,
                owned_by: node.name.clone(),
                loaded: entry.loaded,
                predicted_ttft_ms: p.total_ms,
                predicted_wait_ms: p.queue_ms,
            };
            match out.iter_mut().find(|m| m.id == model.id) {
                Some(have) if !have.loaded && model.loaded => *have = model,
                Some(_) => {}
                None => out.push(model),
            }
        }
    }
    out
}
