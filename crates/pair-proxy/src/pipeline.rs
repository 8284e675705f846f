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

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Method, StatusCode, header};
use pair_cluster::PeerIdentity;
use pair_core::{ApiFlavor, ClusterSnapshot, JobId, NodeId, RequestProfile, SessionKey};
use pair_http::h1::Headers;
use pair_http::{Extra, Reply, RequestHead};
use pair_identity::keys::KeyRecord;
use pair_scheduler::drive::Driven;
use pair_scheduler::{AnswerKey, Failover, FailoverConfig};
use tokio::time::{Instant, Sleep};

use crate::attempt::{Attempts, Committed, Reach, SlotsFull, holds, refused_everywhere};
pub use crate::attempt::{Inference, Plan};
use crate::body::{self, RequestFacts};
use crate::dispatch::JOB_HEADER;
use crate::error::json_error;
use crate::job::{CacheNote, JobWatcher, PendingJob, millis, new_record};
use crate::listing;
pub use crate::outcome::Attempt;
use crate::outcome::{bad_request, key_refuses_model, model_not_here, name_of, slots_full_here};
use crate::passthrough;
use crate::receipt::Receipt;
use crate::route::{self, Face, RouteClass};
use crate::state::{ProxyState, unix_ms_at};
use crate::stream::{AnswerBody, Framing, OnCut};
use crate::waiting;
pub use pair_link::header::{
    DEADLINE_HEADER, EXPLAIN_HEADER, PIN_HEADER, PRIORITY_HEADER, SESSION_HEADER,
};

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
        (RouteClass::Inference(route), door) => {
            let plan = match door {
                Door::Face { .. } | Door::Lan { .. } => Plan::Cluster,
                Door::Peer(peer) => {
                    tracing::debug!(peer = %peer.id, route = route.path(), "running a relayed request");
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
                flavor: route.flavor(),
                work: route.work(),
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

/// Routes one inference request. `deadline` is the connection's timer,
/// moved forward for each wait and each attempt's stall check. Read top to
/// bottom: what the request is (`prepare`), its failover's rules
/// (`failover_config`), the attempts (`Attempts::run`), and the answer
/// committed (`answer`) or the request given up (`Attempts::gave_up`).
pub async fn execute(
    st: &Arc<ProxyState>,
    req: Inference,
    plan: Plan,
    deadline: Pin<&mut Sleep>,
) -> Reply {
    let Prepared {
        req,
        mut profile,
        first_turn,
        aliased,
        job,
        mut pending,
        client_deadline,
    } = match prepare(st, req, plan).await {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    // Relayed by a node that holds requests at the cluster: taken only
    // into a free slot of this node's engine, read live, or (interactive
    // work, with preemption) into one a batch answer it runs gives up.
    let mut hold = None;
    if let Plan::ThisNode { .. } = plan
        && let Some(sent_as) = req.head.headers.get(&pair_link::FREE_SLOT_HEADER)
    {
        match st.takes_held(
            &profile,
            req.flavor,
            std::str::from_utf8(sent_as)
                .ok()
                .and_then(pair_core::Priority::parse),
        ) {
            Some(held) => hold = held,
            None => {
                pending.take();
                return slots_full_here(st, &req);
            }
        }
    }
    // Batch work interactive work may cut: its cuts counted over every
    // attempt and every wait here.
    let batch = (plan == Plan::Cluster
        && st.waitroom.preempts()
        && profile.priority == pair_core::Priority::Batch)
        .then(|| {
            Arc::new(crate::preempt::Job::new(
                crate::preempt::moves_allowed(st.resume.limit),
                req.received,
            ))
        });
    let mut deadline = deadline;
    let mut queued = None;
    let bound = req.received + client_deadline.unwrap_or(waiting::DEFAULT_WAIT);
    loop {
        let claim;
        (queued, claim) = match wait_for_slot(st, &req, &profile, plan, client_deadline).await {
            Ok(waited) => {
                // A slot it cut free goes first, whatever the view still says.
                profile.pinned = profile.pinned.or(waited.freed);
                hold = hold.or(waited.hold);
                (waited.wait.or(queued), waited.claim)
            }
            Err(full) => return full.refuse(st, &req, &mut pending),
        };
        // Waited at the cluster (not pinned, not to a slot it cut free):
        // peers take it only into a free slot, and if none has one it
        // waits again.
        let free_slot =
            st.waitroom.order().is_some() && plan == Plan::Cluster && profile.pinned.is_none();
        let mut failover = Failover::new(failover_config(st, plan, &req, client_deadline));
        let attempts = Attempts {
            st,
            req: &req,
            profile: &profile,
            job,
            reach: Reach::Plan(plan),
            explain: req.head.headers.contains(&EXPLAIN_HEADER),
            alone_since: Default::default(),
            queued,
            free_slot,
            claim,
            hold: std::sync::Mutex::new(hold.take()),
            batch: batch.clone(),
        };
        match attempts.run(&mut failover, deadline.as_mut()).await {
            Driven::Committed { node, answer: a } => {
                return answer(
                    &attempts,
                    pending,
                    failover.dispatched(),
                    node,
                    a,
                    first_turn,
                    aliased,
                );
            }
            Driven::GaveUp {
                why: pair_scheduler::GiveUp::Exhausted { .. },
                kept: None,
            } if free_slot && refused_everywhere(st, &failover, batch.as_deref()) => {
                if Instant::now() >= bound {
                    return SlotsFull { retry_s: 1 }.refuse(st, &req, &mut pending);
                }
                tracing::debug!(job = %job, "every node tried had its slots full; waiting at the cluster again");
            }
            Driven::GaveUp { why, kept } => {
                return attempts.gave_up(&mut pending, &failover, why, kept);
            }
        }
    }
}

/// Late binding: while every node that could take the request has its
/// slots full, it waits here for one to free ([`crate::waiting`]), until
/// its `x-pair-deadline` or [`waiting::DEFAULT_WAIT`]. Only where the
/// request entered the cluster, and not for a request pinned to a node.
async fn wait_for_slot(
    st: &Arc<ProxyState>,
    req: &Inference,
    profile: &RequestProfile,
    plan: Plan,
    client_deadline: Option<Duration>,
) -> Result<crate::attempt::Waited, SlotsFull> {
    if st.waitroom.order().is_none() || plan != Plan::Cluster || profile.pinned.is_some() {
        return Ok(crate::attempt::Waited::default());
    }
    let bound = req.received + client_deadline.unwrap_or(waiting::DEFAULT_WAIT);
    crate::attempt::wait_at_cluster(st, profile, req.received, bound, |_, _| true, false).await
}

impl SlotsFull {
    /// 503 in the client's shape, with `Retry-After`; the job is recorded
    /// as failed.
    fn refuse(self, st: &ProxyState, req: &Inference, pending: &mut PendingJob) -> Reply {
        let waited = req.received.elapsed();
        let message = format!(
            "every node that serves this model has its slots full, and the request waited {:.1} s at the cluster for one (its x-pair-deadline, or {} s); retry later",
            waited.as_secs_f64(),
            waiting::DEFAULT_WAIT.as_secs()
        );
        st.metrics.count_request(req.route.path(), 503, "none");
        if let Some(mut record) = pending.take() {
            record.waited = Some(pair_core::JobWait {
                ms: millis(waited),
                why: pair_core::WaitReason::ClusterQueue,
            });
            record.status = pair_core::JobStatus::Failed;
            record.http_status = Some(503);
            record.duration_ms = Some(millis(waited));
            record.error = Some("slots full past the wait bound".into());
            st.finish_job(record);
        }
        let mut resp = json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            req.flavor,
            "cluster_full",
            &message,
            None,
        );
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(self.retry_s),
        );
        resp.into()
    }
}

/// An inference request made ready for its attempts: the body's routing
/// fields read, an alias resolved, the scheduler's profile, the job and its
/// record (recorded as cancelled if the client leaves before an answer).
struct Prepared {
    req: Inference,
    profile: RequestProfile,
    /// The conversation a chat's first turn starts (bound to the node that
    /// serves it, not routed by).
    first_turn: Option<SessionKey>,
    /// The model the request named, when it was an alias's.
    aliased: Option<pair_core::ModelName>,
    job: JobId,
    pending: PendingJob,
    client_deadline: Option<Duration>,
}

/// Reads what `req` is and asks for; a reply instead when it is refused (a
/// malformed body or deadline, a model the key may not use, a relayed
/// model this node does not hold).
async fn prepare(st: &Arc<ProxyState>, req: Inference, plan: Plan) -> Result<Prepared, Reply> {
    let mut req = req;
    let mut facts = match body::extract_off_loop(&req.body, req.flavor, req.work).await {
        Ok(f) => f,
        Err(e) => return Err(bad_request(st, &req, plan, &e.to_string())),
    };
    let client_deadline = match deadline_of(&req.head.headers) {
        Ok(d) => d,
        Err(why) => return Err(bad_request(st, &req, plan, &why)),
    };
    let priority = match priority_of(&req.head.headers) {
        Ok(p) => p,
        Err(why) => return Err(bad_request(st, &req, plan, &why)),
    };
    let cluster = st.cluster();
    // A model no node holds may be an alias's (a tool's default name):
    // the request becomes one for its target before anything is ranked.
    // A relayed request was aliased by its origin.
    let alias = match plan {
        Plan::Cluster => cluster.alias_for(&facts.model, st.node.id).cloned(),
        Plan::ThisNode { .. } => None,
    };
    let aliased = alias.as_ref().map(|a| a.target.clone());
    if let Some(target) = &aliased {
        req.body = pair_translate::model::splice(&req.body, facts.model_at, target.as_str());
        facts.model = target.as_str().to_owned();
    }
    if let Some(key) = &req.key
        && !key.allows_model(&facts.model)
    {
        return Err(key_refuses_model(st, &req, key, &facts.model));
    }
    // A chat's conversation, read where the request is routed, for a
    // policy that keeps sessions, when the client names none.
    let conversation = if matches!(plan, Plan::Cluster)
        && st.policy().keeps_sessions()
        && !req.head.headers.contains(&SESSION_HEADER)
        && req.route.is_chat()
    {
        crate::conversation::of_off_loop(&req.body).await
    } else {
        None
    };
    let (mut profile, first_turn) = profile_for(facts, &req, &cluster, conversation);
    st.expect_answer(&mut profile);
    // The request's class: its header's, else its alias's, else its API
    // key's; interactive by default.
    profile.priority = priority
        .or(alias.and_then(|a| a.priority))
        .or(req.key.as_ref().and_then(|k| k.priority))
        .unwrap_or_default();
    if let Plan::ThisNode { .. } = plan {
        // Batch work its sender may have cut here: planned as the sender
        // plans it, which learned how long its answers run.
        if let Some(planned) = req
            .head
            .headers
            .get(&pair_link::CUTTABLE_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u32>().ok())
        {
            profile.priority = pair_core::Priority::Batch;
            profile.expected_output_tokens = Some(planned);
        }
        if !holds(st, &cluster, &profile, req.flavor) {
            return Err(model_not_here(st, &req, &profile));
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
    let mut record = new_record(
        job,
        req.flavor,
        req.route.path(),
        &profile,
        origin,
        st.node.id,
        unix_ms_at(req.received),
    );
    record.key = req.key.as_ref().map(|k| k.name.clone());
    let pending = PendingJob::new(st, record, req.received);
    Ok(Prepared {
        req,
        profile,
        first_turn,
        aliased,
        job,
        pending,
        client_deadline,
    })
}

/// The failover rules for a request of `plan`.
fn failover_config(
    st: &ProxyState,
    plan: Plan,
    req: &Inference,
    client_deadline: Option<Duration>,
) -> FailoverConfig {
    FailoverConfig {
        stall_floor: st.timeouts.first_byte,
        // As long as an engine may go without progress, a request waits
        // for an owner to come back.
        patience: st.timeouts.first_byte,
        deadline: client_deadline,
        // A relayed request is tried once here: its origin drives the
        // retries (and may have other nodes to try), and says whether it
        // has any.
        max_dispatches: match plan {
            Plan::Cluster => pair_scheduler::MAX_DISPATCHES,
            Plan::ThisNode { .. } => 1,
        },
        elsewhere: match plan {
            Plan::Cluster => None,
            Plan::ThisNode { .. } => Some(!req.head.headers.contains(&pair_link::ALONE_HEADER)),
        },
        ..FailoverConfig::default()
    }
}

/// The answer committed to: its job record completed as far as it is known
/// (the rest when the answer ends), the body that streams it back and, for
/// a request this node routed, the route receipt. A relayed request's
/// origin keeps the receipt and the metrics, and learns from the engine's
/// account of its cache; a cut after the first byte aborts the relay, so
/// the origin sees it and tells its client.
fn answer(
    attempts: &Attempts<'_>,
    pending: PendingJob,
    tries: usize,
    node: NodeId,
    committed: Committed,
    first_turn: Option<SessionKey>,
    aliased: Option<pair_core::ModelName>,
) -> Reply {
    let (st, req, profile, job) = (attempts.st, attempts.req, attempts.profile, attempts.job);
    let relayed = matches!(attempts.plan(), Plan::ThisNode { .. });
    let Committed {
        up,
        first,
        guard,
        reservation,
        engine,
        resumed,
        cluster,
        chosen,
        cached,
        leg,
    } = committed;
    // A batch answer that may be cut holds its load in its leg, which a
    // cut releases at once.
    let (guard, reservation, engine) = match &leg {
        Some(leg) => {
            leg.commit(crate::preempt::Held {
                guard,
                reservation,
                engine,
            });
            (None, None, None)
        }
        None => (guard, reservation, engine),
    };
    let status = up.status;
    let framing = Framing::from_content_type(up.headers.get(&http::header::CONTENT_TYPE));
    // A translated answer carries durations pair made, not the engine's.
    let engine_made = !up.headers.contains(&pair_link::header::TRANSLATED_HEADER);
    let ttft = req.received.elapsed();
    let mut record = pending.commit();
    if let Some(record) = record.as_mut() {
        record.ran_on = Some(node);
        record.waited = attempts.waited();
        record.attempts = u8::try_from(tries).unwrap_or(u8::MAX);
        record.http_status = Some(status.as_u16());
        record.ttft_ms = Some(millis(ttft));
    }
    // This node's own name is at hand; a peer's is copied out of the
    // snapshot for the metrics and the receipt.
    let peer_name = (node != st.node.id).then(|| name_of(&cluster, node));
    let slot = if relayed {
        None
    } else {
        st.bind_session(profile.session.or(first_turn), node);
        st.note_routed(&cluster, node, &profile.prefix);
        let slot = st.metrics.route_slot(req.route.path());
        if let Some(slot) = slot {
            st.metrics.route_at(slot).ttft.observe(ttft.as_secs_f64());
        }
        Some(slot)
    };
    let watcher = JobWatcher {
        st: Arc::clone(st),
        record,
        metrics: slot.map(|slot| (req.route.path(), slot)),
        t0: req.received,
        peer_name: peer_name.clone(),
        guard,
        reservation,
        engine,
        resumed: if relayed { None } else { resumed },
        leg,
        answer: (!relayed).then(|| AnswerKey::of(profile)),
        cache: (!relayed && !profile.prefix.is_empty()).then(|| CacheNote {
            node,
            prefix: profile.prefix.clone(),
            estimated: profile.prompt_tokens,
            predicted: cached,
        }),
    };
    let on_cut = if relayed {
        OnCut::Abort
    } else {
        OnCut::ErrorEvent
    };
    let mut body = AnswerBody::new(first, up.body, framing, req.flavor, on_cut, watcher);
    if relayed {
        body = body.served_by_length();
    }
    let body = Body::new(reading(body, engine_made));
    if relayed {
        return Reply {
            status,
            headers: up.headers,
            extra: Extra::new(),
            body,
        };
    }
    let why = chosen.and_then(|c| http::HeaderValue::from_str(&c.to_string()).ok());
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
        body,
    }
}

/// The request's [`PRIORITY_HEADER`], or what is wrong with it.
fn priority_of(headers: &Headers) -> Result<Option<pair_core::Priority>, String> {
    let Some(v) = headers.get(&PRIORITY_HEADER) else {
        return Ok(None);
    };
    std::str::from_utf8(v)
        .ok()
        .and_then(pair_core::Priority::parse)
        .map(Some)
        .ok_or_else(|| {
            format!(
                "x-pair-priority must be interactive or batch (or high, normal, low), not {:?}",
                String::from_utf8_lossy(v)
            )
        })
}

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

/// The answer body, reading the engine's report at its end (of an answer
/// pair translated, only the engine's counts).
fn reading(body: AnswerBody<JobWatcher>, engine_made: bool) -> AnswerBody<JobWatcher> {
    body.reading_report(!engine_made)
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
