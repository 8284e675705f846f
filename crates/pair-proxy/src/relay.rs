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
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use pair_core::{ApiFlavor, JobRecord, NodeId, NodeSnapshot, RetryAdvice, Role};

use crate::body;
use crate::dispatch::{self, Hop, RELAY_PREFIX, RequestHead};
use crate::error::json_error;
use crate::face::{local_listing, read_capped};
use crate::forward::hop_for;
use crate::gossip::PeerReports;
use crate::h1::Headers;
use crate::listing;
use crate::load::LoadGuard;
use crate::route::{self, RouteClass};
use crate::state::ProxyState;
use crate::stream::{Ending, Framing, Relay, Watcher};

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
        RouteClass::Inference { flavor, work, .. } => {
            let head = RequestHead {
                method: parts.method,
                path_and_query: inner
                    .parse()
                    .unwrap_or_else(|_| http::uri::PathAndQuery::from_static("/")),
                headers: Headers::Map(parts.headers),
            };
            run_locally(st, peer, head, body, flavor, work).await
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

async fn run_locally(
    st: &Arc<ProxyState>,
    peer: PeerIdentity,
    head: RequestHead,
    body: Bytes,
    flavor: ApiFlavor,
    work: route::Work,
) -> Response<Body> {
    let facts = match body::extract_off_loop(&body, flavor, work).await {
        Ok(f) => f,
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                flavor,
                "invalid_request",
                &e.to_string(),
                None,
            );
        }
    };
    let cluster = st.cluster();
    let holds = cluster
        .node(st.node.id)
        .is_some_and(|n| n.find_model(&facts.model, flavor).is_some());
    let hop = match hop_for(st, &cluster, st.node.id, &facts.model, flavor) {
        Ok(h @ Hop::Local(_)) if holds => h,
        _ => {
            // The origin's view was stale; a 404 from an advertised owner
            // sends it to its next candidate.
            return json_error(
                StatusCode::NOT_FOUND,
                flavor,
                "model_not_found",
                &format!("model '{}' not found on node {}", facts.model, st.node.name),
                None,
            );
        }
    };
    st.metrics.relayed_in.inc();
    let profile = facts.profile(flavor, work, body.len());
    let guard = st
        .load
        .begin(profile.prompt_tokens, profile.max_output_tokens);
    tracing::debug!(peer = %peer.id, model = %profile.model, "running a relayed request");
    match dispatch::send(st.local_pool(), &hop, &head, body, st.timeouts).await {
        Ok(resp) => {
            if resp.status() == StatusCode::NOT_FOUND {
                crate::forward::refresh_inventory(&hop);
            }
            let (parts, mut incoming) = resp.into_parts();
            // As on the origin: a successful head is not a commitment. An
            // engine that dies before its first byte becomes a 502 the
            // origin retries elsewhere, not a stream that starts with an
            // error event.
            let first = if RetryAdvice::for_status(parts.status.as_u16(), true).is_none() {
                match crate::forward::first_data(&mut incoming).await {
                    Ok(first) => first,
                    Err(class) => {
                        return json_error(
                            StatusCode::BAD_GATEWAY,
                            flavor,
                            "engine_failed",
                            &format!(
                                "node {}'s engine failed before its first byte ({class})",
                                st.node.name
                            ),
                            None,
                        );
                    }
                }
            } else {
                None
            };
            let framing = Framing::from_content_type(
                parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .map(HeaderValue::as_bytes),
            );
            let relay = Relay::new(first, incoming, framing, flavor, LoadWatcher(Some(guard)));
            Response::from_parts(parts, Body::new(relay))
        }
        Err(e) => json_error(
            StatusCode::BAD_GATEWAY,
            flavor,
            "engine_unreachable",
            &format!(
                "node {}'s engine did not answer: {}",
                st.node.name,
                e.detail()
            ),
            None,
        ),
    }
}

/// Keeps a relayed request counted in this node's workload while it streams.
struct LoadWatcher(Option<LoadGuard>);

impl Watcher for LoadWatcher {
    fn progress(&mut self, events: u32) {
        if let Some(g) = self.0.as_mut() {
            g.progress(events);
        }
    }
    fn finish(&mut self, _ending: Ending, _events: u32) {
        self.0.take();
    }
}
