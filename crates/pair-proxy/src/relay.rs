//! The door for a request a peer relayed here (mounted on the cluster
//! port, behind mutual TLS): inference runs through the same pipeline as a
//! face's, with a this-node-only plan (never re-routed, so a request cannot
//! loop); listings answer with this node's own models.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::routing::any;
use http::{HeaderValue, Response, StatusCode, header};
use pair_cluster::{PeerIdentity, RELAY_PREFIX};
use pair_core::ApiFlavor;

use crate::error::json_error;
use crate::face::{local_listing, read_capped};
use crate::forward::{self, Inference, Plan};
use crate::listing;
use crate::route::{self, RouteClass};
use crate::state::ProxyState;
use pair_http::RequestHead;
use pair_http::h1::Headers;

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
    let st = &st;
    let (parts, body) = req.into_parts();
    let inner = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str())
        .strip_prefix(RELAY_PREFIX)
        .unwrap_or("/")
        .to_owned();
    let path = inner.split('?').next().unwrap_or("/");
    let class = route::classify(&parts.method, path);
    let flavor = match class {
        RouteClass::Inference { flavor, .. } => flavor,
        _ => ApiFlavor::OpenAi,
    };
    let body = match read_capped(body, &parts.headers, st.body_cap, &st.deadlines).await {
        Ok(b) => b,
        Err(resp) => return resp(flavor),
    };
    match class {
        RouteClass::Listing(kind) => {
            let merged = listing::merge(kind, &local_listing(st, kind).await);
            let mut resp = Response::new(Body::from(merged.to_string()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        RouteClass::Inference {
            flavor,
            work,
            route,
        } => {
            let head = RequestHead {
                method: parts.method,
                path_and_query: inner
                    .parse()
                    .unwrap_or_else(|_| http::uri::PathAndQuery::from_static("/")),
                headers: Headers::Map(parts.headers),
            };
            tracing::debug!(peer = %peer.id, route, "running a relayed request");
            let deadline = std::pin::pin!(tokio::time::sleep(st.timeouts.first_byte));
            let req = Inference {
                head,
                body,
                flavor,
                work,
                route,
                received: tokio::time::Instant::now(),
            };
            forward::execute(&Arc::new(Arc::clone(st)), req, Plan::ThisNode, deadline)
                .await
                .into_response()
        }
        RouteClass::Passthrough => json_error(
            StatusCode::FORBIDDEN,
            flavor,
            "not_relayable",
            "only inference and listing routes can be relayed between nodes",
            None,
        ),
    }
}
