//! The one request pipeline. Every door (a face's hand-framed connection
//! loop, a connection hyper serves, a request a peer relayed here) reads a
//! request whole into a [`Request`] and calls [`handle`]; from there a
//! request reads top to bottom:
//!
//! 1. The gate (faces only): `Host` and `Origin` ([`crate::gate`]).
//! 2. The route ([`crate::route`]): inference, a listing, the node's own
//!    routes, or passthrough to the local engine.
//! 3. Inference ([`execute`]): the body's routing fields
//!    ([`crate::body`]) make a profile; the plan gives the candidates (the
//!    scheduler's ranking of the cluster, or this node alone for a relayed
//!    request); the failover core ([`pair_scheduler::Failover`]) says where
//!    each attempt goes and when to stop, and this shell only performs the
//!    attempts ([`crate::dispatch`]): a first-byte deadline per attempt, a
//!    2xx committed at its first body byte, nothing resent after it.
//! 4. The answer streams back as it arrives ([`crate::stream`]) with its
//!    route receipt ([`crate::receipt`]); when it ends, the job record and
//!    the metrics ([`crate::job`]).

use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderName, Method, StatusCode, header};
use pair_cluster::PeerIdentity;
use pair_core::{
    ApiFlavor, ClusterSnapshot, JobId, JobStatus, NodeId, RequestProfile, RetryAdvice, SessionKey,
};
use pair_http::h1::Headers;
use pair_http::{Extra, Reply, RequestHead};
use pair_scheduler::{Decision, Failover, FailoverConfig, GiveUp, Outcome, Step};
use serde_json::json;
use smallvec::SmallVec;
use tokio::time::{Instant, Sleep};

use crate::body::{self, RequestFacts};
use crate::dispatch::{self, DispatchError, Hop, LocalEngine, first_data, refresh_inventory};
use crate::error::json_error;
use crate::job::{JobWatcher, millis, new_record};
use crate::listing;
use crate::metrics::FailoverLabels;
use crate::passthrough;
use crate::receipt::{self, Receipt};
use crate::route::{self, Face, RouteClass, Work};
use crate::state::{MAX_ATTEMPTS, ProxyState, Shortlist, now_ms, unix_ms_at};
use crate::stream::{AnswerBody, Framing};

/// A request at any door, read whole (the body is kept for replay).
#[derive(Debug)]
pub struct Request {
    pub method: Method,
    /// The target in origin form (`/path?query`).
    pub target: PathAndQuery,
    /// As they came off the wire, or as a map (a header map is built only
    /// where one is needed).
    pub headers: Headers,
    pub body: Bytes,
    /// When its last byte was read: its time to first byte and duration
    /// count from here.
    pub received: Instant,
}

/// Where a request came in.
#[derive(Clone, Copy, Debug)]
pub enum Door<'a> {
    /// A local face; `app` serves the node's own routes (metrics, the
    /// control API, the Jobs view).
    Face { face: Face, app: Option<&'a Router> },
    /// A paired peer relayed it over mTLS: it runs here and nowhere else.
    Peer(PeerIdentity),
}

/// Serves one request. `deadline` is the connection's timer for each
/// attempt's first-byte deadline (a face lends its own, so a request moves
/// an armed timer forward instead of putting one into the timer wheel).
pub async fn handle(
    st: &Arc<ProxyState>,
    door: Door<'_>,
    req: Request,
    deadline: Pin<&mut Sleep>,
) -> Reply {
    let path = req.target.path();
    if let Door::Face { face, .. } = door
        && let Some(refused) = refused(st, face, &req)
    {
        return refused;
    }
    let class = route::classify(&req.method, path);
    match (class, door) {
        (
            RouteClass::Inference {
                flavor,
                work,
                route,
            },
            door,
        ) => {
            let plan = match door {
                Door::Face { .. } => Plan::Cluster,
                Door::Peer(peer) => {
                    tracing::debug!(peer = %peer.id, route, "running a relayed request");
                    Plan::ThisNode
                }
            };
            let inference = Inference {
                head: RequestHead {
                    method: req.method,
                    path_and_query: req.target,
                    headers: req.headers,
                },
                body: req.body,
                flavor,
                work,
                route,
                received: req.received,
            };
            execute(st, inference, plan, deadline).await
        }
        (RouteClass::Listing(kind), Door::Face { .. }) => listing::cluster(st, kind).await,
        (RouteClass::Listing(kind), Door::Peer(_)) => listing::node(st, kind).await,
        (
            RouteClass::Node,
            Door::Face {
                app: Some(app),
                face,
            },
        ) => node_route(app, face, req).await,
        (RouteClass::Passthrough, Door::Face { face, .. }) => {
            let head = RequestHead {
                method: req.method,
                path_and_query: req.target,
                headers: req.headers,
            };
            passthrough::to_engine(st, face, head, req.body).await
        }
        (RouteClass::Node | RouteClass::Passthrough, door) => {
            let (flavor, why) = match door {
                Door::Face { face, .. } => (face.flavor(), "this route is not served here"),
                Door::Peer(_) => (
                    ApiFlavor::OpenAi,
                    "only inference and listing routes can be relayed between nodes",
                ),
            };
            let (status, code) = match door {
                Door::Face { .. } => (StatusCode::NOT_FOUND, "not_found"),
                Door::Peer(_) => (StatusCode::FORBIDDEN, "not_relayable"),
            };
            json_error(status, flavor, code, why, None).into()
        }
    }
}

/// The 403 for a request the node's [`crate::gate::FaceGate`] refuses (a
/// `Host` that is not this machine, a foreign `Origin` on a control route),
/// in the flavour of the API it called.
#[cold]
#[inline(never)]
fn refused(st: &ProxyState, face: Face, req: &Request) -> Option<Reply> {
    let host = req.headers.get(&header::HOST);
    let origin = req.headers.get(&header::ORIGIN);
    let path = req.target.path();
    let refusal = st.gate.check(path, host, origin).err()?;
    let flavor = match route::classify(&req.method, path) {
        RouteClass::Inference { flavor, .. } => flavor,
        _ => face.flavor(),
    };
    tracing::info!(
        ?refusal,
        path,
        host = %String::from_utf8_lossy(host.unwrap_or_default()),
        origin = %String::from_utf8_lossy(origin.unwrap_or_default()),
        "refused a request on a local face"
    );
    Some(
        json_error(
            StatusCode::FORBIDDEN,
            flavor,
            "forbidden",
            refusal.message(),
            None,
        )
        .into(),
    )
}

/// The node's own routes (metrics, control API, Jobs view): the face's
/// router, with a header map.
async fn node_route(app: &Router, face: Face, req: Request) -> Reply {
    let headers = match req.headers {
        Headers::Map(m) => m,
        Headers::Raw(f) => match f.to_map(0) {
            Ok(h) => h,
            Err(e) => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    face.flavor(),
                    "invalid_request",
                    &e.to_string(),
                    None,
                )
                .into();
            }
        },
    };
    let mut http_req = http::Request::new(Body::from(req.body));
    *http_req.method_mut() = req.method;
    *http_req.uri_mut() = http::Uri::from(req.target);
    *http_req.headers_mut() = headers;
    use tower::ServiceExt;
    match app.clone().oneshot(http_req).await {
        Ok(resp) => resp.into(),
        Err(never) => match never {},
    }
}

/// Asks for a particular node (UUID or name); it goes first if eligible.
pub const PIN_HEADER: HeaderName = HeaderName::from_static("x-pair-node-pin");
/// Names a conversation for session affinity.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("x-pair-session");
/// Asks for the scheduler's reasoning in the receipt (`x-pair-route`).
pub const EXPLAIN_HEADER: HeaderName = HeaderName::from_static("x-pair-explain");

/// One dispatch and how it ended, for receipts and error bodies.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Attempt {
    pub node: NodeId,
    pub name: String,
    /// An HTTP status or a transport class (`connect`, `first-byte-timeout`).
    pub outcome: String,
}

/// An inference request, as the executor needs it.
#[derive(Debug)]
pub struct Inference {
    pub head: RequestHead,
    pub body: Bytes,
    pub flavor: ApiFlavor,
    pub work: Work,
    pub route: &'static str,
    /// When the request was read whole (its time to first byte and
    /// duration count from here).
    pub received: Instant,
}

/// Routes one inference request through the cluster. `deadline` is the
/// timer each attempt's first-byte deadline is set on: a face connection
/// lends its own, so a request moves an armed timer forward instead of
/// putting one into tokio's timer wheel and taking it out again.
pub async fn execute(
    st: &Arc<ProxyState>,
    req: Inference,
    plan: Plan,
    mut deadline: Pin<&mut Sleep>,
) -> Reply {
    let t0 = req.received;
    let created_at_ms = unix_ms_at(t0);
    let facts = match body::extract_off_loop(&req.body, req.flavor, req.work).await {
        Ok(f) => f,
        Err(e) => return invalid_request(st, &req, plan, &e),
    };
    let cluster = st.cluster();
    let mut profile = profile_for(facts, &req, &cluster);
    let (shortlist, nodes) = match plan {
        Plan::Cluster => {
            let shortlist = st.rank(&cluster, &profile, created_at_ms);
            let nodes: Nodes = shortlist.iter().map(|c| c.node).collect();
            (shortlist, nodes)
        }
        Plan::ThisNode => {
            let holds = cluster
                .node(st.node.id)
                .is_some_and(|n| n.find_model(&profile.model, req.flavor).is_some());
            if !holds {
                return model_not_here(st, &req, &profile);
            }
            st.metrics.relayed_in.inc();
            (Shortlist::new(), std::iter::once(st.node.id).collect())
        }
    };
    let mut failover = Failover::new(
        nodes,
        FailoverConfig {
            first_byte: st.timeouts.first_byte,
            // A relayed request's answer goes to its origin as the engine
            // gave it: the origin decides what to retry.
            pass_last_answer: plan == Plan::ThisNode,
            ..FailoverConfig::default()
        },
    );
    let job = JobId::from_uuid(uuid::Uuid::new_v4());
    let (node, up, first, guard, reservation) = loop {
        let node = match failover.next_step() {
            Step::Dispatch { node, .. } => node,
            Step::GiveUp(why) => {
                return gave_up(
                    st,
                    &req,
                    plan,
                    &mut profile,
                    job,
                    created_at_ms,
                    &failover,
                    why,
                    &cluster,
                );
            }
        };
        let hop = match hop_for(st, &cluster, node, &profile.model, req.flavor) {
            Ok(h) => h,
            Err(e) => {
                note_failure(
                    st,
                    &mut failover,
                    Outcome::Failed {
                        class: e.class(),
                        advice: e.retry(),
                    },
                );
                continue;
            }
        };
        // The first attempt goes out now; a later one after the failures
        // before it, whose time a workload report may already cover.
        let (sent_ms, sent) = if failover.failed().is_empty() {
            (created_at_ms, t0)
        } else {
            (now_ms(), Instant::now())
        };
        // A local dispatch is counted by its load guard, which ranking
        // reads live for this node (it ignores reservations there); a
        // peer's by a reservation, until the peer's reports show it.
        let (guard, reservation) = if matches!(hop, Hop::Local(_)) {
            let load = st
                .load
                .begin(profile.prompt_tokens, profile.max_output_tokens);
            (Some(load), None)
        } else {
            (None, Some(st.reserve(node, &profile, sent_ms)))
        };
        // The first-byte deadline is per attempt (a hung node must not eat
        // the next candidate's time) and covers the head and the first body
        // byte under one timer.
        deadline.as_mut().reset(sent + st.timeouts.first_byte);
        let head =
            async { dispatch::request(st.local_pool(), &hop, &req.head, req.body.clone())?.await };
        let head = tokio::select! {
            biased;
            r = head => Some(r),
            () = deadline.as_mut() => None,
        };
        let mut up = match head {
            Some(Ok(up)) => up,
            Some(Err(e)) => {
                tracing::debug!(%node, error = %e, "attempt failed");
                note_failure(
                    st,
                    &mut failover,
                    Outcome::Failed {
                        class: e.class(),
                        advice: e.retry(),
                    },
                );
                continue;
            }
            None => {
                note_failure(st, &mut failover, Outcome::TimedOut);
                continue;
            }
        };
        if up.status == StatusCode::NOT_FOUND {
            refresh_inventory(&hop);
        }
        let first = match failover.report(Outcome::Head {
            status: up.status.as_u16(),
        }) {
            Decision::Commit => None,
            Decision::Next => {
                note_failed(st, &failover);
                continue;
            }
            // A 2xx head is not yet a commitment: an engine that dies
            // between head and body is still retried.
            Decision::AwaitFirstByte => {
                let first = tokio::select! {
                    biased;
                    r = first_data(&mut up.body) => Some(r),
                    () = deadline.as_mut() => None,
                };
                let outcome = match &first {
                    Some(Ok(_)) => Outcome::FirstByte,
                    Some(Err(class)) => Outcome::Failed {
                        class,
                        advice: RetryAdvice::BeforeFirstByte,
                    },
                    None => Outcome::TimedOut,
                };
                match failover.report(outcome) {
                    Decision::Commit => first.and_then(Result::ok).flatten(),
                    _ => {
                        note_failed(st, &failover);
                        continue;
                    }
                }
            }
        };
        break (node, up, first, guard, reservation);
    };
    let status = up.status;
    let tries = failover.dispatched();
    let framing = Framing::from_content_type(up.headers.get(&http::header::CONTENT_TYPE));
    if plan == Plan::ThisNode {
        // The origin keeps the record and the receipt.
        let watcher = JobWatcher::load_only(st, guard);
        return Reply {
            status,
            headers: up.headers,
            extra: Extra::new(),
            body: Body::new(AnswerBody::new(
                first, up.body, framing, req.flavor, watcher,
            )),
        };
    }
    // This node's own name is at hand; a peer's is copied out of the
    // snapshot for the metrics and the receipt.
    let peer_name = (node != st.node.id).then(|| name_of(&cluster, node));
    st.bind_session(&profile, node);
    let ttft = t0.elapsed();
    // The profile's last use: its model moves into the record.
    let mut record = new_record(
        job,
        req.flavor,
        req.route,
        &mut profile,
        st.node.id,
        created_at_ms,
    );
    record.ran_on = Some(node);
    record.attempts = u8::try_from(tries).unwrap_or(u8::MAX);
    record.http_status = Some(status.as_u16());
    record.ttft_ms = Some(millis(ttft));
    let slot = st.metrics.route_slot(req.route);
    if let Some(slot) = slot {
        st.metrics.route_at(slot).ttft.observe(ttft.as_secs_f64());
    }
    let explain = req.head.headers.contains(&EXPLAIN_HEADER);
    let why = explain
        .then(|| shortlist.iter().find(|c| c.node == node))
        .flatten()
        .and_then(|c| http::HeaderValue::from_str(&c.to_string()).ok());
    let watcher = JobWatcher {
        st: Arc::clone(st),
        record: Some(record),
        route: req.route,
        slot,
        t0,
        peer_name: peer_name.clone(),
        guard,
        reservation: reservation.and_then(|r| r.keep()),
    };
    let relay = AnswerBody::new(first, up.body, framing, req.flavor, watcher);
    let node_receipt = match &peer_name {
        None => st.receipt_self(),
        Some(name) => crate::state::node_receipt(name, node),
    };
    Reply {
        status,
        headers: up.headers,
        extra: Receipt {
            node: node_receipt,
            attempts: tries,
            policy: st.policy().as_str(),
            job,
            why,
        }
        .into_extra(),
        body: Body::new(relay),
    }
}

// The paths below are taken only when something failed: `#[cold]` keeps
// them out of `execute`'s code.

/// Which nodes a request may run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Any node of the cluster, as the scheduler ranks them (a face's
    /// request).
    Cluster,
    /// This node only, never re-routed (a request a peer relayed here, so
    /// a request cannot loop). The origin keeps the job record and the
    /// receipt, and gets the engine's answer as it is.
    ThisNode,
}

/// A request's candidates, held inline.
type Nodes = SmallVec<[NodeId; MAX_ATTEMPTS]>;

#[cold]
#[inline(never)]
fn invalid_request(st: &ProxyState, req: &Inference, plan: Plan, e: &body::BodyError) -> Reply {
    if plan == Plan::Cluster {
        st.metrics.count_request(req.route, 400, "none");
    }
    json_error(
        StatusCode::BAD_REQUEST,
        req.flavor,
        "invalid_request",
        &e.to_string(),
        None,
    )
    .into()
}

/// A relayed request for a model this node does not hold: the origin's
/// view was stale, and a 404 from an advertised owner sends it on to its
/// next candidate.
#[cold]
#[inline(never)]
fn model_not_here(st: &ProxyState, req: &Inference, profile: &RequestProfile) -> Reply {
    json_error(
        StatusCode::NOT_FOUND,
        req.flavor,
        "model_not_found",
        &format!(
            "model '{}' not found on node {}",
            profile.model, st.node.name
        ),
        None,
    )
    .into()
}

/// The request ends with nothing committed.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn gave_up(
    st: &ProxyState,
    req: &Inference,
    plan: Plan,
    profile: &mut RequestProfile,
    job: JobId,
    created_at_ms: u64,
    failover: &Failover,
    why: GiveUp,
    cluster: &ClusterSnapshot,
) -> Reply {
    let timed_out = match why {
        GiveUp::NoCandidate => return no_eligible_node(st, req, profile, cluster),
        GiveUp::Exhausted { timed_out } => timed_out,
    };
    let status = if timed_out {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::BAD_GATEWAY
    };
    let attempts: Vec<Attempt> = failover
        .failed()
        .iter()
        .map(|a| Attempt {
            node: a.node,
            name: name_of(cluster, a.node),
            outcome: a.outcome.label().into_owned(),
        })
        .collect();
    let model = profile.model.clone();
    if plan == Plan::Cluster {
        st.metrics.count_request(req.route, status.as_u16(), "none");
        let mut record = new_record(
            job,
            req.flavor,
            req.route,
            profile,
            st.node.id,
            created_at_ms,
        );
        record.attempts = u8::try_from(attempts.len()).unwrap_or(u8::MAX);
        record.status = JobStatus::Failed;
        record.http_status = Some(status.as_u16());
        record.duration_ms = Some(millis(req.received.elapsed()));
        record.error = Some("all attempts failed".into());
        st.finish_job(record);
    }
    let tried: Vec<String> = attempts
        .iter()
        .map(|a| format!("{} ({})", a.name, a.outcome))
        .collect();
    let mut resp = json_error(
        status,
        req.flavor,
        "all_attempts_failed",
        &format!(
            "every node that serves '{}' failed before answering: {}",
            model,
            tried.join(", ")
        ),
        Some(json!({ "attempts": attempts, "job": job })),
    );
    resp.headers_mut()
        .insert(receipt::ATTEMPTS, receipt::attempts_value(attempts.len()));
    resp.into()
}

#[cold]
#[inline(never)]
fn no_eligible_node(
    st: &ProxyState,
    req: &Inference,
    profile: &RequestProfile,
    cluster: &ClusterSnapshot,
) -> Reply {
    st.metrics.count_request(req.route, 502, "none");
    json_error(
        StatusCode::BAD_GATEWAY,
        req.flavor,
        "no_eligible_node",
        &format!(
            "no node in the cluster serves model '{}' for this API",
            profile.model
        ),
        Some(json!({ "model": profile.model, "nodes": cluster.len() })),
    )
    .into()
}

/// Reports a failed attempt to the failover core, and counts it.
#[cold]
#[inline(never)]
fn note_failure(st: &ProxyState, failover: &mut Failover, outcome: Outcome) {
    let decision = failover.report(outcome);
    debug_assert_eq!(decision, Decision::Next);
    note_failed(st, failover);
}

/// Counts the attempt the failover core just logged as failed.
#[cold]
#[inline(never)]
fn note_failed(st: &ProxyState, failover: &Failover) {
    if let Some(last) = failover.failed().last() {
        st.metrics
            .failovers
            .get_or_create(&FailoverLabels {
                reason: last.outcome.label().into_owned(),
            })
            .inc();
    }
}

fn profile_for(facts: RequestFacts, req: &Inference, cluster: &ClusterSnapshot) -> RequestProfile {
    let mut p = facts.profile(req.flavor, req.work, req.body.len());
    let headers = &req.head.headers;
    if let Some(v) = headers
        .get(&PIN_HEADER)
        .and_then(|v| std::str::from_utf8(v).ok())
    {
        p.pinned = v.parse::<NodeId>().ok().or_else(|| {
            cluster
                .nodes()
                .iter()
                .find(|n| n.name.eq_ignore_ascii_case(v))
                .map(|n| n.id)
        });
    }
    if let Some(v) = headers.get(&SESSION_HEADER) {
        p.session = Some(SessionKey(fnv1a(v)));
    }
    p
}

/// Stable across processes and versions (unlike std's SipHash keys), so
/// every node maps a session header to the same key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The local engine that holds the model, or the peer's link.
pub(crate) fn hop_for(
    st: &ProxyState,
    cluster: &ClusterSnapshot,
    node: NodeId,
    model: &str,
    flavor: ApiFlavor,
) -> Result<Hop, DispatchError> {
    if node != st.node.id {
        return st
            .peer(node)
            .map(|l| Hop::Peer(Box::new(l)))
            .ok_or(DispatchError::NoLink(node));
    }
    let kind = cluster
        .node(node)
        .and_then(|n| n.find_model(model, flavor))
        .map(|(e, _)| e.kind);
    let engines = st.engines();
    engines
        .iter()
        .find(|e| Some(e.kind) == kind)
        .or_else(|| engines.iter().find(|e| e.kind.serves(flavor)))
        .map(LocalEngine::hop)
        .ok_or(DispatchError::NoLink(node))
}

/// A node's name from the snapshot (its short id if it has left).
fn name_of(cluster: &ClusterSnapshot, node: NodeId) -> String {
    cluster
        .node(node)
        .map_or_else(|| node.short(), |n| n.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
