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
use pair_scheduler::ReservationId;
use serde_json::json;
use tokio::time::{Instant, Sleep};

use crate::body::{self, RequestFacts};
use crate::dispatch::{self, DispatchError, Hop, RequestHead};
use crate::error::json_error;
use crate::load::LoadGuard;
use crate::metrics::{FailoverLabels, RouteSlot};
use crate::reply::{self, Receipt, Reply};
use crate::route::Work;
use crate::state::{LocalEngine, MAX_ATTEMPTS, ProxyState, now_ms, unix_ms_at};
use crate::stream::{Ending, Framing, Relay, Watcher};

/// Asks for a particular node (UUID or name); it goes first if eligible.
pub const PIN_HEADER: HeaderName = HeaderName::from_static("x-pair-node-pin");
/// Names a conversation for session affinity.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("x-pair-session");
/// Asks for the scheduler's reasoning in the receipt (`x-pair-route`).
pub const EXPLAIN_HEADER: HeaderName = HeaderName::from_static("x-pair-explain");

/// Why one attempt did not commit.
enum AttemptError {
    Dispatch(DispatchError),
    /// A status another node may not share (408, 429, 5xx, 404 from an
    /// advertised owner).
    Status(StatusCode),
    /// The body failed before its first byte.
    Body(&'static str),
}

impl From<DispatchError> for AttemptError {
    fn from(e: DispatchError) -> Self {
        AttemptError::Dispatch(e)
    }
}

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
pub async fn execute(st: &StateRef, req: Inference, mut deadline: Pin<&mut Sleep>) -> Reply {
    let t0 = req.received;
    let created_at_ms = unix_ms_at(t0);
    let facts = match body::extract_off_loop(&req.body, req.flavor, req.work).await {
        Ok(f) => f,
        Err(e) => return invalid_request(st, &req, &e),
    };
    let cluster = st.cluster();
    let mut profile = profile_for(facts, &req, &cluster);
    let ranking = st.rank(&cluster, &profile, created_at_ms);
    if ranking.is_empty() {
        return no_eligible_node(st, &req, &profile, &cluster);
    }

    let job = JobId::from_uuid(uuid::Uuid::new_v4());
    // Failed attempts (the answer's error lists them); none on the usual
    // path, so nothing is allocated for them.
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut deadline_hit = false;
    for cand in ranking.iter().take(MAX_ATTEMPTS) {
        let node = cand.node;
        let hop = match hop_for(st, &cluster, node, &profile.model, req.flavor) {
            Ok(h) => h,
            Err(e) => {
                fail(st, &cluster, &mut attempts, node, e.class());
                continue;
            }
        };
        // The first attempt goes out now; a later one after the failures
        // before it, whose time a workload report may already cover.
        let (sent_ms, sent) = if attempts.is_empty() {
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
        let attempt = async {
            let mut up = dispatch::request(st.local_pool(), &hop, &req.head, req.body.clone())?
                .await
                .map_err(AttemptError::Dispatch)?;
            let advice = RetryAdvice::for_status(up.status.as_u16(), true);
            if advice.is_some_and(RetryAdvice::may_retry) {
                return Err(AttemptError::Status(up.status));
            }
            // Success: wait for the first body byte before committing, so an
            // engine that dies between head and body is still retried.
            let first = if advice.is_none() {
                first_data(&mut up.body).await.map_err(AttemptError::Body)?
            } else {
                None
            };
            Ok((up, first))
        };
        deadline.as_mut().reset(sent + st.timeouts.first_byte);
        let outcome = tokio::select! {
            biased;
            r = attempt => Ok(r),
            () = deadline.as_mut() => Err(()),
        };
        let (up, first) = match outcome {
            Ok(Ok(answer)) => answer,
            // Nothing reached the client: the next candidate.
            Ok(Err(e)) => {
                attempt_failed(st, &cluster, &mut attempts, node, &hop, e);
                continue;
            }
            Err(_) => {
                deadline_hit = true;
                fail(st, &cluster, &mut attempts, node, "first-byte-timeout");
                continue;
            }
        };
        let status = up.status;
        let tries = attempts.len() + 1;
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
        let framing = Framing::from_content_type(up.headers.get(&http::header::CONTENT_TYPE));
        let explain = req.head.headers.contains(&EXPLAIN_HEADER);
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
        return Reply {
            status,
            headers: up.headers,
            receipt: Some(Receipt {
                node: node_receipt,
                attempts: tries,
                policy: st.policy().as_str(),
                job,
                why: explain
                    .then(|| http::HeaderValue::from_str(&cand.to_string()).ok())
                    .flatten(),
            }),
            body: Body::new(relay),
        };
    }

    all_failed(
        st,
        &req,
        &mut profile,
        job,
        created_at_ms,
        &attempts,
        deadline_hit,
    )
}

// The paths below are taken only when something failed. `#[cold]` keeps
// them out of `execute`'s code (it cut the plain build's instruction-cache
// misses by only 1 %; the profile-guided release build lays the whole path
// out: docs/benchmarks/proxy.md, "Twelfth round").

#[cold]
#[inline(never)]
fn invalid_request(st: &ProxyState, req: &Inference, e: &body::BodyError) -> Reply {
    st.metrics.count_request(req.route, 400, "none");
    json_error(
        StatusCode::BAD_REQUEST,
        req.flavor,
        "invalid_request",
        &e.to_string(),
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

/// Every candidate failed before answering.
#[cold]
#[inline(never)]
fn all_failed(
    st: &ProxyState,
    req: &Inference,
    profile: &mut RequestProfile,
    job: JobId,
    created_at_ms: u64,
    attempts: &[Attempt],
    deadline_hit: bool,
) -> Reply {
    let t0 = req.received;
    let status = if deadline_hit {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::BAD_GATEWAY
    };
    st.metrics.count_request(req.route, status.as_u16(), "none");
    let model = profile.model.clone();
    let mut record = new_record(job, req, profile, st.node.id, created_at_ms);
    record.attempts = u8::try_from(attempts.len()).unwrap_or(u8::MAX);
    record.status = JobStatus::Failed;
    record.http_status = Some(status.as_u16());
    record.duration_ms = Some(millis(t0.elapsed()));
    record.error = Some("all attempts failed".into());
    st.finish_job(record);
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
        .insert(reply::ATTEMPTS, reply::attempts_value(attempts.len()));
    resp.into()
}

/// An attempt that failed before its answer's first body byte.
#[cold]
#[inline(never)]
fn attempt_failed(
    st: &ProxyState,
    cluster: &ClusterSnapshot,
    attempts: &mut Vec<Attempt>,
    node: NodeId,
    hop: &Hop,
    e: AttemptError,
) {
    let outcome = match &e {
        AttemptError::Dispatch(e) => {
            tracing::debug!(%node, error = %e, "attempt failed");
            e.class()
        }
        AttemptError::Status(status) => {
            if *status == StatusCode::NOT_FOUND {
                refresh_inventory(hop);
            }
            status.as_str()
        }
        AttemptError::Body(class) => class,
    };
    fail(st, cluster, attempts, node, outcome);
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

#[cold]
#[inline(never)]
fn fail(
    st: &ProxyState,
    cluster: &ClusterSnapshot,
    attempts: &mut Vec<Attempt>,
    node: NodeId,
    outcome: &str,
) {
    let name = name_of(cluster, node);
    st.metrics
        .failovers
        .get_or_create(&FailoverLabels {
            reason: outcome.to_owned(),
        })
        .inc();
    attempts.push(Attempt {
        node,
        name,
        outcome: outcome.to_owned(),
    });
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
