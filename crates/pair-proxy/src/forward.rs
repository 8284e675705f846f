//! The failover executor: walks the scheduler's ordered candidates and
//! commits to the first that starts answering.
//!
//! Rules (see ARCHITECTURE.md): a transport error, refused connection,
//! first-byte deadline, 404 from an advertised owner, 408, 429 or 5xx moves
//! to the next candidate, but only before the first response body byte. 400,
//! 422 and other 4xx go back as they are, never retried. At most
//! [`MAX_ATTEMPTS`] dispatches. Once a byte has reached the client there is
//! no resend: a failure ends the stream with an error event.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, StatusCode};
use http_body_util::BodyExt;
use pair_core::{
    ApiFlavor, ClusterSnapshot, JobId, JobRecord, JobStatus, NodeId, RequestProfile, RetryAdvice,
    SessionKey,
};
use pair_scheduler::{Decision, Failover, FailoverConfig, GiveUp, Outcome, ReservationId, Step};
use serde_json::json;
use smallvec::SmallVec;
use tokio::time::{Instant, Sleep};

use crate::body::{self, RequestFacts};
use crate::dispatch::{self, DispatchError, Hop};
use crate::error::json_error;
use crate::metrics::{FailoverLabels, RouteSlot};
use crate::receipt::{self, Receipt};
use crate::route::Work;
use crate::state::{LocalEngine, MAX_ATTEMPTS, ProxyState, Shortlist, now_ms, unix_ms_at};
use crate::stream::{Ending, Framing, Relay, Watcher};
use pair_cluster::LoadGuard;
use pair_http::RequestHead;
use pair_http::{Extra, Reply};

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

/// What the client asked, as the executor needs it.
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

/// The node state as a request's answer holds it until it ends: an `Arc`
/// of one connection's own (or one request's), so taking and dropping one
/// per request writes a reference count only that connection's loop
/// writes, not the node state's own, which every loop would write twice
/// per request (a cache line moving between their cores each time).
pub type StateRef = Arc<Arc<ProxyState>>;

/// Routes one inference request through the cluster. `deadline` is the
/// timer each attempt's first-byte deadline is set on: a face connection
/// lends its own, so a request moves an armed timer forward instead of
/// putting one into tokio's timer wheel and taking it out again.
pub async fn execute(
    st: &StateRef,
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
            body: Body::new(Relay::new(first, up.body, framing, req.flavor, watcher)),
        };
    }
    // This node's own name is at hand; a peer's is copied out of the
    // snapshot for the metrics and the receipt.
    let peer_name = (node != st.node.id).then(|| name_of(&cluster, node));
    st.bind_session(&profile, node);
    let ttft = t0.elapsed();
    // The profile's last use: its model moves into the record.
    let mut record = new_record(job, &req, &mut profile, st.node.id, created_at_ms);
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
    let relay = Relay::new(first, up.body, framing, req.flavor, watcher);
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
        let mut record = new_record(job, req, profile, st.node.id, created_at_ms);
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

/// A job record with what is known before any attempt; the profile's
/// model moves into it (the profile is not read after).
fn new_record(
    id: JobId,
    req: &Inference,
    profile: &mut RequestProfile,
    origin: NodeId,
    created_at_ms: u64,
) -> JobRecord {
    JobRecord {
        id,
        model: std::mem::take(&mut profile.model),
        flavor: req.flavor,
        route: req.route.into(),
        streaming: profile.streaming,
        origin,
        ran_on: None,
        attempts: 0,
        status: JobStatus::Running,
        http_status: None,
        created_at_ms,
        ttft_ms: None,
        duration_ms: None,
        prompt_tokens: Some(profile.prompt_tokens),
        output_tokens: None,
        error: None,
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

/// A local engine answered 404 for a model this node advertised: have its
/// poller re-read the inventory now rather than at the next poll, so the
/// snapshot stops advertising what is gone.
pub(crate) fn refresh_inventory(hop: &Hop) {
    if let Hop::Local(engine) = hop
        && let Some(r) = &engine.refresh
    {
        r.notify_one();
    }
}

/// Reads until the first data frame (trailers-only bodies end the same way).
pub(crate) async fn first_data(body: &mut dispatch::UpBody) -> Result<Option<Bytes>, &'static str> {
    loop {
        match body.frame().await {
            None => return Ok(None),
            Some(Err(_)) => return Err("body"),
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data()
                    && !data.is_empty()
                {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// A node's name from the snapshot (its short id if it has left).
fn name_of(cluster: &ClusterSnapshot, node: NodeId) -> String {
    cluster
        .node(node)
        .map_or_else(|| node.short(), |n| n.name.clone())
}

fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Finishes the job record when the answer ends, however it ends.
struct JobWatcher {
    st: StateRef,
    /// Taken by `finish` (called once).
    record: Option<JobRecord>,
    route: &'static str,
    /// The route's histograms.
    slot: Option<RouteSlot>,
    t0: Instant,
    /// The serving node's name when it is a peer (`None`: this node).
    peer_name: Option<String>,
    guard: Option<LoadGuard>,
    /// Held until the answer's end: the scheduler counts this request on
    /// its node until then (released by `finish`, or on drop).
    reservation: Option<ReservationId>,
}

impl JobWatcher {
    /// A watcher that only keeps a relayed request counted in this node's
    /// workload while it streams (its origin keeps the record).
    fn load_only(st: &StateRef, guard: Option<LoadGuard>) -> Self {
        Self {
            st: Arc::clone(st),
            record: None,
            route: "",
            slot: None,
            t0: Instant::now(),
            peer_name: None,
            guard,
            reservation: None,
        }
    }

    fn release(&mut self) {
        if let Some(id) = self.reservation.take() {
            self.st.release(id);
        }
    }
}

impl Drop for JobWatcher {
    fn drop(&mut self) {
        self.release();
    }
}

impl Watcher for JobWatcher {
    fn progress(&mut self, events: u32) {
        if let Some(g) = self.guard.as_mut() {
            g.progress(events);
        }
    }

    fn finish(&mut self, ending: Ending, events: u32) {
        let elapsed = self.t0.elapsed();
        let Some(mut rec) = self.record.take() else {
            self.guard.take();
            return;
        };
        rec.duration_ms = Some(millis(elapsed));
        rec.output_tokens = (events > 0).then_some(events);
        let ok = rec.http_status.is_some_and(|s| s < 400);
        rec.status = match ending {
            Ending::Completed if ok => JobStatus::Completed,
            Ending::Completed => JobStatus::Failed,
            Ending::Failed { .. } => JobStatus::Failed,
            Ending::Cancelled => JobStatus::Cancelled,
        };
        rec.error = match ending {
            Ending::Failed { class } => Some(class.into()),
            Ending::Cancelled => Some("client went away".into()),
            Ending::Completed if !ok => rec
                .http_status
                .map(|s| format!("engine answered {s}").into()),
            Ending::Completed => None,
        };
        let node_name = self.peer_name.as_deref().unwrap_or(&self.st.node.name);
        self.st
            .metrics
            .count_request(self.route, rec.http_status.unwrap_or(0), node_name);
        if let Some(slot) = self.slot {
            let m = self.st.metrics.route_at(slot);
            m.duration.observe(elapsed.as_secs_f64());
            m.attempts.observe(f64::from(rec.attempts));
        }
        self.guard.take();
        self.release();
        self.st.finish_job(rec);
    }
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
