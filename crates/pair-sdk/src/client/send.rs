//! Requests: the client's half of the failover driver
//! ([`pair_scheduler::drive`], the one a node's pipeline runs too). A
//! request goes to the best node of the cached ranking (no new probe
//! round); the driver moves it on by the nodes' own rules and this side
//! does only the I/O and the bookkeeping: reservations, nodes marked
//! failed or refusing, the session kept.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use pair_core::{NodeId, RequestProfile, RetryAdvice};
use pair_link::InferenceRoute;
use pair_link::resume::{Dead, Moved, Mover, Resuming};
use pair_link::{ClusterError, PeerLink, Rearmed, TLS_REFUSED};
use pair_scheduler::drive::{self, Classified, Driven, Exchange};
use pair_scheduler::{Failover, GiveUp, ReservationId, Step, Target};
use pair_translate::resume::Stitcher;
use tokio::time::Instant;

use super::{Client, Request, unix_ms};
use crate::error::{Attempts, Error, Result, Tried};
use crate::response::{AnswerBody, Response};
use crate::view::View;

/// Why an attempt from the client failed.
#[derive(Debug)]
pub(super) enum SendError {
    /// The node has no address in the view, or no link could be made.
    NoLink,
    /// The link failed (it classifies itself, as a node reads it).
    Link(ClusterError),
    /// The request cannot be put on any node's relay route (the reason
    /// is kept for the caller's error).
    Invalid,
    /// The answer's body failed before its first byte.
    Cut,
    /// The node gave up before any answer from its engine, and said why
    /// ([`pair_link::FAILED_HEADER`]).
    NodeGaveUp(&'static pair_core::FailureClass),
}

impl Classified for SendError {
    fn class(&self) -> &'static str {
        match self {
            SendError::NoLink => "no-link",
            SendError::Link(e) => e.class(),
            SendError::Invalid => "bad-request",
            SendError::Cut => "body",
            SendError::NodeGaveUp(c) => c.label,
        }
    }
    fn advice(&self) -> RetryAdvice {
        match self {
            SendError::Invalid => RetryAdvice::Never,
            SendError::NodeGaveUp(c) => c.advice(),
            _ => RetryAdvice::BeforeFirstByte,
        }
    }
    fn transient(&self) -> bool {
        match self {
            SendError::Link(e) => e.transient(),
            SendError::NodeGaveUp(c) => c.transient,
            _ => false,
        }
    }
}

/// A reservation on a node, released when the attempt is done with it.
struct Reserved<'a> {
    client: &'a Client,
    id: Option<ReservationId>,
    /// No other node is left if this attempt fails: the node is told so
    /// ([`pair_link::ALONE_HEADER`]), and waits on a silent engine.
    alone: bool,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take()
            && let Ok(mut s) = self.client.inner.sched.lock()
        {
            s.reservations.release(id, unix_ms());
        }
    }
}

struct Head<'a> {
    resp: http::Response<Incoming>,
    first: Option<Bytes>,
    sent: Instant,
    _reserved: Option<Reserved<'a>>,
}

/// What the driver committed to.
struct Answer {
    resp: http::Response<Incoming>,
    first: Option<Bytes>,
    sent: Instant,
}

/// One request's attempts.
struct Sending<'a> {
    client: &'a Client,
    req: &'a Request,
    /// `None`: a route without a model (a listing), sent to the nearest
    /// node that answers.
    profile: Option<&'a RequestProfile>,
    /// The view the request started with (the current one when there is).
    view: Arc<View>,
    t0: Instant,
    /// Every owner refuses this client's certificate: their names.
    refused: Mutex<Option<Vec<String>>>,
    /// A request no node can take as it is.
    invalid: Mutex<Option<String>>,
    /// Nodes left out (those a continued stream was cut on).
    exclude: &'a [NodeId],
    /// A continuation on this route: only nodes whose engine can continue
    /// it take it.
    continuing: Option<InferenceRoute>,
}

impl<'a> Sending<'a> {
    fn new(
        client: &'a Client,
        req: &'a Request,
        profile: Option<&'a RequestProfile>,
        view: Arc<View>,
        exclude: &'a [NodeId],
    ) -> Self {
        Self {
            client,
            req,
            profile,
            view,
            t0: Instant::now(),
            refused: Mutex::new(None),
            invalid: Mutex::new(None),
            exclude,
            continuing: None,
        }
    }

    /// The request's failover, run to its end.
    async fn run(&self, failover: &mut Failover) -> Driven<Answer, (NodeId, u16, Bytes)> {
        let timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        drive::drive(self, failover, std::pin::pin!(Rearmed::new(timer, self.t0))).await
    }
}

impl<'a> Exchange for Sending<'a> {
    type Head = Head<'a>;
    type Answer = Answer;
    type Kept = (NodeId, u16, Bytes);
    type Ticket = Reserved<'a>;
    type Error = SendError;

    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    fn sleep_until(&self, at: Duration) -> impl Future<Output = ()> {
        tokio::time::sleep_until(self.t0 + at)
    }

    fn choose(
        &self,
        _first: bool,
        decide: &mut dyn FnMut(&[Target], bool) -> Step,
    ) -> (Step, Option<Reserved<'a>>) {
        let client = self.client;
        let view = client
            .current_view()
            .unwrap_or_else(|| Arc::clone(&self.view));
        let Some(profile) = self.profile else {
            return (decide(&nearest(&view), false), None);
        };
        let targets = self.targets(&view, profile);
        if targets.is_empty()
            && let Some(nodes) = client.all_owners_refuse(&view, profile)
        {
            if let Ok(mut r) = self.refused.lock() {
                *r = Some(nodes);
            }
            return (Step::GiveUp(GiveUp::NoCandidate), None);
        }
        // With no candidate, its owners failed and are being probed
        // again: wait for one (within the request's patience). A
        // continuation does not wait: its caller is mid-answer.
        let step = decide(&targets, targets.is_empty() && self.exclude.is_empty());
        let ticket = match step {
            Step::Dispatch { node, alone, .. } => Some(Reserved {
                client,
                alone,
                id: client
                    .inner
                    .sched
                    .lock()
                    .ok()
                    .map(|mut s| s.reservations.reserve(node, profile, unix_ms())),
            }),
            _ => None,
        };
        (step, ticket)
    }

    async fn send(
        &self,
        node: NodeId,
        ticket: Option<Reserved<'a>>,
    ) -> Result<Head<'a>, SendError> {
        let client = self.client;
        let Some(link) = client.link(node) else {
            client.node_failed(node);
            return Err(SendError::NoLink);
        };
        let mut out = relay_request(&link, self.req).map_err(|e| {
            if let Ok(mut i) = self.invalid.lock() {
                *i = Some(e.clone());
            }
            SendError::Invalid
        })?;
        // The node's reports say when they count this request.
        if let Some(id) = ticket.as_ref().and_then(|t| t.id) {
            out.headers_mut().insert(
                pair_link::RESERVATION_HEADER,
                pair_link::reservation_value(client.inner.epoch, id.wire_seq()),
            );
        }
        if ticket.as_ref().is_some_and(|t| t.alone) {
            out.headers_mut()
                .insert(pair_link::ALONE_HEADER, http::HeaderValue::from_static("1"));
        }
        let sent = Instant::now();
        match link.send(out).await {
            Ok(resp) => match node_gave_up(resp.headers()) {
                Some(e) => Err(e),
                None => Ok(Head {
                    resp,
                    first: None,
                    sent,
                    _reserved: ticket,
                }),
            },
            Err(e) => {
                // A node that refused this client is up: it stays ranked
                // (another request may be let in once vouching reaches
                // it). One that refused the connection or is gone is
                // probed again; a reset one is retried after a back-off.
                match e.class() {
                    TLS_REFUSED => client.set_refused(node, true),
                    "reset" => {}
                    _ => client.node_failed(node),
                }
                Err(SendError::Link(e))
            }
        }
    }

    fn status(&self, _node: NodeId, head: &Head<'a>) -> (u16, Option<Duration>) {
        let retry_after = head
            .resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| drive::retry_after(v.as_bytes(), std::time::SystemTime::now()));
        (head.resp.status().as_u16(), retry_after)
    }

    async fn first_byte(&self, head: &mut Head<'a>) -> Result<(), SendError> {
        head.first = next_data(head.resp.body_mut())
            .await
            .map_err(|()| SendError::Cut)?;
        Ok(())
    }

    fn commit(&self, node: NodeId, head: Head<'a>) -> Answer {
        if head.resp.status().is_success()
            && let Some(profile) = self.profile
            && let Ok(mut s) = self.client.inner.sched.lock()
        {
            let now = unix_ms();
            if let Some(session) = profile.session {
                s.scheduler.bind_session(session, node, now);
            }
            // The node's engine now holds the prompt: the next request that
            // shares a prefix with it is priced with that prefix cached.
            s.scheduler
                .note_routed(&self.view.cluster, node, &profile.prefix, now);
        }
        Answer {
            resp: head.resp,
            first: head.first,
            sent: head.sent,
        }
    }

    async fn keep(&self, node: NodeId, head: Head<'a>) -> Option<(NodeId, u16, Bytes)> {
        let status = head.resp.status().as_u16();
        if status >= 500 && status != 503 {
            self.client.node_failed(node);
        }
        Some((node, status, read_short(head.resp).await))
    }

    /// The client sees no progress on a node but its answer: an attempt
    /// gets its stall allowance, then moves on.
    fn last_progress(&self, _node: NodeId) -> Option<Duration> {
        None
    }

    fn candidates(&self) -> Vec<Target> {
        let view = self
            .client
            .current_view()
            .unwrap_or_else(|| Arc::clone(&self.view));
        match self.profile {
            Some(profile) => self.targets(&view, profile),
            None => nearest(&view),
        }
    }

    fn stalled(&self, node: NodeId) {
        self.client.node_failed(node);
    }
}

/// The attempt's error when the node gave up before any answer from its
/// engine ([`pair_link::FAILED_HEADER`]): the class it names, as a node
/// reads it (one it does not know is `transport`).
pub(super) fn node_gave_up(headers: &http::HeaderMap) -> Option<SendError> {
    let value = headers.get(pair_link::FAILED_HEADER)?;
    let class = value
        .to_str()
        .ok()
        .and_then(pair_core::failure_class)
        .or_else(|| pair_core::failure_class("transport"));
    Some(class.map_or(SendError::Cut, SendError::NodeGaveUp))
}

impl Sending<'_> {
    /// The request's candidates in `view`, best first: the ranking's,
    /// less the nodes left out and, for a continuation, those whose
    /// engine cannot continue it.
    fn targets(&self, view: &View, profile: &RequestProfile) -> Vec<Target> {
        let mut targets = self.client.targets(view, profile);
        targets.retain(|t| {
            !self.exclude.contains(&t.node)
                && self.continuing.is_none_or(|route| {
                    view.cluster.node(t.node).is_some_and(|n| {
                        n.continues(&profile.model, profile.flavor, route.is_chat())
                    })
                })
        });
        targets
    }
}

/// How the client sends a cut stream's continuation.
struct Continue {
    client: Client,
    /// The request as first sent (its body is replaced).
    req: Request,
    profile: RequestProfile,
}

impl Mover for Continue {
    type Body = Incoming;

    fn send(
        self: Arc<Self>,
        request: Bytes,
        route: InferenceRoute,
        dead: Dead,
    ) -> Pin<Box<dyn Future<Output = Option<Moved<Incoming>>> + Send>> {
        Box::pin(async move {
            let client = &self.client;
            // A node that cut the stream because it no longer lets this
            // client in (unpaired, revoked) is not a failure to go around:
            // the answer does not move, the caller learns it is refused.
            let cut_on = *dead.last()?;
            if let Some(addr) = client.known_addr(cut_on)
                && let Err(f) = client.inner.prober.probe(addr, Some(cut_on)).await
                && f.is_refusal()
            {
                client.set_refused(cut_on, true);
                return None;
            }
            let mut req = self.req.clone();
            req.body = request;
            route.path().clone_into(&mut req.path);
            req.headers.remove(http::header::CONTENT_LENGTH);
            let view = client.current_view()?;
            let mut sending = Sending::new(client, &req, Some(&self.profile), view, &dead);
            sending.continuing = Some(route);
            let mut failover = Failover::new(client.inner.cfg.failover);
            let driven = sending.run(&mut failover).await;
            match driven {
                Driven::Committed { node, answer } if answer.resp.status().is_success() => {
                    Some(Moved {
                        node,
                        first: answer.first,
                        body: answer.resp.into_body(),
                        holding: Box::new(()),
                    })
                }
                _ => None,
            }
        })
    }

    fn moved(&self, node: NodeId, at_token: u32) -> serde_json::Value {
        let name = self.client.node_name(node);
        tracing::info!(node = %name, at_token, "a cut stream moved");
        serde_json::json!({ "node": name, "node_id": node, "at_token": at_token })
    }

    fn stopped(&self, why: &'static str) {
        tracing::info!(why, "a cut stream cannot go on");
    }
}

/// The view's nodes that are up, nearest first (for a listing).
fn nearest(view: &View) -> Vec<Target> {
    let mut nodes: Vec<_> = view
        .nodes
        .values()
        .filter(|n| !view.down.contains(&n.id))
        .collect();
    nodes.sort_by_key(|n| n.rtt_us);
    nodes
        .into_iter()
        .map(|n| Target {
            node: n.id,
            predicted: None,
        })
        .collect()
}

impl Client {
    /// Sends `req` to the best node for it and fails over by the nodes'
    /// rules: connect refused, timeouts, a 404 for the model and 5xx before
    /// the first byte move to the next node of the cached ranking (no new
    /// probe round); other 4xx come back as they are. The answer is the
    /// node's, whatever its status, once its first byte is read. A route
    /// without a model (a listing) goes to the nearest node that answers.
    pub async fn send(&self, req: Request) -> Result<Response> {
        let view = self.view().await?;
        let (req, profile) = match req.profile() {
            None => (req, None),
            Some(profile) => {
                // A model no node holds may be a model alias a node
                // advertises (a tool's default name): the request becomes
                // one for its target.
                let (req, profile) = super::aliased(&view, req, profile)?;
                if !view.holds(&profile.model, profile.flavor) {
                    return Err(Error::NoNodeServes {
                        model: profile.model,
                        probed: view.nodes.len(),
                    });
                }
                (req, Some(profile))
            }
        };
        let sending = Sending::new(self, &req, profile.as_ref(), view, &[]);
        let mut failover = Failover::new(self.inner.cfg.failover);
        let driven = sending.run(&mut failover).await;
        let model = profile.as_ref().map_or("-", |p| p.model.as_str());
        match driven {
            Driven::Committed { node, answer } => {
                let first_byte = answer.sent.elapsed();
                let (resp, first) = match profile {
                    Some(profile) => self.resuming(req, profile, node, answer.resp, answer.first),
                    None => (answer.resp.map(BodyExt::boxed_unsync), answer.first),
                };
                Ok(Response::new(
                    resp,
                    first,
                    node,
                    self.node_name(node),
                    failover.dispatched(),
                    first_byte,
                ))
            }
            Driven::GaveUp { why, kept } => {
                let gave_up = GaveUp {
                    why,
                    kept,
                    invalid: sending.invalid.lock().ok().and_then(|mut i| i.take()),
                    refused: sending.refused.lock().ok().and_then(|mut r| r.take()),
                };
                Err(gave_up.error(self, model, &failover).await)
            }
        }
    }

    /// A stream of an API that can be continued goes on from another
    /// owner of the model when it is cut after its first byte, as on a
    /// node ([`pair_link::resume`]): the same request with the text
    /// streamed as the answer's start, sent by the same driver with the
    /// nodes it was cut on left out, spliced on.
    fn resuming(
        &self,
        req: Request,
        profile: RequestProfile,
        node: NodeId,
        resp: http::Response<Incoming>,
        first: Option<Bytes>,
    ) -> (http::Response<AnswerBody>, Option<Bytes>) {
        let limit = self.inner.cfg.resume_limit;
        let streamed = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream") || t.contains("ndjson"));
        let api = InferenceRoute::from_path(&req.path).and_then(InferenceRoute::continues);
        let (Some(api), true, true) = (api, streamed && profile.streaming, limit > 0) else {
            return (resp.map(BodyExt::boxed_unsync), first);
        };
        if !resp.status().is_success() {
            return (resp.map(BodyExt::boxed_unsync), first);
        }
        let stitch = Stitcher::new(api, req.body.clone(), profile.model.clone(), limit);
        let mover = Continue {
            client: self.clone(),
            req,
            profile,
        };
        (
            resp.map(|body| Resuming::new(body, first, stitch, mover, node).boxed_unsync()),
            None,
        )
    }

    fn node_name(&self, id: NodeId) -> String {
        self.current_view()
            .and_then(|v| v.nodes.get(&id).map(|n| n.name.clone()))
            .or_else(|| self.inner.trust.get(id).map(|r| r.name))
            .unwrap_or_else(|| id.short())
    }
}

/// What ending a request that gave up asks of the client.
pub(super) trait Roster {
    /// A node's name, for errors.
    fn name(&self, node: NodeId) -> String;
    /// Whether `node` refuses this client's certificate.
    fn refuses(&self, node: NodeId) -> bool;
    /// How many nodes the client's view holds.
    fn probed(&self) -> usize;
    /// Probes `nodes` again; those that refuse this client are marked so.
    fn reprobe(&self, nodes: Vec<NodeId>) -> impl Future<Output = ()>;
}

impl Roster for Client {
    fn name(&self, node: NodeId) -> String {
        self.node_name(node)
    }

    fn refuses(&self, node: NodeId) -> bool {
        self.inner.refused.lock().is_ok_and(|r| r.contains(&node))
    }

    fn probed(&self) -> usize {
        self.current_view().map_or(0, |v| v.nodes.len())
    }

    async fn reprobe(&self, nodes: Vec<NodeId>) {
        let unsure: Vec<(std::net::SocketAddr, Option<NodeId>)> = nodes
            .into_iter()
            .filter_map(|n| self.known_addr(n).map(|a| (a, Some(n))))
            .collect();
        for r in self.inner.prober.round(unsure).await {
            if let Err(f) = r
                && f.is_refusal()
                && let Some(id) = f.expected
            {
                self.set_refused(id, true);
            }
        }
    }
}

/// A request the driver gave up on, with what its attempts left behind.
pub(super) struct GaveUp {
    pub(super) why: GiveUp,
    /// The last answer a node gave.
    pub(super) kept: Option<(NodeId, u16, Bytes)>,
    /// Why no node could take the request as it is.
    pub(super) invalid: Option<String>,
    /// Every owner refused this client's certificate: their names.
    pub(super) refused: Option<Vec<String>>,
}

impl GaveUp {
    /// The caller's error for a request of `model` (`-`: a listing). An
    /// invalid request or one every owner refused is said as such;
    /// otherwise the refusals are confirmed first ([`confirm_refusals`]),
    /// then a request every node tried refuses is [`Error::Refused`], one
    /// whose owners left [`Error::OwnersGone`], one a node answered the
    /// last answer's [`Error::Status`], and the rest [`Error::NoNodeServes`]
    /// (no node was eligible) or [`Error::Exhausted`].
    pub(super) async fn error(
        self,
        roster: &impl Roster,
        model: &str,
        failover: &Failover,
    ) -> Error {
        if let Some(why) = self.invalid {
            return Error::InvalidRequest(why);
        }
        if let Some(nodes) = self.refused {
            return Error::Refused {
                model: model.to_owned(),
                nodes,
            };
        }
        confirm_refusals(roster, failover).await;
        give_up(roster, self.why, model, failover, self.kept)
    }
}

/// When some node refused this client's certificate, the others that
/// failed may have too, their alert lost with the connection (hyper ends a
/// refused connection quietly when it reads the alert first): a probe of
/// each says which. Only when the request gives up, so it costs a failover
/// nothing.
async fn confirm_refusals(roster: &impl Roster, failover: &Failover) {
    let failed = failover.failed();
    if !failed.iter().any(|f| roster.refuses(f.node)) {
        return;
    }
    let unsure: Vec<NodeId> = failed
        .iter()
        .map(|f| f.node)
        .filter(|n| !roster.refuses(*n))
        .collect();
    roster.reprobe(unsure).await;
}

fn give_up(
    roster: &impl Roster,
    why: GiveUp,
    model: &str,
    failover: &Failover,
    last_answer: Option<(NodeId, u16, Bytes)>,
) -> Error {
    let attempts = Attempts(
        failover
            .failed()
            .iter()
            .map(|f| Tried {
                node: f.node,
                name: roster.name(f.node),
                what: f.outcome.label().into_owned(),
            })
            .collect(),
    );
    let refused = |t: &Tried| t.what == TLS_REFUSED || roster.refuses(t.node);
    if !attempts.0.is_empty() && attempts.0.iter().all(refused) {
        let mut nodes: Vec<String> = attempts.0.iter().map(|t| t.name.clone()).collect();
        nodes.dedup();
        return Error::Refused {
            model: model.to_owned(),
            nodes,
        };
    }
    match (why, last_answer) {
        (GiveUp::OwnersGone, _) => Error::OwnersGone {
            model: model.to_owned(),
            attempts,
        },
        (_, Some((node, status, body))) => Error::Status {
            model: model.to_owned(),
            node: roster.name(node),
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
            attempts,
        },
        (GiveUp::NoCandidate, None) if model != "-" => Error::NoNodeServes {
            model: model.to_owned(),
            probed: roster.probed(),
        },
        // The SDK sets no deadline of its own (its caller's timeout
        // bounds the call).
        (GiveUp::Exhausted { .. } | GiveUp::Deadline | GiveUp::NoCandidate, None) => {
            Error::Exhausted {
                model: model.to_owned(),
                attempts,
            }
        }
    }
}

/// The request as the node's relay takes it.
fn relay_request(
    link: &PeerLink,
    req: &Request,
) -> std::result::Result<http::Request<Full<Bytes>>, String> {
    let uri = link
        .relay_uri(&req.path)
        .map_err(|e| format!("path {:?}: {e}", req.path))?;
    let mut b = http::Request::builder().method(req.method.clone()).uri(uri);
    if let Some(h) = b.headers_mut() {
        h.extend(req.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    b.body(Full::new(req.body.clone()))
        .map_err(|e| e.to_string())
}

/// The next data frame of a body: `Ok` with the bytes (empty at a clean end
/// with no data), `Err` when the body fails first.
async fn next_data(body: &mut Incoming) -> std::result::Result<Option<Bytes>, ()> {
    loop {
        match body.frame().await {
            None => return Ok(None),
            Some(Err(_)) => return Err(()),
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data()
                    && !d.is_empty()
                {
                    return Ok(Some(d));
                }
            }
        }
    }
}

/// Up to 64 KiB of an answer that will not be used, for error messages.
async fn read_short(resp: http::Response<Incoming>) -> Bytes {
    let limited = http_body_util::Limited::new(resp.into_body(), 64 * 1024);
    match tokio::time::timeout(Duration::from_secs(5), limited.collect()).await {
        Ok(Ok(c)) => c.to_bytes(),
        _ => Bytes::new(),
    }
}
