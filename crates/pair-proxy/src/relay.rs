//! The door for a request a peer relayed here (mounted on the cluster
//! port, behind mutual TLS): into the pipeline with [`Door::Peer`], so
//! inference runs on this node only (never re-routed, so a request cannot
//! loop) and listings answer with this node's own models.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::routing::any;
use http::Response;
use http::uri::PathAndQuery;
use pair_cluster::PeerIdentity;
use pair_http::h1::Headers;
use pair_link::RELAY_PREFIX;

use crate::body::read_capped;
use crate::pipeline::{self, Door};
use crate::route;
use crate::state::ProxyState;

/// The relay route, for the cluster port's mTLS side.
pub fn router(st: Arc<ProxyState>) -> Router {
    Router::new()
        .route(&format!("{RELAY_PREFIX}/{{*path}}"), any(relay))
        .with_state(st)
}

async fn relay(
    State(st): State<Arc<ProxyState>>,
    Extension(peer): Extension<PeerIdentity>,
    req: Request,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let target: PathAndQuery = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str())
        .strip_prefix(RELAY_PREFIX)
        .and_then(|inner| inner.parse().ok())
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    // Not budgeted: a paired peer sends a body its origin already holds
    // whole, at link speed.
    let body = match read_capped(body, &parts.headers, st.body_cap, &st.deadlines, None).await {
        Ok(b) => b,
        Err(resp) => {
            let flavor = route::classify(&parts.method, target.path())
                .flavor()
                .unwrap_or(pair_core::ApiFlavor::OpenAi);
            return resp(flavor);
        }
    };
    let req = pipeline::Request {
        method: parts.method,
        target,
        headers: Headers::Map(parts.headers),
        body,
        received: tokio::time::Instant::now(),
    };
    let deadline = std::pin::pin!(tokio::time::sleep(st.timeouts.first_byte));
    pipeline::handle(&st, Door::Peer(peer), req, deadline)
        .await
        .into_response()
}
