//! One request's attempts: the node's half of the failover driver
//! ([`pair_scheduler::drive`]). [`Attempts`] is the per-request context
//! every attempt reads (the request, its profile and job, its plan); the
//! driver asks it for the candidates, has it send to a node and read the
//! answer's head and first byte, and asks it what shows the node's
//! progress. Everything that decides (retry, cut, deadline, what is kept)
//! is the driver's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http_body_util::BodyExt;
use pair_cluster::Engaged;
use pair_core::{ApiFlavor, ClusterSnapshot, JobId, NodeId, Priority, RequestProfile};
use pair_http::RequestHead;
use pair_http::h1::Headers;
use pair_identity::keys::KeyRecord;
use pair_link::Rearmed;
use pair_link::header::MADE_HEADER;
use pair_scheduler::drive::{self, Driven, Exchange};
use pair_scheduler::{Candidate, Failover, FailoverConfig, ReservationId, Step, Target};
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::dispatch::{self, DispatchError, Hop, LocalEngine, first_data, refresh_inventory};
use crate::resume;
use crate::route::{InferenceRoute, Work};
use crate::state::{MAX_ATTEMPTS, ProxyState, now_ms, unix_ms_at};
use crate::stream::Framing;
use crate::translate;
use crate::waiting;

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

/// An inference request, as the executor needs it.
#[derive(Debug)]
pub struct Inference {
    pub head: RequestHead,
    pub body: Bytes,
    pub flavor: ApiFlavor,
    pub work: Work,
    pub route: InferenceRoute,
    /// When the request was read whole (its time to first byte and
    /// duration count from here).
    pub received: Instant,
    /// The API key it came with (the LAN face).
    pub key: Option<KeyRecord>,
}

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

/// Which nodes the attempts may go to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reach<'a> {
    /// The request's plan: the cluster as ranked, or this node alone.
    Plan(Plan),
    /// A cut stream's continuation: any owner that can continue it, but
    /// the nodes it was cut on.
    Continuation {
        dead: &'a [NodeId],
        api: resume::Api,
        /// The answer as batch work that may be cut again.
        preempt: Option<&'a Arc<crate::preempt::Job>>,
    },
}

/// One request's context for its attempts.
pub(crate) struct Attempts<'a> {
    pub st: &'a Arc<ProxyState>,
    pub req: &'a Inference,
    pub profile: &'a RequestProfile,
    pub job: JobId,
    pub reach: Reach<'a>,
    /// The candidate entry of each dispatch is kept for the receipt.
    pub explain: bool,
    /// When (ms after the request's arrival, plus one; 0: never) an
    /// attempt was waited on with no other node to go to.
    pub alone_since: std::sync::atomic::AtomicU64,
    /// The wait at the cluster for a free slot before the first attempt.
    pub queued: Option<pair_core::JobWait>,
    /// Peers take it only into a free slot ([`pair_link::FREE_SLOT_HEADER`]):
    /// it waited at the cluster, and goes back there if every one is full.
    pub free_slot: bool,
    /// The free slot it was let go for at the cluster: released once it
    /// is counted where it goes.
    pub claim: Option<crate::waiting::Claim>,
    /// The slot of this node's engine it cut batch work for: released with
    /// the claim.
    pub hold: std::sync::Mutex<Option<pair_cluster::SlotHold>>,
    /// Batch work interactive work may cut (with preemption; a request
    /// routed here, `Plan::Cluster`): its cuts and moves, over every
    /// attempt and every wait at the cluster.
    pub batch: Option<Arc<crate::preempt::Job>>,
}

/// What choosing a node counted on it: a local dispatch by its load
/// guard, which ranking reads live for this node (it ignores reservations
/// there); a peer's by a reservation, until the peer's reports show it.
pub(crate) struct Ticket<'a> {
    cluster: Arc<ClusterSnapshot>,
    guard: Option<pair_cluster::LoadGuard>,
    reservation: Option<crate::state::Reservation<'a>>,
    /// A whole answer from this node's engine shows no first token: its
    /// prompt stops counting as prefill work once the prediction (from the
    /// work ahead of it) says its first token is due, as a streamed one's
    /// does when the token comes.
    prefilled_in: Option<Duration>,
    /// When this node's engine should have sent something for it (the
    /// first token streamed, the whole answer not): past it, an engine
    /// that sends nothing turns silent.
    expect: Duration,
    chosen: Option<Candidate>,
    /// Prompt tokens the ranking priced as cached on this node: the job
    /// record keeps its share where the engine says nothing of its cache.
    cached: u32,
    /// No other node is left if this attempt fails: a peer is told so,
    /// and waits on a silent engine rather than give the request up.
    alone: bool,
}

/// An answer's head, its body not yet read.
pub(crate) struct Head<'a> {
    up: dispatch::Upstream,
    first: Option<Bytes>,
    ticket: Ticket<'a>,
    watch: Watch,
    resumed: Option<Arc<resume::ResumeLog>>,
    /// Its leg, for a batch answer that may be cut for interactive work.
    leg: Option<Arc<crate::preempt::Leg>>,
}

/// The answer the driver committed to.
pub(crate) struct Committed {
    pub up: dispatch::Upstream,
    /// What was read of its body before committing (the first frame, or
    /// a whole answer).
    pub first: Option<Bytes>,
    pub guard: Option<pair_cluster::LoadGuard>,
    /// The peer's reservation, released when the answer ends.
    pub reservation: Option<ReservationId>,
    pub engine: Option<Engaged>,
    /// Where the answer moved after a cut, when it may move.
    pub resumed: Option<Arc<resume::ResumeLog>>,
    /// The snapshot it was routed by, and the node's place in its ranking.
    pub cluster: Arc<ClusterSnapshot>,
    pub chosen: Option<Candidate>,
    /// Prompt tokens the ranking priced as cached on the node.
    pub cached: u32,
    /// Its leg, for a batch answer that may be cut for interactive work:
    /// it takes `guard`, `reservation` and `engine` once committed.
    pub leg: Option<Arc<crate::preempt::Leg>>,
}

/// An answer that was not committed, kept in case it is the last.
pub(crate) struct Held {
    pub node: NodeId,
    pub status: StatusCode,
    pub headers: Headers,
    pub body: Bytes,
}

impl<'a> Attempts<'a> {
    /// Its free slot is counted, or it goes nowhere now: the slot it held
    /// at the cluster is no longer its to hold.
    fn release_claim(&self) {
        if let Ok(mut hold) = self.hold.lock() {
            hold.take();
        }
        if let Some(claim) = self.claim {
            self.st.waitroom.counted(claim);
        }
    }

    /// Runs the request's failover to its end, on the connection's timer.
    pub(crate) async fn run(
        &self,
        failover: &mut Failover,
        timer: Pin<&mut tokio::time::Sleep>,
    ) -> Driven<Committed, Held> {
        drive::drive(
            self,
            failover,
            std::pin::pin!(Rearmed::new(timer, self.req.received)),
        )
        .await
    }

    /// The wait on a silent node with no other to go to, when there was
    /// one: from its start until now.
    pub(crate) fn waited(&self) -> Option<pair_core::JobWait> {
        let Some(since) = self
            .alone_since
            .load(std::sync::atomic::Ordering::Relaxed)
            .checked_sub(1)
        else {
            return self.queued;
        };
        let now = u64::try_from(self.now().as_millis()).unwrap_or(u64::MAX);
        Some(pair_core::JobWait {
            ms: u32::try_from(now.saturating_sub(since)).unwrap_or(u32::MAX),
            why: pair_core::WaitReason::SilentOnlyOwner,
        })
    }

    pub(crate) fn plan(&self) -> Plan {
        match self.reach {
            Reach::Plan(p) => p,
            Reach::Continuation { .. } => Plan::Cluster,
        }
    }

    /// Held at the cluster, `t` narrowed to the nodes with a free slot
    /// ([`open_targets`]).
    fn open(
        &self,
        cluster: &ClusterSnapshot,
        t: SmallVec<[Target; MAX_ATTEMPTS]>,
    ) -> SmallVec<[Target; MAX_ATTEMPTS]> {
        if !self.free_slot {
            return t;
        }
        let st = self.st;
        let own_full = st.slots_full_in_turn(cluster, self.profile, self.req.flavor);
        open_targets(t, st.node.id, own_full, |n| {
            st.refused_since_report(cluster, n)
        })
    }

    /// The request's candidates, best first, and the shortlist they came
    /// from (for the receipt).
    fn targets(
        &self,
        cluster: &ClusterSnapshot,
    ) -> (SmallVec<[Target; MAX_ATTEMPTS]>, crate::state::Shortlist) {
        let st = self.st;
        match self.reach {
            Reach::Plan(Plan::Cluster) => {
                let shortlist = st.rank(cluster, self.profile, now_ms());
                let t = shortlist.iter().map(Candidate::target).collect();
                (self.open(cluster, t), shortlist)
            }
            // This node only, while it holds the model on a healthy engine.
            Reach::Plan(Plan::ThisNode { .. }) => (
                holds(st, cluster, self.profile, self.req.flavor)
                    .then_some(Target {
                        node: st.node.id,
                        predicted: None,
                    })
                    .into_iter()
                    .collect(),
                SmallVec::new(),
            ),
            Reach::Continuation { dead, api, .. } => (
                self.open(
                    cluster,
                    st.rank(cluster, self.profile, now_ms())
                        .iter()
                        .filter(|c| !dead.contains(&c.node))
                        .filter(|c| resume::continues(cluster, c.node, &self.profile.model, api))
                        .map(Candidate::target)
                        .collect(),
                ),
                SmallVec::new(),
            ),
        }
    }

    /// Counts a dispatch to `node` (while the dispatch turn is held).
    fn count(&self, cluster: Arc<ClusterSnapshot>, node: NodeId) -> Ticket<'a> {
        let st: &'a ProxyState = self.st;
        let profile = self.profile;
        if node == st.node.id {
            let predicted = st.local_prediction(&cluster, profile, self.req.flavor);
            let ms = |ms: u32| Duration::from_millis(u64::from(ms));
            Ticket {
                prefilled_in: predicted
                    .filter(|_| !profile.streaming)
                    .map(|p| ms(p.first_token_ms())),
                expect: predicted.map_or(Duration::ZERO, |p| ms(p.total_ms)),
                guard: Some({
                    let mut guard = st
                        .load
                        .begin(profile.prompt_tokens, profile.answer_tokens());
                    // Relayed under the sender's reservation: this node's
                    // reports say it is counted from here.
                    if let Reach::Plan(Plan::ThisNode { origin }) = self.reach
                        && let Some(r) = self
                            .req
                            .head
                            .headers
                            .get(&pair_link::RESERVATION_HEADER)
                            .and_then(pair_link::parse_reservation)
                    {
                        st.load.admit(&mut guard, origin, r);
                    }
                    guard
                }),
                reservation: None,
                cluster,
                chosen: None,
                cached: 0,
                alone: false,
            }
        } else {
            Ticket {
                guard: None,
                reservation: Some(st.reserve(node, profile, now_ms())),
                prefilled_in: None,
                expect: Duration::ZERO,
                cluster,
                chosen: None,
                cached: 0,
                alone: false,
            }
        }
    }

    /// The answer's head from `node`, its stream watched for silence and,
    /// on a request this node routed, wrapped to move on a cut.
    async fn head(&self, node: NodeId, ticket: Ticket<'a>) -> Result<Head<'a>, DispatchError> {
        let (st, req, profile) = (self.st, self.req, self.profile);
        let mut ticket = ticket;
        let hop = hop_for(st, &ticket.cluster, node, &profile.model, req.flavor)?;
        // An engine that does not speak the client's API gets it translated;
        // a request that cannot be is the client's 400, never retried.
        let peer_engine = match &hop {
            Hop::Peer(_) => ticket
                .cluster
                .node(node)
                .and_then(|n| n.find_model(&profile.model, req.flavor))
                .map(|(e, _)| e.kind),
            Hop::Local(_) => None,
        };
        let watch = match &hop {
            Hop::Local(engine) => Watch::Engine(engine.progress.engage(ticket.expect)),
            Hop::Peer(_) => Watch::Peer,
        };
        let translation = match translate::needed(&hop, req.flavor, req.route, peer_engine) {
            None => None,
            Some((route, kind)) => match translate::request(route, kind, &req.head, &req.body) {
                Ok(t) => Some((route, t)),
                Err(e) => {
                    ticket.guard = None;
                    ticket.reservation = None;
                    return Ok(Head {
                        up: translate::refused(&e, req.flavor),
                        first: None,
                        ticket,
                        watch,
                        resumed: None,
                        leg: None,
                    });
                }
            },
        };
        let job_header = matches!(self.plan(), Plan::Cluster).then_some(self.job);
        let (out_head, out_body, out_route) = match &translation {
            Some((_, t)) => (&t.head, t.body.clone(), t.route),
            None => (&req.head, req.body.clone(), Some(req.route)),
        };
        // Batch work this node continues if it is cut: a peer serving it
        // may cut it for interactive work.
        let cuttable = st.waitroom.preempts()
            && profile.priority == Priority::Batch
            && match self.reach {
                Reach::Plan(Plan::Cluster) => {
                    st.resume.on()
                        && profile.streaming
                        && out_route.and_then(InferenceRoute::continues).is_some()
                        && self.batch.as_ref().is_some_and(|job| job.peer_may_cut())
                }
                Reach::Continuation {
                    preempt: Some(job), ..
                } => job.peer_may_cut(),
                _ => false,
            };
        let sent = async {
            dispatch::request(
                st.local_pool(),
                &hop,
                out_head,
                out_body.clone(),
                dispatch::Relayed {
                    job: job_header,
                    alone: ticket.alone,
                    reservation: ticket
                        .reservation
                        .as_ref()
                        .and_then(crate::state::Reservation::id)
                        .map(|id| (st.origin_epoch, id.wire_seq())),
                    free_slot: self.free_slot.then_some(profile.priority),
                    cuttable: cuttable.then(|| profile.answer_tokens()),
                },
            )?
            .await
        };
        let mut up = marking(sent, ticket.prefilled_in, || {
            if let Some(g) = ticket.guard.as_mut() {
                g.prefill_done();
            }
        })
        .await
        .inspect_err(|e| tracing::debug!(%node, error = %e, "attempt failed"))?;
        // A peer that gave up before any answer from its engine says how:
        // the attempt failed as one on this node's own engine would.
        if let Some(class) = dispatch::peer_failure(&hop, &up) {
            tracing::debug!(%node, class = class.label, "the peer gave up before an answer");
            return Err(DispatchError::PeerGaveUp(class));
        }
        let streamed = up.status.is_success()
            && Framing::from_content_type(up.headers.get(&http::header::CONTENT_TYPE))
                != Framing::Whole;
        if streamed {
            // Silent mid-answer for as long as a hung engine may be: a cut.
            up.body = up.body.watched(st.timeouts.first_byte);
        }
        // A stream from a node this one routed to may move on a cut: below
        // translation, in the engine's own events.
        let mut resumed = None;
        let mut leg = None;
        if matches!(self.reach, Reach::Plan(Plan::Cluster))
            && st.resume.on()
            && streamed
            && let Some(api) = out_route.and_then(InferenceRoute::continues)
        {
            // Batch work that interactive work may cut for its slot.
            let preempt = self.batch.clone();
            if let Some(job) = &preempt {
                let price = crate::preempt::Price::of(&ticket.cluster, node, profile, req.flavor);
                let (l, body) = leg_of(st, node, price, job, up.body);
                up.body = body;
                leg = Some(l);
            }
            let cont = resume::Continuation {
                st: Arc::clone(st),
                head: out_head.clone(),
                api,
                work: req.work,
                route: req.route,
                profile: profile.clone(),
                job: self.job,
                log: Arc::default(),
                preempt,
                send: send_continuation,
            };
            resumed = Some(Arc::clone(&cont.log));
            up.body = resume::resuming(up.body, cont, out_body.clone(), node);
        }
        // A continuation of batch work may be cut again.
        if let Reach::Continuation {
            preempt: Some(job), ..
        } = self.reach
            && streamed
        {
            let price = crate::preempt::Price::of(&ticket.cluster, node, profile, req.flavor);
            let (l, body) = leg_of(st, node, price, job, up.body);
            up.body = body;
            leg = Some(l);
        }
        // A batch answer relayed here that its sender continues if it is
        // cut: interactive work from any node may cut it for this slot.
        if let Reach::Plan(Plan::ThisNode { .. }) = self.reach
            && streamed
            && st.waitroom.preempts()
            && req.head.headers.contains(&pair_link::CUTTABLE_HEADER)
        {
            let job = Arc::new(crate::preempt::Job::new(1, req.received));
            let price = crate::preempt::Price::of(&ticket.cluster, node, profile, req.flavor);
            let (l, body) = leg_of(st, node, price, &job, up.body);
            up.body = body;
            leg = Some(l);
        }
        let up = match translation {
            Some((route, t)) => translate::answer(up, t.answer, route, &t.dropped, req.received),
            None => up,
        };
        watch.touch();
        if up.status == StatusCode::NOT_FOUND {
            refresh_inventory(&hop);
        }
        Ok(Head {
            up,
            first: None,
            ticket,
            watch,
            resumed,
            leg,
        })
    }
}

impl<'a> Exchange for Attempts<'a> {
    type Head = Head<'a>;
    type Answer = Committed;
    type Kept = Held;
    type Ticket = Ticket<'a>;
    type Error = DispatchError;

    fn now(&self) -> Duration {
        self.req.received.elapsed()
    }

    fn sleep_until(&self, at: Duration) -> impl Future<Output = ()> {
        tokio::time::sleep_until(self.req.received + at)
    }

    fn choose(
        &self,
        first: bool,
        decide: &mut dyn FnMut(&[Target], bool) -> Step,
    ) -> (Step, Option<Ticket<'a>>) {
        let st = self.st;
        // Ranking to counting is one turn: the next request ranked sees
        // this one.
        let turn = st.dispatch_turn();
        let cluster = st.cluster();
        let (targets, shortlist) = self.targets(&cluster);
        let mut owners_down = false;
        // A continuation neither waits for a starting node nor for owners
        // to come back: its client is mid-answer, and the nodes left out
        // are the ones it was cut on.
        if targets.is_empty() && first && matches!(self.reach, Reach::Plan(_)) {
            let warming = st.warming_up();
            if !warming.is_zero() {
                // Just started: the engine's first poll or the peers'
                // first reports may be what is missing.
                return (Step::Wait(WARM_UP_POLL.min(warming)), None);
            }
            owners_down = owned(&cluster, self.profile, self.req.flavor);
        }
        let step = decide(&targets, owners_down);
        let Step::Dispatch { node, alone, .. } = step else {
            drop(turn);
            self.release_claim();
            return (step, None);
        };
        let mut ticket = self.count(cluster, node);
        ticket.alone = alone;
        drop(turn);
        self.release_claim();
        let chosen = shortlist.iter().find(|c| c.node == node);
        ticket.cached = chosen
            .and_then(|c| c.score.prediction())
            .map_or(0, |p| p.cached_tokens);
        if self.explain {
            ticket.chosen = chosen.copied();
        }
        (step, Some(ticket))
    }

    async fn send(
        &self,
        node: NodeId,
        ticket: Option<Ticket<'a>>,
    ) -> Result<Head<'a>, DispatchError> {
        let Some(ticket) = ticket else {
            return Err(DispatchError::NoLink(node));
        };
        self.head(node, ticket).await
    }

    fn status(&self, _node: NodeId, head: &Head<'a>) -> (u16, Option<Duration>) {
        let retry_after = head
            .up
            .headers
            .get(&http::header::RETRY_AFTER)
            .and_then(|v| drive::retry_after(v, std::time::SystemTime::now()));
        (head.up.status.as_u16(), retry_after)
    }

    /// A 2xx head is not yet a commitment: the first byte to the client
    /// is. Streams commit at their first frame; a whole answer is read to
    /// its end first (up to a cap), so one cut mid-body is retried.
    async fn first_byte(&self, head: &mut Head<'a>) -> Result<(), DispatchError> {
        let whole = Framing::from_content_type(head.up.headers.get(&http::header::CONTENT_TYPE))
            == Framing::Whole;
        head.first = if whole {
            read_whole(&mut head.up.body, &head.watch).await?
        } else {
            first_data(&mut head.up.body).await?
        };
        Ok(())
    }

    fn commit(&self, _node: NodeId, head: Head<'a>) -> Committed {
        let Ticket {
            cluster,
            guard,
            reservation,
            chosen,
            cached,
            ..
        } = head.ticket;
        Committed {
            up: head.up,
            first: head.first,
            guard,
            reservation: reservation.and_then(crate::state::Reservation::keep),
            engine: match head.watch {
                Watch::Engine(p) => Some(p),
                Watch::Peer => None,
            },
            resumed: head.resumed,
            cluster,
            chosen,
            cached,
            leg: head.leg,
        }
    }

    /// An answer the engine gave is kept in case it is the last; one a
    /// relaying peer made itself (it had nothing from its engine) is not.
    async fn keep(&self, node: NodeId, head: Head<'a>) -> Option<Held> {
        if head.up.headers.contains(&MADE_HEADER) {
            return None;
        }
        Some(hold(node, head.up).await)
    }

    /// This node's engine: anything it sends on any request, its token
    /// counters moving (its poller reads them), or a reason to wait: the
    /// model is still loading (the engine answers its polls and does not
    /// list the model loaded yet), for as long as the slowest healthy disk
    /// takes to read its weights ([`pair_scheduler::prior::cold_load_bound`]).
    /// A peer: that it stays in routing
    /// (reporting, answering its probes); it watches its own engine.
    fn last_progress(&self, node: NodeId) -> Option<Duration> {
        let st = self.st;
        let cluster = st.cluster();
        if node != st.node.id {
            // It watches its own engine; its report says when that engine
            // has gone silent (then a node that appeared meanwhile may
            // take the request).
            return cluster
                .node(node)
                .is_some_and(|n| {
                    n.liveness.is_routable()
                        && !n
                            .find_model(&self.profile.model, self.req.flavor)
                            .is_some_and(|(e, _)| e.silent)
                })
                .then(|| self.now());
        }
        if let Some(size) = loading(&cluster, node, self.profile, self.req.flavor)
            && self.now() < pair_scheduler::prior::cold_load_bound(size)
        {
            return Some(self.now());
        }
        match hop_for(st, &cluster, node, &self.profile.model, self.req.flavor) {
            Ok(Hop::Local(engine)) => engine
                .progress
                .last_seen()
                .map(|at| at.saturating_duration_since(self.req.received)),
            _ => None,
        }
    }

    fn candidates(&self) -> Vec<Target> {
        self.targets(&self.st.cluster()).0.into_vec()
    }

    /// Said in the job record: how long it waited, and why.
    fn waiting_alone(&self, node: NodeId) {
        tracing::info!(%node, "no progress and no other node to go to: waiting on");
        let since = u64::try_from(self.now().as_millis()).unwrap_or(u64::MAX);
        self.alone_since.store(
            since.saturating_add(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// A stalled local engine leaves routing.
    fn stalled(&self, node: NodeId) {
        let st = self.st;
        if node == st.node.id
            && let Ok(Hop::Local(engine)) = hop_for(
                st,
                &st.cluster(),
                node,
                &self.profile.model,
                self.req.flavor,
            )
        {
            engine.progress.mark_stalled();
        }
    }

    fn failed(&self, failover: &Failover) {
        if let Some(last) = failover.failed().last() {
            self.st
                .metrics
                .failovers
                .get_or_create(&crate::metrics::FailoverLabels {
                    reason: last.outcome.label().into_owned(),
                })
                .inc();
        }
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

/// Of the ranked targets `t` of a request held at the cluster (a request,
/// or a cut batch answer's continuation): this node's (`own`) engine,
/// read live, only with a free slot (`!own_full`), as a peer takes it,
/// and a peer only if it has not refused for want of one since it last
/// reported (`refused`). With none of them left, the peers are asked
/// again (a refusal from each sends the request back to wait), never this
/// node's full engine while a peer is left: there it would queue in the
/// engine, where no later interactive request can cut it, and ahead of
/// one that cut batch work for the slot.
fn open_targets(
    t: SmallVec<[Target; MAX_ATTEMPTS]>,
    own: NodeId,
    own_full: bool,
    refused: impl Fn(NodeId) -> bool,
) -> SmallVec<[Target; MAX_ATTEMPTS]> {
    let open: SmallVec<[Target; MAX_ATTEMPTS]> = t
        .iter()
        .filter(|x| {
            if x.node == own {
                !own_full
            } else {
                !refused(x.node)
            }
        })
        .copied()
        .collect();
    if !open.is_empty() {
        return open;
    }
    let peers: SmallVec<[Target; MAX_ATTEMPTS]> = t
        .iter()
        .filter(|x| !own_full || x.node != own)
        .copied()
        .collect();
    if peers.is_empty() { t } else { peers }
}

/// Whether `node`'s engine for the model is loading it (the engine is up,
/// answering its polls, not stalled, and does not list it loaded yet),
/// with the model's size when known.
fn loading(
    cluster: &ClusterSnapshot,
    node: NodeId,
    profile: &RequestProfile,
    flavor: ApiFlavor,
) -> Option<Option<u64>> {
    cluster
        .node(node)
        .and_then(|n| n.find_model(&profile.model, flavor))
        .filter(|(e, m)| e.healthy && !m.loaded)
        .map(|(_, m)| m.size_bytes)
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

/// Whether this node holds the model on a healthy engine.
pub(crate) fn holds(
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

/// What shows that an attempt's node is getting anywhere.
enum Watch {
    /// A local engine: anything it sends, on any request (the attempt
    /// waits on it until its answer ends).
    Engine(Engaged),
    /// A peer: that it stays in routing.
    Peer,
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

/// A whole answer's body, read to its end (up to [`WHOLE_CAP`]; past it,
/// what was read, the rest to stream). Every frame is progress.
async fn read_whole(
    body: &mut dispatch::UpBody,
    watch: &Watch,
) -> Result<Option<Bytes>, DispatchError> {
    let mut got = BytesMut::new();
    loop {
        match body.frame().await {
            None => return Ok((!got.is_empty()).then(|| got.freeze())),
            Some(Err(_)) => return Err(DispatchError::Cut),
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
    let body = dispatch::read_prefix(&mut up.body, HELD_CAP, HELD_READ).await;
    Held {
        node,
        status: up.status,
        headers: up.headers,
        body,
    }
}

/// Waits at the cluster for a slot among the candidates `keep` keeps, for
/// a request of `profile` that arrived at `arrived` (its place), until
/// `bound`: how long it waited, if it did. `yielded`: an answer just cut
/// for interactive work, which waits to be woken before it looks. An
/// interactive request that finds every slot full may cut batch work for
/// one instead ([`crate::preempt`]): it then goes to the node it freed.
pub(crate) async fn wait_at_cluster(
    st: &Arc<ProxyState>,
    profile: &RequestProfile,
    arrived: Instant,
    bound: Instant,
    keep: impl Fn(&ClusterSnapshot, &pair_scheduler::Candidate) -> bool,
    yielded: bool,
) -> Result<Waited, SlotsFull> {
    let mut waited = false;
    let mut yielded = yielded;
    loop {
        let cluster = st.cluster();
        let mut top = st.rank(&cluster, profile, unix_ms_at(tokio::time::Instant::now()));
        top.retain(|c| keep(&cluster, &*c));
        st.full_where_refused(&cluster, &mut top);
        let admitted = if std::mem::take(&mut yielded) {
            st.waitroom
                .requeue(&profile.model, profile.priority, arrived, &top)
        } else {
            st.waitroom
                .admit(&profile.model, profile.priority, arrived, &top)
        };
        let went = |freed, claim| {
            Ok(Waited {
                wait: Some(pair_core::JobWait {
                    ms: crate::job::millis(arrived.elapsed()),
                    why: pair_core::WaitReason::ClusterQueue,
                }),
                freed,
                claim,
                hold: None,
            })
        };
        let (woken, place) = match admitted {
            // The next in line looks once this one is counted (and no
            // view shows its slot free).
            waiting::Admit::Go(claim) if waited => return went(None, claim),
            waiting::Admit::Go(claim) => {
                return Ok(Waited {
                    claim,
                    ..Waited::default()
                });
            }
            waiting::Admit::Wait { woken, place, full } => {
                // Interactive work with every slot full cuts batch work.
                let cuts = full
                    && profile.priority == pair_core::Priority::Interactive
                    && st.waitroom.preempts();
                let cut = cuts.then(|| st.waitroom.legs.cut_for(&top)).flatten();
                if let Some(node) = cut {
                    // The slot it cut free is this request's: no one else
                    // is woken for it, and it goes there before any view
                    // shows the slot free. Until it is counted there, the
                    // slot is held: the requests waiting here (the cut
                    // answer's continuation among them) see it taken, and
                    // so does this node's engine when it is the one cut.
                    drop(place);
                    let mut waited = went(Some(node), st.waitroom.hold(&profile.model))?;
                    waited.hold = (node == st.node.id).then(|| st.load.hold());
                    return Ok(waited);
                }
                // Nothing of this node's to cut: a peer not yet asked since
                // it last reported may cut batch work it runs for another
                // node, or refuse.
                if cuts
                    && top
                        .iter()
                        .any(|c| c.node != st.node.id && !st.refused_since_report(&cluster, c.node))
                {
                    drop(place);
                    return went(None, None);
                }
                (woken, place)
            }
        };
        waited = true;
        let recheck = tokio::time::sleep(waiting::RECHECK);
        tokio::select! {
            _ = woken => {}
            () = recheck => {}
            () = tokio::time::sleep_until(bound) => {
                drop(place);
                let retry_s = top
                    .first()
                    .and_then(|c| c.score.prediction())
                    .map_or(1, |p| u64::from(p.queue_ms).div_ceil(1000).max(1));
                return Err(SlotsFull { retry_s });
            }
        }
    }
}

/// Whether every attempt was refused by a node whose slots were all taken
/// (`slots-full`), or cut before its first byte for interactive work
/// (`preempted`, batch work `job`: a peer's cut counts as one of its
/// cuts; this node's counted itself): then each of those nodes is
/// recorded as full until it next reports (its view here was older than
/// its engine, or the slot went to the work that cut), and the request
/// waits at the cluster again.
pub(crate) fn refused_everywhere(
    st: &ProxyState,
    failover: &Failover,
    job: Option<&crate::preempt::Job>,
) -> bool {
    let failed = failover.failed();
    let class = |a: &pair_scheduler::FailedAttempt| match a.outcome {
        pair_scheduler::FailedOutcome::Failed(class) => class,
        _ => "",
    };
    let everywhere = !failed.is_empty()
        && failed
            .iter()
            .all(|a| [SLOTS_FULL, dispatch::PREEMPTED].contains(&class(a)));
    if everywhere {
        let cluster = st.cluster();
        for a in failed {
            if let Some(job) = job
                && a.node != st.node.id
                && class(a) == dispatch::PREEMPTED
            {
                job.cut_elsewhere();
            }
            st.refused_for_slots(&cluster, a.node);
        }
    }
    everywhere
}

/// The failure class of a relayed request refused for want of a free slot.
pub(crate) const SLOTS_FULL: &str = "slots-full";

/// How a request left the cluster's wait.
#[derive(Debug, Default)]
pub(crate) struct Waited {
    /// How long it waited, if it did.
    pub wait: Option<pair_core::JobWait>,
    /// The node whose batch answer it cut for a slot, if it did.
    pub freed: Option<NodeId>,
    /// The free slot it was let go for, held until it is counted.
    pub claim: Option<crate::waiting::Claim>,
    /// The slot of this node's engine it cut free, held until it is
    /// counted there.
    pub hold: Option<pair_cluster::SlotHold>,
}

/// A request waited for a slot past its bound.
pub(crate) struct SlotsFull {
    /// When a slot is predicted to free, in whole seconds.
    pub retry_s: u64,
}

/// [`continue_on`] as [`resume::Continuation::send`].
fn send_continuation(
    cont: Arc<resume::Continuation>,
    continued: resume::Continued,
) -> resume::Sending {
    Box::pin(async move { continue_on(&cont, continued).await })
}

/// Sends a cut stream's continuation to the best owner of its model that
/// the stream was not cut on, as any request is sent (the same driver,
/// stall allowance and failover); its answer, committed at its first
/// byte, or `None` when no owner takes it.
pub(crate) async fn continue_on(
    cont: &resume::Continuation,
    continued: resume::Continued,
) -> Option<resume::Moved> {
    let st = &cont.st;
    let resume::Continued {
        head,
        route,
        body,
        dead,
    } = continued;
    let dead = &dead[..];
    // A continuation may be sent in another API than the stream's (a
    // templated generate goes on as a chat).
    let api = route.continues().unwrap_or(cont.api);
    // Batch work waits at the cluster again, in its old place, before it
    // goes (cut for interactive work here: until woken), and takes only a
    // free slot, waiting again while every one is full.
    let batch = cont
        .preempt
        .as_ref()
        .filter(|_| st.waitroom.order().is_some());
    let mut yielded = batch.is_some_and(|job| job.take_yielded());
    let keep = |cluster: &ClusterSnapshot, c: &Candidate| {
        !dead.contains(&c.node) && resume::continues(cluster, c.node, &cont.profile.model, api)
    };
    let bound = Instant::now() + waiting::DEFAULT_WAIT;
    loop {
        let mut claim = None;
        if let Some(job) = batch {
            match wait_at_cluster(
                st,
                &cont.profile,
                job.arrived,
                bound,
                keep,
                std::mem::take(&mut yielded),
            )
            .await
            {
                Ok(waited) => claim = waited.claim,
                Err(_) => {
                    tracing::info!(job = %cont.job, "a cut batch answer found no slot in time");
                    return None;
                }
            }
        }
        let req = Inference {
            head: head.clone(),
            body: body.clone(),
            flavor: resume::flavor(api),
            work: cont.work,
            route: cont.route,
            received: Instant::now(),
            key: None,
        };
        let attempts = Attempts {
            st,
            req: &req,
            profile: &cont.profile,
            job: cont.job,
            reach: Reach::Continuation {
                dead,
                api,
                preempt: cont.preempt.as_ref(),
            },
            explain: false,
            alone_since: Default::default(),
            queued: None,
            free_slot: batch.is_some(),
            claim,
            hold: Default::default(),
            batch: None,
        };
        let mut failover = Failover::new(FailoverConfig {
            stall_floor: st.timeouts.first_byte,
            patience: st.timeouts.first_byte,
            ..FailoverConfig::default()
        });
        let timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        match attempts.run(&mut failover, timer).await {
            Driven::Committed { node, answer } if answer.up.status.is_success() => {
                let Committed {
                    up,
                    first,
                    mut guard,
                    mut reservation,
                    mut engine,
                    leg,
                    ..
                } = answer;
                // A leg that may be cut holds its load itself.
                if let Some(leg) = &leg {
                    leg.commit(crate::preempt::Held {
                        guard: guard.take(),
                        reservation: reservation.take(),
                        engine: engine.take(),
                    });
                }
                return Some(resume::Moved {
                    node,
                    first,
                    body: up.body,
                    holding: Box::new(Holding {
                        st: Arc::clone(st),
                        guard,
                        reservation,
                        _engine: engine,
                    }),
                });
            }
            Driven::Committed { node, answer } => {
                tracing::info!(%node, status = %answer.up.status, "a continuation was refused");
                return None;
            }
            Driven::GaveUp {
                why: pair_scheduler::GiveUp::Exhausted { .. },
                kept: None,
            } if batch.is_some()
                && Instant::now() < bound
                && refused_everywhere(st, &failover, batch.map(|job| &**job)) =>
            {
                // Every node tried had its slots full: it waits again.
            }
            Driven::GaveUp { .. } => return None,
        }
    }
}

/// A leg of batch answer `job` on `node`, and its body, which a cut for
/// interactive work drops ([`crate::preempt::Leg`]).
fn leg_of(
    st: &Arc<ProxyState>,
    node: NodeId,
    price: crate::preempt::Price,
    job: &Arc<crate::preempt::Job>,
    body: dispatch::UpBody,
) -> (Arc<crate::preempt::Leg>, dispatch::UpBody) {
    let owner: Arc<dyn crate::preempt::Release> = st.clone();
    crate::preempt::Leg::start(owner, &st.waitroom.legs, node, price, job, body)
}

/// What a continuation's attempt holds until the answer ends: its load on
/// this node's engine, or its reservation on a peer.
struct Holding {
    st: Arc<ProxyState>,
    guard: Option<pair_cluster::LoadGuard>,
    reservation: Option<ReservationId>,
    _engine: Option<Engaged>,
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.guard.take();
        if let Some(id) = self.reservation.take() {
            self.st.release(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> NodeId {
        NodeId::from_uuid(uuid::Uuid::from_u128(n))
    }

    fn targets(nodes: &[u128]) -> SmallVec<[Target; MAX_ATTEMPTS]> {
        nodes
            .iter()
            .map(|&n| Target {
                node: id(n),
                predicted: None,
            })
            .collect()
    }

    fn nodes(t: &[Target]) -> Vec<NodeId> {
        t.iter().map(|x| x.node).collect()
    }

    /// A held request (or a cut batch answer's continuation) ranked this
    /// node first goes to a peer with a free slot instead of queuing in
    /// this node's full engine; with every peer refused since its report,
    /// the peers are asked again, not the full engine; this node's engine
    /// alone is still tried, and one with a free slot always is.
    #[test]
    fn a_held_request_goes_only_into_a_free_slot_while_a_peer_is_left() {
        let none = |_: NodeId| false;
        let only_2 = |n: NodeId| n == id(2);
        let peers = |n: NodeId| n != id(1);
        assert_eq!(
            nodes(&open_targets(targets(&[1, 2, 3]), id(1), true, none)),
            [id(2), id(3)]
        );
        assert_eq!(
            nodes(&open_targets(targets(&[1, 2, 3]), id(1), true, only_2)),
            [id(3)]
        );
        assert_eq!(
            nodes(&open_targets(targets(&[1, 2, 3]), id(1), true, peers)),
            [id(2), id(3)],
            "every peer refused: asked again, the full engine left out"
        );
        assert_eq!(
            nodes(&open_targets(targets(&[1]), id(1), true, none)),
            [id(1)],
            "no peer: this node's engine"
        );
        assert_eq!(
            nodes(&open_targets(targets(&[1, 2]), id(1), false, peers)),
            [id(1)],
            "a free slot here"
        );
        assert_eq!(
            nodes(&open_targets(targets(&[2, 1]), id(1), false, none)),
            [id(2), id(1)],
            "the ranking's order kept"
        );
    }
}
