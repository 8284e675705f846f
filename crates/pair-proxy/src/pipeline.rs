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
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{HeaderName, Method, StatusCode, header};
use http_body_util::BodyExt;
use pair_cluster::{PeerIdentity, Progress};
use pair_core::{
    ApiFlavor, ClusterSnapshot, JobId, JobStatus, NodeId, RequestProfile, RetryAdvice, SessionKey,
};
use pair_http::h1::Headers;
use pair_http::{Extra, Reply, RequestHead};
use pair_identity::keys::KeyRecord;
use pair_scheduler::{
    Decision, Failover, FailoverConfig, GiveUp, Outcome, ReservationId, Step, Target,
};
use serde_json::json;
use smallvec::SmallVec;
use tokio::time::{Instant, Sleep};

use crate::body::{self, RequestFacts};
use crate::dispatch::{
    self, DispatchError, Hop, JOB_HEADER, LocalEngine, first_data, refresh_inventory,
};
use crate::error::json_error;
use crate::job::{JobWatcher, PendingJob, millis, new_record};
use crate::listing;
use crate::metrics::FailoverLabels;
use crate::passthrough;
use crate::receipt::{self, Receipt};
use crate::resume;
use crate::route::{self, Face, RouteClass, Work};
use crate::state::{MAX_ATTEMPTS, ProxyState, Shortlist, now_ms, unix_ms_at};
use crate::stream::{AnswerBody, Framing, OnCut};
use crate::translate;

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

impl From<pair_http::server::Whole> for Request {
    /// A request the hand-framed loop read: its fields as they came (no
    /// header map is built).
    fn from(req: pair_http::server::Whole) -> Self {
        Self {
            method: req.method,
            target: req.target,
            headers: Headers::Raw(req.headers),
            body: req.body,
            received: req.received,
        }
    }
}

/// Where a request came in.
#[derive(Clone, Copy, Debug)]
pub enum Door<'a> {
    /// A local face; `app` serves the node's own routes (metrics, the
    /// control API, the Jobs view).
    Face { face: Face, app: Option<&'a Router> },
    /// A paired peer relayed it over mTLS: it runs here and nowhere else.
    Peer(PeerIdentity),
    /// The LAN face, with the API key the request came with (checked by
    /// the face's own door: [`crate::lan`]).
    Lan { key: &'a KeyRecord },
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
                Door::Face { .. } | Door::Lan { .. } => Plan::Cluster,
                Door::Peer(peer) => {
                    tracing::debug!(peer = %peer.id, route, "running a relayed request");
                    Plan::ThisNode { origin: peer.id }
                }
            };
            let key = match door {
                Door::Lan { key } => Some(key.clone()),
                _ => None,
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
                key,
            };
            execute(st, inference, plan, deadline).await
        }
        (RouteClass::Listing(kind), Door::Face { .. } | Door::Lan { .. }) => {
            listing::cluster(st, kind).await
        }
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
        (RouteClass::NotServed(flavor), _) => json_error(
            StatusCode::NOT_FOUND,
            flavor,
            "not_found",
            &format!(
                "pair does not serve {} {path} of this API: it serves {}",
                req.method,
                match flavor {
                    ApiFlavor::Anthropic => "POST /v1/messages and /v1/messages/count_tokens",
                    _ => "POST /v1/responses (it keeps no responses to fetch later)",
                }
            ),
            None,
        )
        .into(),
        (RouteClass::Node | RouteClass::Passthrough, door) => {
            let (flavor, why) = match door {
                Door::Face { face, .. } => (face.flavor(), "this route is not served here"),
                Door::Lan { .. } => (
                    crate::lan::flavor_of(&req.method, path),
                    "this route is not served on the LAN face",
                ),
                Door::Peer(_) => (
                    ApiFlavor::OpenAi,
                    "only inference and listing routes can be relayed between nodes",
                ),
            };
            let (status, code) = match door {
                Door::Face { .. } | Door::Lan { .. } => (StatusCode::NOT_FOUND, "not_found"),
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
    let flavor = route::classify(&req.method, path)
        .flavor()
        .unwrap_or_else(|| face.flavor());
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
/// On an answer a node made itself rather than pass on from an engine (a
/// relaying peer's own error): an origin does not hand it to its client as
/// the last answer.
pub const PAIR_MADE: HeaderName = HeaderName::from_static("x-pair-made");
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
    /// The API key it came with (the LAN face).
    pub key: Option<KeyRecord>,
}

/// Routes one inference request. `deadline` is the connection's timer,
/// moved forward for each wait and each attempt's stall check.
pub async fn execute(
    st: &Arc<ProxyState>,
    req: Inference,
    plan: Plan,
    mut deadline: Pin<&mut Sleep>,
) -> Reply {
    let t0 = req.received;
    let created_at_ms = unix_ms_at(t0);
    let mut facts = match body::extract_off_loop(&req.body, req.flavor, req.work).await {
        Ok(f) => f,
        Err(e) => return invalid_request(st, &req, plan, &e),
    };
    let client_deadline = match deadline_of(&req.head.headers) {
        Ok(d) => d,
        Err(why) => return bad_deadline(st, &req, plan, &why),
    };
    let mut cluster = st.cluster();
    // A model no node holds may be an alias's (a tool's default name):
    // the request becomes one for its target before anything is ranked.
    // A relayed request was aliased by its origin.
    let mut req = req;
    let aliased = match plan {
        Plan::Cluster => cluster
            .alias_for(&facts.model, st.node.id)
            .map(|a| a.target.clone()),
        Plan::ThisNode { .. } => None,
    };
    if let Some(target) = &aliased {
        req.body = body::with_model(&req.body, facts.model_at, target.as_str());
        facts.model = target.as_str().to_owned();
    }
    if let Some(key) = &req.key
        && !key.allows_model(&facts.model)
    {
        return key_refuses_model(st, &req, key, &facts.model);
    }
    // A chat's conversation, read where the request is routed, for a
    // policy that keeps sessions, when the client names none.
    let conversation = if matches!(plan, Plan::Cluster)
        && st.policy().keeps_sessions()
        && !req.head.headers.contains(&SESSION_HEADER)
        && crate::route::is_chat(req.route)
    {
        crate::conversation::of_off_loop(&req.body).await
    } else {
        None
    };
    let (mut profile, first_turn) = profile_for(facts, &req, &cluster, conversation);
    if let Plan::ThisNode { .. } = plan {
        if !holds(st, &cluster, &profile, req.flavor) {
            return model_not_here(st, &req, &profile);
        }
        st.metrics.relayed_in.inc();
    }
    // The job: this node's own, or the one its origin named.
    let (job, origin) = match plan {
        Plan::Cluster => (JobId::from_uuid(uuid::Uuid::new_v4()), st.node.id),
        Plan::ThisNode { origin } => (
            req.head
                .headers
                .get(&JOB_HEADER)
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.parse::<uuid::Uuid>().ok())
                .map_or_else(|| JobId::from_uuid(uuid::Uuid::new_v4()), JobId::from_uuid),
            origin,
        ),
    };
    let model = profile.model.clone();
    let mut record = new_record(
        job,
        req.flavor,
        req.route,
        &mut profile,
        origin,
        st.node.id,
        created_at_ms,
    );
    record.key = req.key.as_ref().map(|k| k.name.clone());
    let mut pending = PendingJob::new(st, record, t0);
    profile.model = model;
    let mut failover = Failover::new(FailoverConfig {
        stall_floor: st.timeouts.first_byte,
        // As long as an engine may go without progress, a request waits
        // for an owner to come back.
        patience: st.timeouts.first_byte,
        deadline: client_deadline,
        // A relayed request is tried once here: its origin drives the
        // retries (and may have other nodes to try).
        max_dispatches: match plan {
            Plan::Cluster => pair_scheduler::MAX_DISPATCHES,
            Plan::ThisNode { .. } => 1,
        },
        ..FailoverConfig::default()
    });
    // The last answer a node gave that was not committed: if every attempt
    // fails, the client gets it (an engine's 503 stays a 503).
    let mut held: Option<Held> = None;
    let mut shortlist = Shortlist::new();
    let committed = loop {
        let turn = st.dispatch_turn();
        let now = t0.elapsed();
        let targets = targets(
            st,
            &cluster,
            &profile,
            req.flavor,
            plan,
            &mut shortlist,
            now,
        );
        if targets.is_empty() && failover.dispatched() == 0 {
            if !st.warming_up().is_zero() {
                drop(turn);
                // Just started: the engine's first poll or the peers'
                // first reports may be what is missing.
                deadline
                    .as_mut()
                    .reset(Instant::now() + WARM_UP_POLL.min(st.warming_up()));
                deadline.as_mut().await;
                cluster = st.cluster();
                continue;
            }
            if owned(&cluster, &profile, req.flavor) {
                failover.owners_down();
            }
        }
        let (node, stall_after, counted) = match failover.next_step(now, &targets) {
            Step::Dispatch { node, stall_after } => {
                // Counted before the turn passes: the next request ranked
                // sees this one.
                let counted = count(st, &cluster, &profile, req.flavor, node);
                drop(turn);
                (node, stall_after, counted)
            }
            Step::Wait(d) => {
                drop(turn);
                deadline.as_mut().reset(Instant::now() + d);
                deadline.as_mut().await;
                cluster = st.cluster();
                continue;
            }
            Step::GiveUp(why) => {
                drop(turn);
                return gave_up(
                    st,
                    &req,
                    plan,
                    &profile,
                    job,
                    &mut pending,
                    &failover,
                    why,
                    held,
                    &cluster,
                );
            }
        };
        match attempt(
            st,
            &req,
            &cluster,
            &profile,
            job,
            node,
            stall_after,
            &mut failover,
            deadline.as_mut(),
            plan,
            // A stream this node routed may move after a cut; a relayed
            // one is moved by its origin.
            plan == Plan::Cluster,
            counted,
        )
        .await
        {
            Attempted::Committed(c) => break c,
            Attempted::Failed(answer) => {
                note_failed(st, &failover);
                if answer.is_some() {
                    held = answer;
                }
                cluster = st.cluster();
            }
        }
    };
    let Committed {
        node,
        up,
        first,
        guard,
        reservation,
        engine,
        resumed,
    } = committed;
    let status = up.status;
    let tries = failover.dispatched();
    let framing = Framing::from_content_type(up.headers.get(&http::header::CONTENT_TYPE));
    // A translated answer carries durations pair made, not the engine's.
    let engine_made = !up.headers.contains(&crate::translate::TRANSLATED_HEADER);
    let ttft = t0.elapsed();
    let Some(mut record) = pending.take() else {
        unreachable!("the pending record is taken once")
    };
    record.ran_on = Some(node);
    record.attempts = u8::try_from(tries).unwrap_or(u8::MAX);
    record.http_status = Some(status.as_u16());
    record.ttft_ms = Some(millis(ttft));
    if let Plan::ThisNode { .. } = plan {
        // The origin keeps the receipt and the metrics; a cut after the
        // first byte aborts, so the origin sees it and tells its client.
        let watcher = JobWatcher {
            st: Arc::clone(st),
            record: Some(record),
            metrics: None,
            t0,
            peer_name: None,
            guard,
            reservation,
            engine,
            resumed: None,
        };
        return Reply {
            status,
            headers: up.headers,
            extra: Extra::new(),
            body: Body::new(reading(
                AnswerBody::new(first, up.body, framing, req.flavor, OnCut::Abort, watcher),
                engine_made,
            )),
        };
    }
    // This node's own name is at hand; a peer's is copied out of the
    // snapshot for the metrics and the receipt.
    let peer_name = (node != st.node.id).then(|| name_of(&cluster, node));
    st.bind_session(profile.session.or(first_turn), node);
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
        metrics: Some((req.route, slot)),
        t0,
        peer_name: peer_name.clone(),
        guard,
        reservation,
        engine,
        resumed,
    };
    let body = reading(
        AnswerBody::new(
            first,
            up.body,
            framing,
            req.flavor,
            OnCut::ErrorEvent,
            watcher,
        ),
        engine_made,
    );
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
            model: aliased.and_then(|m| http::HeaderValue::from_str(m.as_str()).ok()),
        }
        .into_extra(),
        body: Body::new(body),
    }
}

/// A stall timer that fires this late means the node itself was stopped.
const FROZEN: Duration = Duration::from_secs(1);
/// How often a request that came in while the node was starting looks
/// again for a node that serves its model.
const WARM_UP_POLL: Duration = Duration::from_millis(100);
/// A whole (non-streamed) answer up to this size is read to its end before
/// its first byte goes to the client, so an answer cut mid-body is retried
/// like any other failure before the first byte; a larger one streams.
const WHOLE_CAP: usize = 8 * 1024 * 1024;
/// Of an answer that was not committed (a 503, say), this much body is
/// kept, in case it is the one the client gets.
const HELD_CAP: usize = 64 * 1024;
/// And it is read for at most this long.
const HELD_READ: Duration = Duration::from_secs(2);

/// The answer an attempt committed to.
struct Committed {
    node: NodeId,
    up: dispatch::Upstream,
    /// What was read of its body before committing (the first frame, or
    /// a whole answer).
    first: Option<Bytes>,
    guard: Option<pair_cluster::LoadGuard>,
    /// The peer's reservation, released when the answer ends.
    reservation: Option<ReservationId>,
    engine: Option<Arc<Progress>>,
    /// Where the answer moved after a cut, when it may move.
    resumed: Option<Arc<resume::ResumeLog>>,
}

/// An answer that was not committed, kept in case it is the last.
struct Held {
    node: NodeId,
    status: StatusCode,
    headers: Headers,
    body: Bytes,
}

enum Attempted {
    Committed(Committed),
    /// The attempt failed (already reported to the failover core), with
    /// the answer the node gave, if it gave one.
    Failed(Option<Held>),
}

/// The request's current candidates, best first.
fn targets(
    st: &ProxyState,
    cluster: &ClusterSnapshot,
    profile: &RequestProfile,
    flavor: ApiFlavor,
    plan: Plan,
    shortlist: &mut Shortlist,
    now: Duration,
) -> SmallVec<[Target; MAX_ATTEMPTS]> {
    match plan {
        Plan::Cluster => {
            let _ = now;
            *shortlist = st.rank(cluster, profile, now_ms());
            shortlist
                .iter()
                .map(pair_scheduler::Candidate::target)
                .collect()
        }
        // This node only, while it holds the model on a healthy engine.
        Plan::ThisNode { .. } => holds(st, cluster, profile, flavor)
            .then_some(Target {
                node: st.node.id,
                predicted: None,
            })
            .into_iter()
            .collect(),
    }
}

/// Whether any node the snapshot holds lists the model, on a healthy
/// engine or not, routable or not: it has owners, down for now.
fn owned(cluster: &ClusterSnapshot, profile: &RequestProfile, flavor: ApiFlavor) -> bool {
    cluster.nodes().iter().flat_map(|n| &n.engines).any(|e| {
        e.kind.serves(flavor)
            && e.models
                .iter()
                .any(|m| m.name.matches(&profile.model, e.kind))
    })
}

/// Whether this node holds the model on a healthy engine.
fn holds(
    st: &ProxyState,
    cluster: &ClusterSnapshot,
    profile: &RequestProfile,
    flavor: ApiFlavor,
) -> bool {
    cluster
        .node(st.node.id)
        .and_then(|n| n.find_model(&profile.model, flavor))
        .is_some_and(|(e, _)| e.healthy)
}

/// One attempt on `node`, reported to the failover core; `resumable`: a
/// stream it commits to may move to another node on a cut
/// ([`crate::resume`]).
#[allow(clippy::too_many_arguments)]
async fn attempt(
    st: &Arc<ProxyState>,
    req: &Inference,
    cluster: &ClusterSnapshot,
    profile: &RequestProfile,
    job: JobId,
    node: NodeId,
    stall_after: Duration,
    failover: &mut Failover,
    mut deadline: Pin<&mut Sleep>,
    plan: Plan,
    resumable: bool,
    counted: Counted<'_>,
) -> Attempted {
    let Counted {
        mut guard,
        reservation,
        prefilled_in,
    } = counted;
    let t0 = req.received;
    let hop = match hop_for(st, cluster, node, &profile.model, req.flavor) {
        Ok(h) => h,
        Err(e) => {
            failover.report(t0.elapsed(), failed(&e));
            return Attempted::Failed(None);
        }
    };
    // An engine that does not speak the client's API gets it translated;
    // a request that cannot be is the client's 400, never retried.
    let peer_engine = match &hop {
        Hop::Peer(_) => cluster
            .node(node)
            .and_then(|n| n.find_model(&profile.model, req.flavor))
            .map(|(e, _)| e.kind),
        Hop::Local(_) => None,
    };
    let translation = match translate::needed(
        &hop,
        req.flavor,
        req.head.path_and_query.path(),
        peer_engine,
    ) {
        None => None,
        Some((route, kind)) => match translate::request(route, kind, &req.head, &req.body) {
            Ok(t) => Some((route, t)),
            Err(e) => {
                let decision = failover.report(
                    t0.elapsed(),
                    Outcome::Head {
                        status: 400,
                        retry_after: None,
                    },
                );
                debug_assert_eq!(decision, Decision::Commit);
                return Attempted::Committed(Committed {
                    node,
                    up: translate::refused(&e, req.flavor),
                    first: None,
                    guard: None,
                    reservation: None,
                    engine: None,
                    resumed: None,
                });
            }
        },
    };
    let sent = Instant::now();
    let watch = match &hop {
        Hop::Local(engine) => Watch::Engine(Arc::clone(&engine.progress)),
        Hop::Peer(_) => Watch::Peer(node),
    };
    let job_header = matches!(plan, Plan::Cluster).then_some(job);
    let (out_head, out_body) = match &translation {
        Some((_, t)) => (&t.head, t.body.clone()),
        None => (&req.head, req.body.clone()),
    };
    let head = async {
        dispatch::request(
            st.local_pool(),
            &hop,
            out_head,
            out_body.clone(),
            job_header,
        )?
        .await
    };
    let head = marking(head, prefilled_in, || {
        if let Some(g) = guard.as_mut() {
            g.prefill_done();
        }
    });
    let until = failover.deadline().map(|d| t0 + d);
    let head = tokio::select! {
        biased;
        r = head => Some(r),
        () = stalled(st, &watch, sent, stall_after, deadline.as_mut()) => None,
        () = past(until) => return past_deadline(failover, t0),
    };
    let mut resumed = None;
    let mut up = match head {
        Some(Ok(mut up)) => {
            let streamed = up.status.is_success()
                && Framing::from_content_type(up.headers.get(&http::header::CONTENT_TYPE))
                    != Framing::Whole;
            if streamed {
                // Silent mid-answer for as long as a hung engine may be:
                // a cut.
                up.body = up.body.watched(st.timeouts.first_byte);
            }
            // A stream from a node this one routed to may move on a cut:
            // below translation, in the engine's own events.
            if resumable
                && st.resume.on()
                && streamed
                && let Some(api) = resume::Api::of(out_head.path_and_query.path())
            {
                let cont = resume::Continuation {
                    st: Arc::clone(st),
                    head: out_head.clone(),
                    body: out_body.clone(),
                    api,
                    work: req.work,
                    route: req.route,
                    profile: profile.clone(),
                    job,
                    began_on: node,
                    log: Arc::default(),
                    send: send_continuation,
                };
                resumed = Some(Arc::clone(&cont.log));
                up.body = dispatch::UpBody::Translated(dispatch::BoxedBody(Box::pin(
                    resume::Resuming::new(up.body, cont),
                )));
            }
            match translation {
                Some((route, t)) => translate::answer(up, t.answer, route, &t.dropped, t0),
                None => up,
            }
        }
        Some(Err(e)) => {
            tracing::debug!(%node, error = %e, "attempt failed");
            failover.report(t0.elapsed(), failed(&e));
            return Attempted::Failed(None);
        }
        None => return stall(failover, &watch, t0),
    };
    watch.touch();
    if up.status == StatusCode::NOT_FOUND {
        refresh_inventory(&hop);
    }
    let retry_after = up
        .headers
        .get(&http::header::RETRY_AFTER)
        .and_then(|v| dispatch::retry_after(v, std::time::SystemTime::now()));
    let decision = failover.report(
        t0.elapsed(),
        Outcome::Head {
            status: up.status.as_u16(),
            retry_after,
        },
    );
    let first = match decision {
        Decision::Commit => None,
        // An answer the engine gave is kept in case it is the last; one a
        // relaying peer made itself (it had nothing from its engine) is not.
        Decision::Next if up.headers.contains(&PAIR_MADE) => return Attempted::Failed(None),
        Decision::Next => return Attempted::Failed(Some(hold(node, up).await)),
        // A 2xx head is not yet a commitment: the first byte to the client
        // is. Streams commit at their first frame; a whole answer is read
        // to its end first (up to a cap), so one cut mid-body is retried.
        Decision::AwaitFirstByte => {
            let whole = Framing::from_content_type(up.headers.get(&http::header::CONTENT_TYPE))
                == Framing::Whole;
            let read = async {
                if whole {
                    read_whole(&mut up.body, &watch).await
                } else {
                    first_data(&mut up.body).await
                }
            };
            let first = tokio::select! {
                biased;
                r = read => Some(r),
                () = stalled(st, &watch, Instant::now(), stall_after, deadline.as_mut()) => None,
                () = past(until) => return past_deadline(failover, t0),
            };
            let outcome = match &first {
                Some(Ok(_)) => Outcome::FirstByte,
                Some(Err(class)) => Outcome::Failed {
                    class,
                    advice: RetryAdvice::BeforeFirstByte,
                    transient: false,
                },
                None => return stall(failover, &watch, t0),
            };
            match failover.report(t0.elapsed(), outcome) {
                Decision::Commit => first.and_then(Result::ok).flatten(),
                _ => return Attempted::Failed(None),
            }
        }
    };
    let engine = match &hop {
        Hop::Local(engine) => Some(Arc::clone(&engine.progress)),
        Hop::Peer(_) => None,
    };
    Attempted::Committed(Committed {
        node,
        up,
        first,
        guard,
        reservation: reservation.and_then(|r| r.keep()),
        engine,
        resumed,
    })
}

/// [`continue_on`] as [`resume::Send`].
fn send_continuation(
    cont: Arc<resume::Continuation>,
    head: RequestHead,
    body: Bytes,
    dead: SmallVec<[NodeId; 3]>,
) -> Pin<Box<dyn Future<Output = Option<resume::Moved>> + Send>> {
    Box::pin(async move { continue_on(&cont, head, body, &dead).await })
}

/// Sends a cut stream's continuation to the best owner of its model that
/// the stream was not cut on, as any request is sent (the same attempts,
/// stall allowance and failover); its answer, committed at its first
/// byte, or `None` when no owner takes it.
pub(crate) async fn continue_on(
    cont: &resume::Continuation,
    head: RequestHead,
    body: Bytes,
    dead: &[NodeId],
) -> Option<resume::Moved> {
    let st = &cont.st;
    let req = Inference {
        head,
        body,
        flavor: cont.api.flavor(),
        work: cont.work,
        route: cont.route,
        received: Instant::now(),
        key: None,
    };
    let mut failover = Failover::new(FailoverConfig {
        stall_floor: st.timeouts.first_byte,
        patience: st.timeouts.first_byte,
        ..FailoverConfig::default()
    });
    let deadline = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(deadline);
    loop {
        let turn = st.dispatch_turn();
        let cluster = st.cluster();
        let targets: SmallVec<[Target; MAX_ATTEMPTS]> = st
            .rank(&cluster, &cont.profile, now_ms())
            .iter()
            .filter(|c| !dead.contains(&c.node))
            .filter(|c| resume::continues(&cluster, c.node, &cont.profile.model, cont.api))
            .map(pair_scheduler::Candidate::target)
            .collect();
        match failover.next_step(req.received.elapsed(), &targets) {
            Step::Dispatch { node, stall_after } => {
                let counted = count(st, &cluster, &cont.profile, req.flavor, node);
                drop(turn);
                let attempted = attempt(
                    st,
                    &req,
                    &cluster,
                    &cont.profile,
                    cont.job,
                    node,
                    stall_after,
                    &mut failover,
                    deadline.as_mut(),
                    Plan::Cluster,
                    false,
                    counted,
                )
                .await;
                match attempted {
                    Attempted::Committed(c) if c.up.status.is_success() => {
                        return Some(resume::Moved {
                            node,
                            first: c.first,
                            body: c.up.body,
                            holding: Box::new(Holding {
                                st: Arc::clone(st),
                                guard: c.guard,
                                reservation: c.reservation,
                            }),
                        });
                    }
                    Attempted::Committed(c) => {
                        tracing::info!(%node, status = %c.up.status, "a continuation was refused");
                        return None;
                    }
                    Attempted::Failed(_) => note_failed(st, &failover),
                }
            }
            Step::Wait(d) => {
                drop(turn);
                deadline.as_mut().reset(Instant::now() + d);
                deadline.as_mut().await;
            }
            Step::GiveUp(_) => {
                drop(turn);
                return None;
            }
        }
    }
}

/// What a continuation's attempt holds until the answer ends: its load on
/// this node's engine, or its reservation on a peer.
struct Holding {
    st: Arc<ProxyState>,
    guard: Option<pair_cluster::LoadGuard>,
    reservation: Option<ReservationId>,
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.guard.take();
        if let Some(id) = self.reservation.take() {
            self.st.release(id);
        }
    }
}

/// A dispatch counted on its node: a local one by its load guard, which
/// ranking reads live for this node (it ignores reservations there); a
/// peer's by a reservation, until the peer's reports show it.
struct Counted<'a> {
    guard: Option<pair_cluster::LoadGuard>,
    reservation: Option<crate::state::Reservation<'a>>,
    /// A whole answer from this node's engine shows no first token: its
    /// prompt stops counting as prefill work once the prediction (from the
    /// work ahead of it) says its first token is due, as a streamed one's
    /// does when the token comes.
    prefilled_in: Option<Duration>,
}

/// Counts a dispatch to `node` (taken while the dispatch turn is held).
fn count<'a>(
    st: &'a ProxyState,
    cluster: &ClusterSnapshot,
    profile: &RequestProfile,
    flavor: ApiFlavor,
    node: NodeId,
) -> Counted<'a> {
    if node == st.node.id {
        Counted {
            prefilled_in: (!profile.streaming)
                .then(|| st.first_token_eta(cluster, profile, flavor))
                .flatten(),
            guard: Some(
                st.load
                    .begin(profile.prompt_tokens, profile.max_output_tokens),
            ),
            reservation: None,
        }
    } else {
        Counted {
            guard: None,
            reservation: Some(st.reserve(node, profile, now_ms())),
            prefilled_in: None,
        }
    }
}

/// What shows that an attempt's node is getting anywhere.
enum Watch {
    /// A local engine: anything it sends, on any request.
    Engine(Arc<Progress>),
    /// A peer: that it stays in routing (reporting, answering its probes);
    /// it watches its own engine.
    Peer(NodeId),
}

impl Watch {
    fn touch(&self) {
        if let Watch::Engine(p) = self {
            p.touch();
        }
    }
}

/// Runs `fut`, calling `mark` once if it is still pending `after` (never
/// without one).
async fn marking<T>(
    fut: impl Future<Output = T>,
    after: Option<Duration>,
    mark: impl FnOnce(),
) -> T {
    let Some(after) = after else {
        return fut.await;
    };
    tokio::pin!(fut);
    tokio::select! {
        biased;
        r = &mut fut => return r,
        () = tokio::time::sleep(after) => mark(),
    }
    fut.await
}

/// Resolves when the attempt's node has shown no progress for
/// `allowance` (counted from `from` or its last progress, whichever is
/// later).
async fn stalled(
    st: &ProxyState,
    watch: &Watch,
    from: Instant,
    allowance: Duration,
    mut timer: Pin<&mut Sleep>,
) {
    let mut from = from;
    loop {
        let due = from + allowance;
        timer.as_mut().reset(due);
        timer.as_mut().await;
        if due.elapsed() > FROZEN {
            // The timer fired this late: this process was stopped (or the
            // machine suspended), not the engine. Look again shortly,
            // after what came in meanwhile has been read.
            let again = Instant::now() + FROZEN;
            from = again.checked_sub(allowance).unwrap_or(from);
            continue;
        }
        match watch {
            Watch::Engine(p) => {
                let last = p.last();
                if last > from {
                    from = last;
                    continue;
                }
                return;
            }
            Watch::Peer(node) => {
                let alive = st
                    .cluster()
                    .node(*node)
                    .is_some_and(|n| n.liveness.is_routable());
                if !alive {
                    return;
                }
                from = Instant::now();
            }
        }
    }
}

/// The client's bound on a request: `x-pair-deadline: SECONDS` (a
/// positive number, fractions allowed, at most a day).
pub const DEADLINE_HEADER: HeaderName = HeaderName::from_static("x-pair-deadline");

/// The request's [`DEADLINE_HEADER`], or what is wrong with it.
fn deadline_of(headers: &Headers) -> Result<Option<Duration>, String> {
    let Some(v) = headers.get(&DEADLINE_HEADER) else {
        return Ok(None);
    };
    std::str::from_utf8(v)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
        .map(|s| Some(Duration::from_secs_f64(s)))
        .ok_or_else(|| {
            format!(
                "x-pair-deadline must be a number of seconds above 0 and at most 86400, not {:?}",
                String::from_utf8_lossy(v)
            )
        })
}

/// Resolves at `until`; never without one.
async fn past(until: Option<Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Reports an attempt the client's deadline cut (the node is not blamed).
#[cold]
fn past_deadline(failover: &mut Failover, t0: Instant) -> Attempted {
    failover.report(t0.elapsed(), Outcome::PastDeadline);
    Attempted::Failed(None)
}

/// Reports a stalled attempt; a stalled local engine leaves routing.
#[cold]
fn stall(failover: &mut Failover, watch: &Watch, t0: Instant) -> Attempted {
    if let Watch::Engine(p) = watch {
        p.mark_stalled();
    }
    failover.report(t0.elapsed(), Outcome::Stalled);
    Attempted::Failed(None)
}

fn failed(e: &DispatchError) -> Outcome {
    Outcome::Failed {
        class: e.class(),
        advice: e.retry(),
        transient: e.transient(),
    }
}

/// A whole answer's body, read to its end (up to [`WHOLE_CAP`]; past it,
/// what was read, the rest to stream). Every frame is progress.
async fn read_whole(
    body: &mut dispatch::UpBody,
    watch: &Watch,
) -> Result<Option<Bytes>, &'static str> {
    let mut got = BytesMut::new();
    loop {
        match body.frame().await {
            None => return Ok((!got.is_empty()).then(|| got.freeze())),
            Some(Err(_)) => return Err("body"),
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    watch.touch();
                    got.extend_from_slice(&data);
                    if got.len() >= WHOLE_CAP {
                        return Ok(Some(got.freeze()));
                    }
                }
            }
        }
    }
}

/// Keeps an answer that was not committed (its status, headers and up to
/// [`HELD_CAP`] of its body) in case it is the last.
#[cold]
async fn hold(node: NodeId, mut up: dispatch::Upstream) -> Held {
    let read = async {
        let mut got = BytesMut::new();
        while got.len() < HELD_CAP {
            match up.body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        got.extend_from_slice(&d);
                    }
                }
                _ => break,
            }
        }
        got.truncate(HELD_CAP);
        got.freeze()
    };
    let body = tokio::time::timeout(HELD_READ, read)
        .await
        .unwrap_or_default();
    Held {
        node,
        status: up.status,
        headers: up.headers,
        body,
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
    /// a request cannot loop). The origin keeps the receipt, and gets the
    /// engine's answer as it is; both record the job.
    ThisNode { origin: NodeId },
}

#[cold]
#[inline(never)]
fn bad_deadline(st: &ProxyState, req: &Inference, plan: Plan, why: &str) -> Reply {
    if plan == Plan::Cluster {
        st.metrics.count_request(req.route, 400, "none");
    }
    json_error(
        StatusCode::BAD_REQUEST,
        req.flavor,
        "invalid_request",
        why,
        None,
    )
    .into()
}

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
    let mut reply: Reply = json_error(
        StatusCode::NOT_FOUND,
        req.flavor,
        "model_not_found",
        &format!(
            "model '{}' not found on node {}",
            profile.model, st.node.name
        ),
        None,
    )
    .into();
    reply
        .extra
        .push((PAIR_MADE, http::HeaderValue::from_static("1")));
    reply
}

/// The request ends with nothing committed: the last answer a node gave,
/// or the proxy's own error naming what each node did.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn gave_up(
    st: &ProxyState,
    req: &Inference,
    plan: Plan,
    profile: &RequestProfile,
    job: JobId,
    pending: &mut PendingJob,
    failover: &Failover,
    why: GiveUp,
    held: Option<Held>,
    cluster: &ClusterSnapshot,
) -> Reply {
    let attempts: Vec<Attempt> = failover
        .failed()
        .iter()
        .map(|a| Attempt {
            node: a.node,
            name: name_of(cluster, a.node),
            outcome: a.outcome.label().into_owned(),
        })
        .collect();
    let kept_engine_answer = held.is_some() && matches!(why, GiveUp::Exhausted { .. });
    let (reply, error): (Reply, &'static str) = match (why, held) {
        (GiveUp::NoCandidate, _) => {
            // Nothing was tried: no job to record.
            pending.take();
            return no_eligible_node(st, req, profile, cluster);
        }
        (GiveUp::Deadline, _) => {
            let d = failover.deadline().unwrap_or_default();
            let tried: Vec<String> = attempts
                .iter()
                .map(|a| format!("{} ({})", a.name, a.outcome))
                .collect();
            let resp = json_error(
                StatusCode::GATEWAY_TIMEOUT,
                req.flavor,
                "deadline_exceeded",
                &format!(
                    "x-pair-deadline of {} s passed before any node answered '{}'{}",
                    d.as_secs_f64(),
                    profile.model,
                    if tried.is_empty() {
                        String::new()
                    } else {
                        format!(" (before that: {})", tried.join(", "))
                    }
                ),
                Some(json!({ "attempts": attempts, "job": job, "deadline_s": d.as_secs_f64() })),
            );
            (resp.into(), "deadline passed")
        }
        (GiveUp::OwnersGone, _) => {
            let mut resp = json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                req.flavor,
                "no_owner_up",
                &format!(
                    "every node that serves '{}' is down (its engine unhealthy or the node out of routing), and none came back within {} s",
                    profile.model,
                    req.received.elapsed().as_secs()
                ),
                Some(json!({ "attempts": attempts })),
            );
            resp.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("5"),
            );
            (resp.into(), "no owner up")
        }
        (GiveUp::Exhausted { .. }, Some(held)) => {
            // The engine's own answer, as it gave it, with the receipt.
            let name = name_of(cluster, held.node);
            let mut reply = Reply {
                status: held.status,
                headers: held.headers,
                extra: Extra::new(),
                body: Body::from(held.body),
            };
            if plan == Plan::Cluster {
                reply.extra = Receipt {
                    node: crate::state::node_receipt(&name, held.node),
                    attempts: failover.dispatched(),
                    policy: st.policy().as_str(),
                    job,
                    why: None,
                    model: None,
                }
                .into_extra();
            }
            (reply, "every attempt failed")
        }
        (GiveUp::Exhausted { stalled }, None) => {
            let status = if stalled {
                StatusCode::GATEWAY_TIMEOUT
            } else {
                StatusCode::BAD_GATEWAY
            };
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
                    profile.model,
                    tried.join(", ")
                ),
                Some(json!({ "attempts": attempts, "job": job })),
            );
            resp.headers_mut()
                .insert(receipt::ATTEMPTS, receipt::attempts_value(attempts.len()));
            (resp.into(), "all attempts failed")
        }
    };
    if plan == Plan::Cluster {
        st.metrics
            .count_request(req.route, reply.status.as_u16(), "none");
    }
    let mut reply = reply;
    if !kept_engine_answer {
        reply
            .extra
            .push((PAIR_MADE, http::HeaderValue::from_static("1")));
    }
    if let Some(mut record) = pending.take() {
        record.attempts = u8::try_from(failover.dispatched()).unwrap_or(u8::MAX);
        record.status = JobStatus::Failed;
        record.http_status = Some(reply.status.as_u16());
        record.duration_ms = Some(millis(req.received.elapsed()));
        record.error = Some(error.into());
        st.finish_job(record);
    }
    reply
}

/// A key limited to some models asked for another: 404, as if the model
/// were not there (the key's holder sees only what it may use).
#[cold]
#[inline(never)]
fn key_refuses_model(st: &ProxyState, req: &Inference, key: &KeyRecord, model: &str) -> Reply {
    st.metrics.count_request(req.route, 404, "none");
    json_error(
        StatusCode::NOT_FOUND,
        req.flavor,
        "model_not_found",
        &format!(
            "model '{model}' not found for API key '{}': it may use {}",
            key.name,
            key.models.join(", ")
        ),
        None,
    )
    .into()
}

#[cold]
#[inline(never)]
fn no_eligible_node(
    st: &ProxyState,
    req: &Inference,
    profile: &RequestProfile,
    cluster: &ClusterSnapshot,
) -> Reply {
    // No node holds it (an owner that is down is waited for): the
    // client's 404, in its own shape, naming what the cluster holds.
    st.metrics.count_request(req.route, 404, "none");
    let models = cluster.model_names();
    json_error(
        StatusCode::NOT_FOUND,
        req.flavor,
        "model_not_found",
        &format!(
            "model '{}' not found: no node in the cluster holds it (nor an alias for it); the cluster holds: {}",
            profile.model,
            if models.is_empty() {
                "no models".to_owned()
            } else {
                models.join(", ")
            }
        ),
        Some(json!({ "model": profile.model, "nodes": cluster.len(), "models": models })),
    )
    .into()
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

/// The answer body, reading the engine's report at its end when the
/// engine made the answer.
fn reading(body: AnswerBody<JobWatcher>, engine_made: bool) -> AnswerBody<JobWatcher> {
    if engine_made {
        body.reading_report()
    } else {
        body
    }
}

/// The scheduler's view of the request, and the conversation a chat's
/// first turn starts (bound to the node that serves it, not routed by).
fn profile_for(
    facts: RequestFacts,
    req: &Inference,
    cluster: &ClusterSnapshot,
    conversation: Option<crate::conversation::Conversation>,
) -> (RequestProfile, Option<SessionKey>) {
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
    let mut first_turn = None;
    if let Some(v) = headers.get(&SESSION_HEADER) {
        p.session = Some(SessionKey::of(v));
    } else if let Some(c) = conversation {
        if c.continues {
            p.session = Some(c.key);
        } else {
            first_turn = Some(c.key);
        }
    }
    (p, first_turn)
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
