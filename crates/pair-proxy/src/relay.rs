//! The serving side of a peer hop, mounted on the cluster port behind mutual
//! TLS: relayed inference runs on this node's own engine (never re-routed,
//! so a request cannot loop), listings answer with this node's own models,
//! and peers push their workload reports and job records here.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, Json, Query, Request, State};
use axum::routing::{any, post};
use http::{HeaderValue, Response, StatusCode, header};
use pair_core::{ApiFlavor, JobRecord, NodeId, NodeSnapshot, Role};

use crate::dispatch::RELAY_PREFIX;
use crate::error::json_error;
use crate::face::{local_listing, read_capped};
use crate::forward::{self, Inference, Plan};
use crate::gossip::PeerReports;
use crate::listing;
use crate::route::{self, RouteClass};
use crate::state::ProxyState;
use pair_http::RequestHead;
use pair_http::h1::Headers;

/// Who is on the other end of an mTLS connection; the cluster server puts it
/// in every request's extensions after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    pub id: NodeId,
    pub role: Role,
    /// Where the connection came from (its port is ephemeral).
    pub remote: SocketAddr,
}

pub const REPORT_PATH: &str = "/pair/v1/report";
pub const JOBS_PATH: &str = "/pair/v1/jobs";

#[derive(Clone)]
struct RelayState {
    st: Arc<ProxyState>,
    reports: Arc<PeerReports>,
}

/// Routes served to authenticated peers.
pub fn router(st: Arc<ProxyState>, reports: Arc<PeerReports>) -> Router {
    Router::new()
        .route(&format!("{RELAY_PREFIX}/{{*path}}"), any(relay))
        .route(REPORT_PATH, post(report))
        .route(JOBS_PATH, post(jobs))
        .with_state(RelayState { st, reports })
}

/// `?port=` names the reporter's cluster port, so a node learns where to
/// reach a peer that paired with it even without multicast.
#[derive(serde::Deserialize)]
struct ReportQuery {
    port: Option<u16>,
}

async fn report(
    State(rs): State<RelayState>,
    Extension(peer): Extension<PeerIdentity>,
    Query(q): Query<ReportQuery>,
    Json(snapshot): Json<NodeSnapshot>,
) -> StatusCode {
    if peer.role != Role::Node || snapshot.id != peer.id {
        // A node reports only for itself; clients never report.
        return StatusCode::FORBIDDEN;
    }
    let addr = q
        .port
        .filter(|p| *p != 0)
        .map(|p| SocketAddr::new(peer.remote.ip(), p));
    rs.reports.accept(snapshot, addr);
    StatusCode::NO_CONTENT
}

async fn jobs(
    State(rs): State<RelayState>,
    Extension(peer): Extension<PeerIdentity>,
    Json(records): Json<Vec<JobRecord>>,
) -> StatusCode {
    if peer.role != Role::Node {
        return StatusCode::FORBIDDEN;
    }
    // Peers only speak for jobs they originated.
    let theirs = records
        .into_iter()
        .take(1_000)
        .filter(|rec| rec.origin == peer.id)
        .collect();
    rs.st.merge_jobs(theirs);
    StatusCode::NO_CONTENT
}

async fn relay(
    State(rs): State<RelayState>,
    Extension(peer): Extension<PeerIdentity>,
    req: Request,
) -> Response<Body> {
    let st = &rs.st;
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
